package queue

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// deferAt records one deferred attempt for k (reason, route) ending at t0.
func deferAt(t *testing.T, q *Queue, k Key, reason string) {
	t.Helper()
	if err := q.Begin(Start{Keys: []Key{k}, Time: t0, SourceIP: "192.0.2.1", MXHost: "mx.old.test", MXAddr: "198.51.100.1",
		LeaseUntil: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Apply(Update{Results: []Result{{Key: k, Status: Deferred, Reason: reason, End: t0.Add(time.Second),
		Reply: Reply{Code: 451, Text: "later"}, NextAttempt: t0.Add(time.Hour)}}}); err != nil {
		t.Fatal(err)
	}
}

// TestSelectorCriteria: every criterion narrows the selection, several
// must all match, and a dry run counts what the action would change
// while changing nothing.
func TestSelectorCriteria(t *testing.T) {
	q, _ := newQ(t)
	m1 := msg("alice@x.test", "r1@a.test", "r2@b.test")
	m1.Tag = "newsletter"
	a := mustEnqueue(t, q, m1)
	m2 := msg("bob@x.test", "r3@a.test")
	m2.Arrival, m2.EnvID = t0.Add(2*time.Hour), "env-7"
	b := mustEnqueue(t, q, m2)
	deferAt(t, q, Key{a, 0}, "greylisted")
	deferAt(t, q, Key{b, 0}, "dns")

	tests := []struct {
		name string
		sel  Selector
		want []Key
	}{
		{"status", Selector{Status: Deferred}, []Key{{a, 0}, {b, 0}}},
		{"status queued", Selector{Status: Queued}, []Key{{a, 1}}},
		{"reason", Selector{Reason: "dns"}, []Key{{b, 0}}},
		{"domain any case", Selector{Domain: "A.TEST"}, []Key{{a, 0}, {b, 0}}},
		{"sender", Selector{Sender: "Alice@x.test"}, []Key{{a, 0}, {a, 1}}},
		{"arrived before", Selector{ArrivedBefore: t0.Add(time.Hour)}, []Key{{a, 0}, {a, 1}}},
		{"tag", Selector{Tag: "newsletter"}, []Key{{a, 0}, {a, 1}}},
		{"tag is not the envelope id", Selector{Tag: "env-7"}, nil},
		{"domain and status", Selector{Domain: "a.test", Status: Deferred, Reason: "greylisted"}, []Key{{a, 0}}},
		{"id and domain", Selector{ID: a, Domain: "b.test"}, []Key{{a, 1}}},
		{"nothing matches", Selector{Domain: "a.test", Sender: "carol@x.test"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, err := q.Select(tt.sel)
			if err != nil || !reflect.DeepEqual(keysOf(rs), tt.want) {
				t.Fatalf("Select(%+v) = %v, %v; want %v", tt.sel, keysOf(rs), err, tt.want)
			}
			dry := tt.sel
			dry.DryRun = true
			n, err := q.Hold(dry)
			if err != nil || n != len(tt.want) {
				t.Errorf("dry-run Hold = %d, %v; want %d", n, err, len(tt.want))
			}
			if st, _ := q.Stats(); st.ByStatus[Held] != 0 {
				t.Errorf("a dry run held %d recipients", st.ByStatus[Held])
			}
		})
	}
	for _, bad := range []Selector{{}, {DryRun: true}, {All: true, Status: Deferred}, {Status: "stuck"}} {
		if _, err := q.Hold(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Hold(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	checkStats(t, q)

	// Delete with an ID and a filter removes only what they select: the
	// message keeps its other recipient.
	if n, err := q.Delete(Selector{ID: a, Domain: "b.test"}); err != nil || n != 1 {
		t.Fatalf("Delete(id, domain) = %d, %v", n, err)
	}
	if m := mustShow(t, q, a); len(m.Recipients) != 1 || m.Recipients[0].Key != (Key{a, 0}) {
		t.Errorf("after deleting one recipient of %s: %+v", a, m.Recipients)
	}
	checkStats(t, q)
}

// TestRequeue: requeue makes recipients due now, forgets their route,
// recomputes their domain, keeps their attempts, releases held ones and
// leaves final ones alone.
func TestRequeue(t *testing.T) {
	q, _ := newQ(t)
	m := msg("s@x.test", "r1@Old.Test", "r2@b.test", "r3@b.test")
	a := mustEnqueue(t, q, m)
	deferAt(t, q, Key{a, 0}, "greylisted")
	if _, err := q.Hold(Selector{ID: a, Domain: "b.test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Release(Selector{ID: a, Domain: "b.test"}, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Hold(Selector{ID: a, Domain: "b.test"}); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(3 * time.Hour)
	dry, err := q.Requeue(Selector{ID: a, DryRun: true}, now, strings.ToLower, nil)
	if err != nil || dry != 3 {
		t.Fatalf("dry-run Requeue = %d, %v", dry, err)
	}
	if r := rcptOf(t, q, Key{a, 0}); r.MXHost == "" {
		t.Fatalf("a dry run forgot the route: %+v", r)
	}
	domainOf := func(addr string) string { return strings.ToLower(addr[strings.LastIndexByte(addr, '@')+1:]) }
	if n, err := q.Requeue(Selector{ID: a}, now, domainOf, nil); err != nil || n != 3 {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	r := rcptOf(t, q, Key{a, 0})
	if r.Status != Deferred || !r.NextAttempt.Equal(now) || r.Attempts != 1 || r.MXHost != "" || r.SourceIP != "" || r.Domain != "old.test" {
		t.Errorf("requeued deferred recipient = %+v", r)
	}
	if r := rcptOf(t, q, Key{a, 1}); r.Status != Queued || !r.NextAttempt.Equal(now) || r.Reason != ReasonReleased {
		t.Errorf("requeued held recipient = %+v", r)
	}
	if rs, _ := q.Due(now, 0); len(rs) != 3 {
		t.Errorf("due after requeue: %v", keysOf(rs))
	}
	checkStats(t, q)
}

// TestSuspensionsPersist: suspensions survive a reopen, replace each
// other per domain, and resume removes them.
func TestSuspensionsPersist(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	if err := q.Suspend(Suspension{Domain: "a.test", Reason: "first", Since: t0}); err != nil {
		t.Fatal(err)
	}
	if err := q.Suspend(Suspension{Domain: "A.test.", Reason: "maintenance", Since: t0, Until: t0.Add(time.Hour), Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := q.Suspend(Suspension{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Suspend without a domain = %v", err)
	}
	q.Close()
	q = openAt(t, path, Options{})
	ss, err := q.Suspensions()
	if err != nil || len(ss) != 1 || ss[0].Reason != "maintenance" || !ss[0].Until.Equal(t0.Add(time.Hour)) || ss[0].Node != "n1" {
		t.Fatalf("after reopen: %+v, %v", ss, err)
	}
	if !ss[0].Active(t0) || ss[0].Active(t0.Add(time.Hour)) {
		t.Errorf("Active: %v at t0, %v at its end", ss[0].Active(t0), ss[0].Active(t0.Add(time.Hour)))
	}
	if ok, err := q.Resume("a.test"); !ok || err != nil {
		t.Errorf("Resume = %v, %v", ok, err)
	}
	if ok, _ := q.Resume("a.test"); ok {
		t.Error("Resume twice found a suspension")
	}
	if ss, _ := q.Suspensions(); len(ss) != 0 {
		t.Errorf("after resume: %+v", ss)
	}
}
