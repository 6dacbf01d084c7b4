package delivery

import (
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// TestFresh_LateOfferLeftToScan: the writer may commit a message's insert
// before the journaler hands over its fresh offer, and a scan may then
// claim the message the ordinary way and Begin it, which releases the
// claim. The late offer must not start a second attempt.
func TestFresh_LateOfferLeftToScan(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.dns.MX("late.test", 10, "mx.late.test").A("mx.late.test", "127.0.0.1")
	h.build()
	t.Cleanup(h.stop)
	e := h.eng
	id := h.enqueue("alice@sender.test", "x@late.test")
	var f queue.Fresh
	select {
	case f = <-e.fresh:
	case <-time.After(wait):
		t.Fatal("no fresh offer")
	}
	eventually(t, wait, "the insert", func() bool {
		_, err := h.q.Message(id)
		return err == nil
	})
	e.cur = h.q.DueCursor()
	defer e.cur.Close()
	if err := e.scan(time.Now()); err != nil {
		t.Fatal(err)
	}
	// The test goroutine plays the loop: the claimed set is its own.
	if !e.claimed[queue.Key{ID: id}] {
		t.Fatal("the scan did not claim the inserted message")
	}
	e.unclaim([]queue.Recipient{{Key: queue.Key{ID: id}}}) // as Begin does once the recipient is Active
	e.readNotes()
	if e.takeFresh(f) {
		t.Error("a late fresh offer was taken after a scan had claimed and begun its message")
	}
}
