package queue

import (
	"encoding/binary"
	"os"
	"testing"
)

// metaFreelist returns the freelist page id the newest meta page of the
// bbolt file at path names (bbolt's layout: a 16-byte page header, then
// magic, version, page size, flags, root bucket (16), freelist, pgid, txid).
// ^0 means "not synced": the next Open walks the pages.
func metaFreelist(t *testing.T, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pageSize := int(binary.LittleEndian.Uint32(b[16+8:]))
	var best, txid uint64
	for _, off := range []int{0, pageSize} {
		m := b[off+16:]
		tx := binary.LittleEndian.Uint64(m[48:])
		if tx >= txid {
			txid, best = tx, binary.LittleEndian.Uint64(m[32:])
		}
	}
	return best
}

// The freelist is not written by ordinary commits (NoFreelistSync) but
// is by Close, so a clean restart does not walk the whole file.
func TestFreelist_SyncedOnlyByClose(t *testing.T) {
	q, path := newQ(t)
	mustEnqueue(t, q, msg("a@x.example", "r@y.example"))
	if got := metaFreelist(t, path); got != ^uint64(0) {
		t.Errorf("after a commit the freelist is at page %d, want none (not synced)", got)
	}
	q.Close()
	if got := metaFreelist(t, path); got == ^uint64(0) {
		t.Error("after Close the freelist is not synced")
	}
	q = openAt(t, path, Options{})
	checkStats(t, q)
}
