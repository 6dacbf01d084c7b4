package queue

import (
	"testing"
	"time"
)

// TestWaiting: a domain is waited for while one of its recipients is
// queued, deferred or in flight, other than those excepted; held and final
// recipients do not count, and the domain matches case-insensitively.
func TestWaiting(t *testing.T) {
	q, _ := newQ(t)
	a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test", "r3@b.test"))
	waiting := func(domain string, except ...Key) bool {
		t.Helper()
		w, err := q.Waiting(domain, except)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	if !waiting("A.test.") || !waiting("b.test") || waiting("c.test") {
		t.Fatalf("queued: a %v b %v c %v, want true true false", waiting("a.test"), waiting("b.test"), waiting("c.test"))
	}
	if waiting("a.test", Key{a, 0}, Key{a, 1}) {
		t.Error("a.test waited for with both its recipients excepted")
	}
	if err := q.Begin(Start{Keys: []Key{{a, 0}}, Time: t0, LeaseUntil: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if !waiting("a.test", Key{a, 1}) {
		t.Error("a.test not waited for while r1 is in flight")
	}
	if _, err := q.Apply(Update{Results: []Result{{Key: Key{a, 0}, Status: Failed, End: t0}}}); err != nil {
		t.Fatal(err)
	}
	if waiting("a.test", Key{a, 1}) {
		t.Error("a.test waited for after r1 failed")
	}
	if _, err := q.Hold(Selector{Domain: "a.test"}); err != nil {
		t.Fatal(err)
	}
	if waiting("a.test") {
		t.Error("a.test waited for with its only live recipient held")
	}
}

// TestForgetDestinations deletes the named records, or all of them.
func TestForgetDestinations(t *testing.T) {
	q, _ := newQ(t)
	var u Update
	for _, d := range []string{"a.test", "b.test", "c.test"} {
		u.Destinations = append(u.Destinations, Destination{Domain: d, ThrottleLevel: 2, Updated: t0})
	}
	if _, err := q.Apply(u); err != nil {
		t.Fatal(err)
	}
	n, err := q.ForgetDestinations([]string{"A.test.", "nothing.test"}, false)
	if err != nil || n != 1 {
		t.Fatalf("forget a.test: %d, %v; want 1", n, err)
	}
	if _, ok, _ := q.Destination("a.test"); ok {
		t.Error("a.test still stored")
	}
	if _, ok, _ := q.Destination("b.test"); !ok {
		t.Error("b.test forgotten too")
	}
	if n, err = q.ForgetDestinations(nil, true); err != nil || n != 2 {
		t.Fatalf("forget all: %d, %v; want 2", n, err)
	}
	if ds, _ := q.Destinations(); len(ds) != 0 {
		t.Errorf("destinations left: %+v", ds)
	}
}
