package delivery

import (
	"errors"
	"reflect"
	"testing"

	"github.com/greyrelay/greyrelay/queue"
)

// TestHeldFlush checks that held outcomes are stored together, oldest
// first, without the destination records, and kept while storing fails.
func TestHeldFlush(t *testing.T) {
	res := func(id queue.ID) queue.Result { return queue.Result{Key: queue.Key{ID: id}, Status: queue.Delivered} }
	dsnFor := func(from string) queue.NewMessage { return queue.NewMessage{From: from} }
	var h held
	calls := 0
	var got queue.Update
	fail := func(u queue.Update) error { calls++; got = u; return errors.New("ENOSPC") }
	ok := func(u queue.Update) error { calls++; got = u; return nil }

	if stored, left, err := h.flush(fail); stored != 0 || left != 0 || err != nil || calls != 0 {
		t.Fatalf("empty flush = %d, %d, %v after %d calls; want nothing, no call", stored, left, err, calls)
	}
	h.add(queue.Update{Results: []queue.Result{res(1)}, Destinations: []queue.Destination{{Domain: "a.test"}}})
	h.add(queue.Update{Results: []queue.Result{res(2)}, DSNs: []queue.NewMessage{dsnFor("")}})
	if stored, left, err := h.flush(fail); stored != 0 || left != 2 || err == nil {
		t.Fatalf("failing flush = %d, %d, %v; want 0 stored, 2 left, the error", stored, left, err)
	}
	h.add(queue.Update{Results: []queue.Result{res(3)}})
	stored, left, err := h.flush(ok)
	if stored != 3 || left != 0 || err != nil {
		t.Fatalf("flush = %d, %d, %v; want 3 stored, none left", stored, left, err)
	}
	want := queue.Update{Results: []queue.Result{res(1), res(2), res(3)}, DSNs: []queue.NewMessage{dsnFor("")}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("stored %+v, want %+v (oldest first, no destinations)", got, want)
	}
	if stored, left, _ := h.flush(fail); stored != 0 || left != 0 || calls != 2 {
		t.Fatalf("flush after success = %d, %d after %d calls; want nothing held", stored, left, calls)
	}
}
