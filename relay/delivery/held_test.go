package delivery

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/internal/fulldisk"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestHeldFlush checks that held outcomes are stored together, oldest
// first, without the destination records, and kept while storing fails.
func TestHeldFlush(t *testing.T) {
	res := func(id queue.ID) queue.Result { return queue.Result{Key: queue.Key{ID: id}, Status: queue.Delivered} }
	po := func(u queue.Update) *pendingOutcome { return &pendingOutcome{u: u} }
	var h held
	calls := 0
	var got queue.Update
	fail := func(u queue.Update) error { calls++; got = u; return errors.New("ENOSPC") }
	ok := func(u queue.Update) error { calls++; got = u; return nil }

	if stored, left, err := h.flush(fail); stored != nil || left != 0 || err != nil || calls != 0 {
		t.Fatalf("empty flush = %v, %d, %v after %d calls; want nothing, no call", stored, left, err, calls)
	}
	first := po(queue.Update{Results: []queue.Result{res(1)}, Destinations: []queue.Destination{{Domain: "a.test"}}})
	second := po(queue.Update{Results: []queue.Result{res(2)}, DSNs: []queue.NewMessage{{From: ""}}})
	h.add(first)
	h.add(second)
	if stored, left, err := h.flush(fail); stored != nil || left != 2 || err == nil {
		t.Fatalf("failing flush = %v, %d, %v; want nothing stored, 2 left, the error", stored, left, err)
	}
	// A fresh attempt's start goes with its held outcome (fresh.go).
	start := queue.Start{Keys: []queue.Key{res(3).Key}, MXHost: "mx.test"}
	third := po(queue.Update{Results: []queue.Result{res(3)}, Starts: []queue.Start{start}})
	h.add(third)
	stored, left, err := h.flush(ok)
	want := []*pendingOutcome{first, second, third}
	if !reflect.DeepEqual(stored, want) || left != 0 || err != nil {
		t.Fatalf("flush = %v, %d, %v; want the three in order, none left", stored, left, err)
	}
	wantU := queue.Update{Results: []queue.Result{res(1), res(2), res(3)}, DSNs: []queue.NewMessage{{From: ""}},
		Starts: []queue.Start{start}}
	if !reflect.DeepEqual(got, wantU) {
		t.Fatalf("stored %+v, want %+v (oldest first, with the starts, no destinations)", got, wantU)
	}
	if stored, left, _ := h.flush(fail); stored != nil || left != 0 || calls != 2 {
		t.Fatalf("flush after success = %v, %d after %d calls; want nothing held", stored, left, calls)
	}
}

// An outcome the queue cannot store (here a file-size limit, as a full
// disk would do) is held and stored once the queue takes it, without a
// restart: the message leaves the queue and its DSN goes out. The bounce
// returns a 200 KB body (RET=FULL), so its commit must grow the database
// file, which the limit set between the attempt's Begin and its outcome
// forbids.
func TestHeldOutcomeStoredOnceRoomReturns(t *testing.T) {
	if !fulldisk.RunAlone(t) {
		return
	}
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.DSN.MaxReturnedBytes = 256 << 10 })
	h.dns.MX("full.test", 10, "mx.full.test").A("mx.full.test", ip)
	restore := make(chan func(), 1)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Data: func(int) error {
		// The attempt is recorded (Begin has committed): from here the
		// database file may not grow.
		lift := func() {}
		fi, err := os.Stat(h.path)
		if err == nil {
			lift, err = fulldisk.Set(uint64(fi.Size()))
		}
		if err != nil {
			t.Error(err) // not Fatal: this is the peer's goroutine
		}
		t.Cleanup(lift) // also if the test ends early
		restore <- lift
		return relaytest.Reply("550 5.1.1 no such user")
	}}})
	body := "From: <s@sender.test>\r\nSubject: big\r\n\r\n" + strings.Repeat("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd\r\n", 3200)
	id := h.enqueueMsg(queue.NewMessage{From: "s@sender.test", RET: "FULL", Body: []byte(body)}, "r@full.test")
	h.start()
	eventually(t, 10*time.Second, "the outcome to be held", func() bool {
		return h.logs.FilterMessageSnippet("held, and stored again").Len() > 0
	})
	(<-restore)()
	eventually(t, 10*time.Second, "the held outcome to be stored", func() bool { return h.gone(id) })
	eventually(t, 10*time.Second, "the bounce", func() bool { return len(h.dsns()) == 1 })
}
