package queue

import (
	"testing"
	"time"
)

// TestDueCursor: Next continues after what it examined, returns entries a
// later write puts behind its position (an arrival in the past, a
// deferral), does not return passed-over entries again until Reset.
func TestDueCursor(t *testing.T) {
	q, _ := newQ(t)
	c := q.DueCursor()
	defer c.Close()
	now := t0.Add(time.Hour)
	next := func(skip func(string, Key, time.Time) bool) []Key {
		t.Helper()
		// The cursor reads the database; the scheduler calls it when the
		// commit that inserts a journaled message wakes it.
		if err := q.settle(); err != nil {
			t.Fatal(err)
		}
		rs, err := c.Next(now, 0, skip)
		if err != nil {
			t.Fatal(err)
		}
		return keysOf(rs)
	}
	a := mustEnqueue(t, q, msg("s@x.test", "r@a.test"))
	late := msg("s@x.test", "r@b.test")
	late.Arrival = t0.Add(30 * time.Minute)
	b := mustEnqueue(t, q, late)
	if got := next(func(d string, _ Key, _ time.Time) bool { return d == "a.test" }); len(got) != 1 || got[0] != (Key{b, 0}) {
		t.Fatalf("first Next = %v, want only %v", got, Key{b, 0})
	}
	if got := next(nil); len(got) != 0 {
		t.Fatalf("second Next = %v, want nothing new", got)
	}
	early := msg("s@x.test", "r@c.test")
	early.Arrival = t0.Add(time.Minute) // behind the position
	e := mustEnqueue(t, q, early)
	// The walk restarts at the new entry; what follows it comes again (the
	// caller passes over what it already holds).
	if got := next(nil); len(got) != 2 || got[0] != (Key{e, 0}) || got[1] != (Key{b, 0}) {
		t.Fatalf("Next after an earlier enqueue = %v, want %v then %v", got, Key{e, 0}, Key{b, 0})
	}
	c.Reset()
	if got := next(nil); len(got) != 3 || got[0] != (Key{a, 0}) {
		t.Fatalf("Next after Reset = %v, want all three from %v", got, Key{a, 0})
	}
	rs, err := c.Next(now, 1, nil)
	if err != nil || len(rs) != 0 {
		t.Fatalf("Next at the end = %v, %v", rs, err)
	}
	c.Rewind(late.Arrival)
	if got := next(nil); len(got) != 1 || got[0] != (Key{b, 0}) {
		t.Fatalf("Next after Rewind = %v, want %v", got, Key{b, 0})
	}
	c.Reset()
	for _, want := range []Key{{a, 0}, {e, 0}, {b, 0}} {
		rs, err := c.Next(now, 1, nil)
		if err != nil || len(rs) != 1 || rs[0].Key != want {
			t.Fatalf("Next with limit 1 = %v, %v; want %v", keysOf(rs), err, want)
		}
	}
}
