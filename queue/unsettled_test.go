package queue

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/greyrelay/greyrelay/internal/fulldisk"
)

// On a full disk the writer's commits fail while the intake journal, whose
// file is already allocated, still takes records: the reads answer with
// what the database holds and an *UnsettledError counting the recipients
// it lacks, the writes still fail, and once the disk has room again the
// next read finds every message. A file size limit stands in for the full
// disk: below the database's data pages (every commit writes one: EFBIG)
// and above the journal's write position (its records are written).
func TestUnsettled_ReadsOnFullDisk(t *testing.T) {
	if !fulldisk.RunAlone(t) {
		return
	}
	q, _ := newQ(t)
	stored := mustEnqueue(t, q, msg("s@x.test", "a@a.test")) // the journal grows to its first step
	if _, err := q.Stats(); err != nil {                     // and the database holds it
		t.Fatal(err)
	}
	limit := uint64(2 * q.db.Info().PageSize) // the meta pages only
	if off := q.jrnl.Offset(); off+4<<10 > int64(limit) {
		t.Fatalf("the journal writes at %d, too close to the limit %d for the test", off, limit)
	}
	restore := fulldisk.Limit(t, limit)
	defer restore()
	ids := []ID{
		mustEnqueue(t, q, msg("s@x.test", "b@b.test", "c@b.test")),
		mustEnqueue(t, q, msg("s@x.test", "d@d.test")),
	}

	wantUnsettled := func(op string, err error) {
		t.Helper()
		var ue *UnsettledError
		if !errors.As(err, &ue) || ue.Recipients != 3 || !errors.Is(err, syscall.EFBIG) {
			t.Errorf("%s: err %v, want an UnsettledError for 3 recipients wrapping EFBIG", op, err)
		}
	}
	rows, total, err := q.List(Filter{})
	wantUnsettled("List", err)
	if total != 1 || len(rows) != 1 || rows[0].Message.ID != stored {
		t.Errorf("List: %d rows of %d, want the one stored (%s): %+v", len(rows), total, stored, rows)
	}
	walked := 0
	wantUnsettled("Walk", q.Walk(Filter{}, func(*Message, *Recipient) bool { walked++; return true }))
	if walked != 1 {
		t.Errorf("Walk visited %d recipients, want 1", walked)
	}
	st, err := q.Stats()
	wantUnsettled("Stats", err)
	if st.Messages != 1 || st.Recipients != 1 || !st.Oldest.Equal(t0) {
		t.Errorf("Stats: %+v, want the stored message's counts", st)
	}
	rs, err := q.Select(Selector{All: true})
	wantUnsettled("Select", err)
	if len(rs) != 1 {
		t.Errorf("Select: %d recipients, want 1", len(rs))
	}
	// By ID, a message the database holds is answered whole; one it does
	// not hold is in doubt.
	if rs, err := q.Select(Selector{ID: stored}); err != nil || len(rs) != 1 {
		t.Errorf("Select(stored): %d recipients, %v; want 1, nil", len(rs), err)
	}
	_, err = q.Select(Selector{ID: ids[0]})
	wantUnsettled("Select(journaled)", err)
	waiting, err := q.Waiting("b.test", nil)
	wantUnsettled("Waiting b.test", err)
	if waiting {
		t.Error("Waiting: b.test has mail in the database")
	}
	if waiting, err := q.Waiting("a.test", nil); err != nil || !waiting {
		t.Errorf("Waiting a.test: %v, %v; want true, nil (the database holds its mail)", waiting, err)
	}
	// One message: complete when the database holds it, in doubt when not.
	if m, err := q.Show(stored); err != nil || len(m.Recipients) != 1 {
		t.Errorf("Show(stored): %v, %d recipients; want it whole", err, len(m.Recipients))
	}
	if _, err := q.Body(stored); err != nil {
		t.Errorf("Body(stored): %v", err)
	}
	_, err = q.Show(ids[0])
	wantUnsettled("Show(journaled)", err)
	_, err = q.Message(ids[1])
	wantUnsettled("Message(journaled)", err)
	_, err = q.Body(ids[1])
	wantUnsettled("Body(journaled)", err)

	// Writes fail, and not as a read that answered.
	for name, op := range map[string]func() (int, error){
		"Hold":   func() (int, error) { return q.Hold(Selector{All: true}) },
		"Delete": func() (int, error) { return q.Delete(Selector{ID: stored}) },
	} {
		var ue *UnsettledError
		if _, err := op(); err == nil || errors.As(err, &ue) {
			t.Errorf("%s on a full disk: %v, want the database's failure", name, err)
		}
	}

	// Room again: the next read inserts what the journal holds.
	restore()
	if rows, total, err = q.List(Filter{}); err != nil || total != 4 || len(rows) != 4 {
		t.Errorf("List with room again: %d rows of %d, %v; want 4, nil", len(rows), total, err)
	}
	if st, err := q.Stats(); err != nil || st.Recipients != 4 || st.Messages != 3 {
		t.Errorf("Stats with room again: %+v, %v", st, err)
	}
}

