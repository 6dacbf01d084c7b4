package queue

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/greyrelay/greyrelay/internal/fulldisk"
	"github.com/greyrelay/greyrelay/queue/journal"
)

// crashCopy makes the files a crash could leave: the database as last
// committed by snap (taken earlier), and the journal and spool as they are
// now. It returns the copy's database path.
func crashCopy(t *testing.T, q *Queue, snap []byte) string {
	t.Helper()
	dst := dbPath(t)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(path string, b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(dst, snap)
	j, err := os.ReadFile(q.path + ".journal")
	if err != nil {
		t.Fatal(err)
	}
	write(dst+".journal", j)
	if err := os.MkdirAll(dst+".bodies", 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range spoolNames(t, q) {
		b, err := os.ReadFile(filepath.Join(q.spoolDir(), n))
		if err != nil {
			t.Fatal(err)
		}
		write(filepath.Join(dst+".bodies", n), b)
	}
	return dst
}

// snapshot returns a consistent copy of the committed database.
func snapshot(t *testing.T, q *Queue) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := q.db.View(func(tx *bolt.Tx) error { _, err := tx.WriteTo(&buf); return err }); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Messages acknowledged by the journal but not yet in the database when the
// process died are inserted by the next Open, once, with their IDs, bodies
// and spool files; the ones already in the database are not inserted again.
func TestJournal_ReplayAfterCrash(t *testing.T) {
	for _, inDB := range []int{0, 2} {
		q, _ := newQ(t)
		var ids []ID
		for i := range inDB {
			ids = append(ids, mustEnqueue(t, q, msg("s@x.test", "r"+string(rune('a'+i))+"@a.test")))
		}
		if err := q.settle(); err != nil {
			t.Fatal(err)
		}
		snap := snapshot(t, q) // the database holds the first inDB messages only
		ids = append(ids, mustEnqueue(t, q, msg("", "x@b.test", "y@c.test")))
		ids = append(ids, mustEnqueue(t, q, spooledMsg(t, q, bytes.Repeat([]byte("line\r\n"), 100), "z@d.test")))
		want := map[ID][]byte{}
		for _, id := range ids {
			want[id] = mustBody(t, q, id)
		}
		path := crashCopy(t, q, snap)
		q.Close()

		for round := range 2 { // a second Open replays nothing
			q2 := openAt(t, path, Options{})
			if want := []int{len(ids) - inDB, 0}[round]; q2.Replayed() != want {
				t.Errorf("inDB=%d round %d: Replayed() = %d, want %d", inDB, round, q2.Replayed(), want)
			}
			for id, body := range want {
				if got, err := q2.Body(id); err != nil || !bytes.Equal(got, body) {
					t.Errorf("inDB=%d round %d: message %v body %q, %v; want %q", inDB, round, id, got, err, body)
				}
			}
			checkStats(t, q2)
			if st, _ := q2.Stats(); st.Messages != len(ids) {
				t.Errorf("inDB=%d round %d: %d messages, want %d", inDB, round, st.Messages, len(ids))
			}
			id := mustEnqueue(t, q2, msg("", "n@e.test"))
			if id <= ids[len(ids)-1] {
				t.Errorf("inDB=%d: new ID %v not above %v", inDB, id, ids[len(ids)-1])
			}
			ids, want[id] = append(ids, id), mustBody(t, q2, id)
			q2.Close()
		}
	}
}

func mustBody(t *testing.T, q *Queue, id ID) []byte {
	t.Helper()
	b, err := q.Body(id)
	if err != nil {
		t.Fatalf("Body(%v): %v", id, err)
	}
	return b
}

// A journal much smaller than the traffic is reused from the front again
// and again; every message reaches the database once, and a reopen does
// not bring any back.
func TestJournal_Wrap(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{JournalSize: journal.MinSize})
	m := msg("s@x.test", "r@a.test")
	m.Body = bytes.Repeat([]byte("0123456789abcdef"), 64) // 1 KiB
	const n = 300                                         // about 5 times the file
	for range n {
		mustEnqueue(t, q, m)
	}
	if fi, err := os.Stat(path + ".journal"); err != nil || fi.Size() > journal.MinSize {
		t.Errorf("journal file: %v, %v; want at most %d bytes", fi.Size(), err, journal.MinSize)
	}
	checkStats(t, q)
	q.Close()
	q = openAt(t, path, Options{JournalSize: journal.MinSize})
	if st, _ := q.Stats(); st.Messages != n {
		t.Errorf("after reopen: %d messages, want %d", st.Messages, n)
	}
	checkStats(t, q)
}

// After the journal fails a write, the Enqueue that hit it fails (the
// client gets a temporary error) and later ones go to the database
// directly.
func TestJournal_WriteFailureFallsBack(t *testing.T) {
	q, _ := newQ(t)
	mustEnqueue(t, q, msg("", "first@a.test")) // the file has grown: the next record needs no growth
	q.jrnl.Close()                             // every later write fails
	if _, err := q.Enqueue(msg("", "a@a.test")); err == nil {
		t.Fatal("Enqueue succeeded with a broken journal")
	}
	id := mustEnqueue(t, q, msg("", "b@a.test"))
	if m := mustShow(t, q, id); len(m.Recipients) != 1 || m.Recipients[0].Addr != "b@a.test" {
		t.Errorf("message after the fallback: %+v", m)
	}
	checkStats(t, q)
}

// A record whose write failed may have reached the disk all the same (a
// failed fdatasync says nothing of what did). Its client was refused, so
// the next Open must not bring the message back.
func TestJournal_FailedRecordNotReplayed(t *testing.T) {
	q, path := newQ(t)
	mustEnqueue(t, q, msg("", "first@a.test"))
	j := q.jrnl
	m := msg("", "refused@a.test")
	rec, _ := encodeRecord(j.Salt(), j.seq+1, []NewMessage{m}, []ID{ID(q.lastID.Load() + 1)})
	off := j.Offset()
	j.Close() // the next write fails
	if _, err := q.Enqueue(m); err == nil {
		t.Fatal("Enqueue succeeded with a broken journal")
	}
	f, err := os.OpenFile(path+".journal", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(rec, off); err != nil { // the record landed after all
		t.Fatal(err)
	}
	f.Close()
	if err := q.settle(); err != nil {
		t.Fatal(err)
	}
	q.Close()
	q2 := openAt(t, path, Options{})
	if n := q2.Replayed(); n != 0 {
		t.Errorf("Replayed() = %d, want 0: the refused message came back", n)
	}
	if st, err := q2.Stats(); err != nil || st.Messages != 1 {
		t.Errorf("Stats() = %+v, %v; want the first message only", st, err)
	}
	checkStats(t, q2)
}

// jrecord is one record read back from the file.
type jrecord struct {
	seq     uint64
	payload []byte
}

// parseJournal returns the records of a journal file image b, in order,
// up to the first one that is not whole, not valid, or not numbered one
// above the previous.
func parseJournal(b []byte, salt [8]byte) []jrecord {
	var out []jrecord
	_, _ = journal.ScanImage(bytes.NewReader(b), int64(len(b)), salt, 0, func(seq uint64, payload []byte) error {
		out = append(out, jrecord{seq: seq, payload: payload})
		return nil
	})
	return out
}

// journalFile writes the records build makes for a new journal file's
// salt to that file, and returns the file's image and salt.
func journalFile(tb testing.TB, build func(salt [8]byte) [][]byte) ([]byte, [8]byte) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "journal")
	j, _, err := journal.Open(path, journal.MinSize)
	if err != nil {
		tb.Fatal(err)
	}
	defer j.Close()
	for _, r := range build(j.Salt()) {
		if err := j.Append(r); err != nil {
			tb.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return b, j.Salt()
}

func TestJournalRecordRoundTrip(t *testing.T) {
	a := msg("s@x.test", "r@a.test", "q@b.test")
	a.To[1].Notify, a.To[1].ORCPT = "FAILURE,DELAY", "rfc822;q@b.test"
	a.AuthUser, a.ClientAddr, a.Helo, a.RET, a.EnvID = "u", "127.0.0.9", "client.test", "HDRS", "env1"
	a.SMTPUTF8, a.EightBit, a.NextAttempt, a.RequireTLS = true, true, t0.Add(1), true
	a.Tag, a.MessageID = "welcome", "<w1@shop.example>"
	b := msg("", "d@c.test")
	b.Body, b.File, b.DSN, b.TLSOptional = nil, &BodyFile{name: "body-123", n: 4096}, true, true
	in := []NewMessage{a, b}
	var rec []byte
	var copies []NewMessage
	img, salt := journalFile(t, func(salt [8]byte) [][]byte {
		rec, copies = encodeRecord(salt, 1, in, []ID{5, 6})
		return [][]byte{rec}
	})
	recs := parseJournal(img, salt)
	if len(recs) != 1 {
		t.Fatalf("%d records", len(recs))
	}
	out, ids, err := decodeRecord(recs[0].payload)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ids, []ID{5, 6}) {
		t.Errorf("ids %v", ids)
	}
	// Encoding what was read back, or what the writer inserts, gives the
	// same record: every field survived.
	for name, ms := range map[string][]NewMessage{"decoded": out, "writer's copies": copies} {
		if again, _ := encodeRecord(salt, 1, ms, ids); !bytes.Equal(again, rec) {
			t.Errorf("%s differ from the originals: %+v", name, ms)
		}
	}
	if copies[0].Body[0] != 'S' || &copies[0].Body[0] == &a.Body[0] {
		t.Error("the writer's copy must hold the body in the record, not in the caller's buffer")
	}
}

// FuzzJournal: the journal reader never panics on any file, and every
// record it accepts either decodes or is refused with an error.
func FuzzJournal(f *testing.F) {
	var rec []byte
	img, salt := journalFile(f, func(salt [8]byte) [][]byte {
		rec, _ = encodeRecord(salt, 1, []NewMessage{msg("s@x.test", "r@a.test")}, []ID{1})
		return [][]byte{rec}
	})
	f.Add(img)
	f.Add(rec[journal.RecordHead:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, r := range parseJournal(b, salt) {
			_, _, _ = decodeRecord(r.payload)
		}
		// The payload decoder on its own, as if the CRC had matched.
		if ms, ids, err := decodeRecord(b); err == nil && len(ms) != len(ids) {
			t.Fatalf("%d messages, %d ids", len(ms), len(ids))
		}
	})
}

// A journal that does not belong to the database (the database file was
// deleted to start afresh, or replaced) is not replayed: its records would
// bring back messages the database never had or has delivered long ago.
func TestJournal_ForeignJournalNotReplayed(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	snap := snapshot(t, q) // empty, but knows this journal
	mustEnqueue(t, q, msg("", "a@a.test"))
	q.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	q = openAt(t, path, Options{})
	if st, _ := q.Stats(); st.Messages != 0 {
		t.Errorf("a new database replayed %d messages from the old journal", st.Messages)
	}
	q.Close()
	// The old database back: its journal was restarted for the new one, so
	// the salts differ again and nothing is replayed.
	if err := os.WriteFile(path, snap, 0o600); err != nil {
		t.Fatal(err)
	}
	q = openAt(t, path, Options{})
	if st, _ := q.Stats(); st.Messages != 0 {
		t.Errorf("the old database got %d messages from the new database's journal", st.Messages)
	}
}

// Journaled messages with many recipients reach the database over several
// transactions (insertBudget) and all of them arrive, in order.
func TestJournal_InsertBudget(t *testing.T) {
	q, _ := newQ(t)
	var rcpts []string
	for i := range 1000 {
		rcpts = append(rcpts, "r"+strconv.Itoa(i)+"@a.test")
	}
	const n = 45 // 45,000 recipients: more than two transactions' worth
	var ids []ID
	for range n {
		ids = append(ids, mustEnqueue(t, q, msg("s@x.test", rcpts...)))
	}
	if got := insertBudget([]*insertBatch{{ms: make([]NewMessage, 1)}}, 0); got != 1 {
		t.Errorf("budget for one batch = %d, want 1 (never zero)", got)
	}
	checkStats(t, q)
	if st, _ := q.Stats(); st.Messages != n || st.Recipients != n*1000 {
		t.Errorf("Stats %d messages, %d recipients; want %d, %d", st.Messages, st.Recipients, n, n*1000)
	}
	if m := mustShow(t, q, ids[n-1]); len(m.Recipients) != 1000 {
		t.Errorf("last message has %d recipients", len(m.Recipients))
	}
}

// When the file cannot grow (a full disk; here a file size limit), the
// journal goes on within the size it has, starting again at the front,
// instead of failing or giving up.
func TestJournal_CannotGrow(t *testing.T) {
	if !fulldisk.RunAlone(t) {
		return
	}
	q, _ := newQ(t)
	m := msg("s@x.test", "r@a.test")
	m.Body = bytes.Repeat([]byte("0123456789abcdef"), 256) // 4 KiB
	mustEnqueue(t, q, m)                                   // the journal grows to its first step
	if q.jrnl.Size() != journal.Step {
		t.Fatalf("journal size %d, want %d", q.jrnl.Size(), journal.Step)
	}
	// No file of this process may grow past the journal's size now. The
	// database stays below it: every round is deleted before the next.
	fulldisk.Limit(t, uint64(journal.Step))
	for round := range 10 { // about 1.3 MiB of records in all
		for range 30 {
			mustEnqueue(t, q, m)
		}
		if _, err := q.Delete(Selector{All: true}); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	if q.jrnl.bad != nil || q.jrnl.Size() != journal.Step {
		t.Errorf("journal bad=%v size=%d; want usable at %d", q.jrnl.bad, q.jrnl.Size(), journal.Step)
	}
	if q.jrnl.seq < 300 {
		t.Errorf("%d records written; the journal was left for the database", q.jrnl.seq)
	}
}
