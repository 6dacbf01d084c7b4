package queue

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A store's values survive closing and opening the queue, and a nil value
// deletes them.
func TestStorePersists(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	q, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := q.Store("tlsreport")
	if v, err := s.Get("counts"); err != nil || v != nil {
		t.Fatalf("empty queue: %q, %v", v, err)
	}
	if err := s.Put("counts", []byte(`[1]`)); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	s = q.Store("tlsreport")
	if v, err := s.Get("counts"); err != nil || string(v) != "[1]" {
		t.Fatalf("after reopening: %q, %v; want [1]", v, err)
	}
	if keys, err := s.Keys(); err != nil || !slices.Equal(keys, []string{"counts"}) {
		t.Fatalf("keys: %q, %v", keys, err)
	}
	if err := s.Put("counts", nil); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Get("counts"); v != nil {
		t.Errorf("after deleting: %q", v)
	}
	if keys, _ := s.Keys(); len(keys) != 0 {
		t.Errorf("keys after deleting: %q", keys)
	}
}

// Stores keep the buckets the queue kept their values in before it knew
// them as stores: testdata/stores.db was written by greyrelay 0b2b297
// with queue.Open(path, Options{JournalSize: -1}), one Enqueue (to
// a@one.test), PutPolicy("example.test", …) with relay/tlspolicy's cached
// form of an enforce policy, and relay/tlsrpt's Aggregator.Save (a day of
// example.test) and SaveOwed (a report owed to owed.test), both through
// PutReportState. Its policy and reporting state are read back through
// Store("tlspolicy") and Store("tlsreport"), and its message is still
// there. (relay/tlspolicy and relay/tlsrpt read the same file through
// their own code.)
func TestStoresReadOldBuckets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	b, err := os.ReadFile("testdata/stores.db")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	q := openAt(t, path, Options{})
	const policy = `{"id":"20261201T000000","fetched":"2026-12-01T08:00:00Z","policy":{"Mode":"enforce","MX":["mx.example.test"],"MaxAge":604800}}`
	pol := q.Store("tlspolicy")
	if v, err := pol.Get("example.test"); err != nil || string(v) != policy {
		t.Errorf("cached policy: %q, %v; want %q", v, err, policy)
	}
	if keys, err := pol.Keys(); err != nil || !slices.Equal(keys, []string{"example.test"}) {
		t.Errorf("policy domains: %q, %v", keys, err)
	}
	rep := q.Store("tlsreport")
	for k, want := range map[string]string{"counts": `"Domain":"example.test"`, "owed": `"RUAs":["mailto:tlsrpt@owed.test"]`} {
		if v, err := rep.Get(k); err != nil || !strings.Contains(string(v), want) {
			t.Errorf("report state %s: %q, %v; want it to hold %s", k, v, err, want)
		}
	}
	if keys, err := rep.Keys(); err != nil || !slices.Equal(keys, []string{"counts", "owed"}) {
		t.Errorf("report state keys: %q, %v", keys, err)
	}
	if m, err := q.Show(1); err != nil || len(m.Recipients) != 1 || m.Recipients[0].Addr != "a@one.test" {
		t.Errorf("the message of the old file: %+v, %v", m, err)
	}
}

// The queue's own buckets are not stores: a caller cannot read or
// overwrite records through one.
func TestStoreRefusesTheQueuesBuckets(t *testing.T) {
	q, _ := newQ(t)
	mustEnqueue(t, q, msg("s@src.test", "a@b.test"))
	for _, n := range ownBuckets() {
		s := q.Store(string(n))
		if _, err := s.Get("x"); !errors.Is(err, ErrReservedStore) {
			t.Errorf("Get on %s: %v", n, err)
		}
		if err := s.Put(string(idKey(1)), []byte("x")); !errors.Is(err, ErrReservedStore) {
			t.Errorf("Put on %s: %v", n, err)
		}
		if _, err := s.Keys(); !errors.Is(err, ErrReservedStore) {
			t.Errorf("Keys on %s: %v", n, err)
		}
	}
	if _, err := q.Store("").Keys(); !errors.Is(err, ErrReservedStore) {
		t.Errorf("a store without a name: %v", err)
	}
	checkStats(t, q)
}