// Once the disk has room again, the journaled messages enter the database
// without any request to the queue: an idle relay sends none.
func TestUnsettled_RetriedWhenIdle(t *testing.T) {
	if !fulldisk.RunAlone(t) {
		return
	}
	q, _ := newQ(t)
	mustEnqueue(t, q, msg("s@x.test", "a@a.test"))
	if _, err := q.Stats(); err != nil {
		t.Fatal(err)
	}
	restore := fulldisk.Limit(t, uint64(2*q.db.Info().PageSize))
	defer restore()
	mustEnqueue(t, q, msg("s@x.test", "b@b.test", "c@b.test"))
	var ue *UnsettledError
	if _, err := q.Stats(); !errors.As(err, &ue) { // the commit holding it failed
		t.Fatalf("Stats on a full disk: %v, want an UnsettledError", err)
	}
	restore()
	deadline := time.Now().Add(10 * stuckRetry)
	for q.inflight.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the journaled recipients were not inserted within %v of the disk having room", 10*stuckRetry)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st, err := q.Stats(); err != nil || st.Recipients != 3 {
		t.Errorf("Stats: %+v, %v; want 3 recipients", st, err)
	}
}

// A journaled message the database cannot take (a full disk: inserting
// it needs more room than the file has) must not stop the commits that
// need less: recording a delivery frees space, and is how the disk stops
// being full. The delivery of an older message commits while the new one
// waits; once that delivery has freed its pages, the writer inserts the
// waiting message on its own, without the disk being given more room.
//
// A file size limit stands in for the full disk, just above the
// database's last page; the journal (small, so that the waiting
// message's record starts again at its front) is written below it.
func TestUnsettled_DeliveryGoesOnWhileInsertWaits(t *testing.T) {
	if !fulldisk.RunAlone(t) {
		return
	}
	q := openAt(t, dbPath(t), Options{JournalSize: 384 << 10})
	big := func(size int, addr string) NewMessage {
		m := msg("s@x.test", addr)
		m.Body = append(m.Body, bytes.Repeat([]byte("0123456789abcde\n"), size/16)...)
		return m
	}
	older := mustEnqueue(t, q, big(200<<10, "a@a.test"))
	small := mustEnqueue(t, q, msg("s@x.test", "b@b.test"))
	if _, err := q.Stats(); err != nil { // the database holds both
		t.Fatal(err)
	}
	var used int64 // the database's pages in use, up to the last
	if err := q.view(func(tx *bolt.Tx) error { used = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	// 24 pages of room: a delivery's commit rewrites a few pages, and
	// bbolt reuses a freed page only once no read transaction can still
	// see it, so under load (a read still open) the delivery takes fresh
	// pages. With 8 pages it found none once in CI's parallel -short run
	// (EFBIG). The waiting message needs about 45.
	restore := fulldisk.Limit(t, uint64(used+24*int64(q.db.Info().PageSize)))
	defer restore()

	waiting := mustEnqueue(t, q, big(180<<10, "c@c.test")) // journaled at the front; the database has no room
	var ue *UnsettledError
	if _, err := q.Stats(); !errors.As(err, &ue) {
		t.Fatalf("Stats: %v, want an UnsettledError (the test needs the insert to fail)", err)
	}
	deliver := func(id ID) error {
		_, err := q.Apply(Update{Results: []Result{{Key: Key{id, 0}, Status: Delivered, End: t0.Add(time.Minute)}}})
		return err
	}
	// The operator's actions act on what the database holds, and say
	// what it lacks; on the waiting message itself they cannot act.
	if n, err := q.Retry(Selector{All: true}, t0); n != 2 || !errors.As(err, &ue) {
		t.Errorf("Retry -all while a journaled message waits: %d, %v; want 2 and an UnsettledError", n, err)
	}
	if _, err := q.Hold(Selector{ID: waiting}); !errors.As(err, &ue) || !errors.Is(err, syscall.EFBIG) {
		t.Errorf("Hold of the waiting message: %v, want an UnsettledError wrapping EFBIG", err)
	}
	if err := deliver(small); err != nil {
		t.Fatalf("recording a delivery while a journaled message waits: %v", err)
	}
	if err := deliver(older); err != nil {
		t.Fatalf("recording the delivery that frees room: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for q.inflight.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the waiting message was not inserted within %v of a delivery freeing room", 20*time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m, err := q.Show(waiting); err != nil || len(m.Recipients) != 1 || m.Recipients[0].Status != Queued {
		t.Errorf("Show(waiting): %+v, %v; want its recipient queued", m, err)
	}
}
