package delivery

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestSuspendedDestination: mail to a suspended domain is not attempted
// (no connection, no attempt counted) and waits until the suspension
// ends, or until its lifetime does: a message whose deadline comes first
// expires then, as it would in a deferred queue. Resume sends the rest at
// once; other domains are not held back meanwhile.
func TestSuspendedDestination(t *testing.T) {
	t.Parallel()
	ip, other := relaytest.Loopback(t), relaytest.Loopback(t)
	clk := &steppedClock{}
	h := newHarness(t, func(c *config.Config) { c.Retry.Lifetime = 10 * time.Minute })
	h.dns.MX("sus.test", 10, "mx.sus.test").A("mx.sus.test", ip)
	h.dns.MX("go.test", 10, "mx.go.test").A("mx.go.test", other)
	mx := startMX(t, ip, h.port, relaytest.MXOptions{})
	goMX := startMX(t, other, h.port, relaytest.MXOptions{})
	h.start(func(o *Options) { o.Now = clk.Now })
	now := clk.Now()
	if _, err := h.eng.Suspend("sus.test", "test", time.Time{}, now); err != nil {
		t.Fatal(err)
	}

	early := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test", Arrival: now.Add(-5 * time.Minute)}, "a@sus.test")
	late := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test", Arrival: now}, "b@sus.test")
	h.enqueueMsg(queue.NewMessage{From: "alice@sender.test", Arrival: now}, "c@go.test")
	eventually(t, wait, "go.test delivered", func() bool { return len(goMX.Delivered()) == 1 })
	// Each waits to its deadline (the suspension has no end): moved, not attempted.
	for _, id := range []queue.ID{early, late} {
		eventually(t, wait, "postponed to the deadline", func() bool {
			r, ok := h.rcpt(id, 0)
			return ok && r.NextAttempt.After(now.Add(4*time.Minute))
		})
		if r, _ := h.rcpt(id, 0); r.Attempts != 0 || r.Status != queue.Queued {
			t.Errorf("recipient of %s while suspended: %+v, want queued without an attempt", id, r)
		}
	}
	if got := mx.Connections(); len(got) != 0 {
		t.Fatalf("the suspended destination's MX saw %d connections", len(got))
	}
	if got := h.eng.Suspensions(now); len(got) != 1 || got[0].Domain != "sus.test" {
		t.Errorf("Suspensions = %+v", got)
	}

	// early's deadline passes while suspended: it expires, late waits.
	r, _ := h.rcpt(early, 0)
	clk.to(r.NextAttempt)
	h.eng.Kick()
	eventually(t, wait, "early expired", func() bool { return h.gone(early) })
	if len(mx.Connections()) != 0 {
		t.Error("an expiry while suspended connected to the MX")
	}

	was, n, err := h.eng.Resume("sus.test", clk.Now())
	if err != nil || !was || n != 1 {
		t.Fatalf("Resume = %v, %d, %v; want the suspension and late's recipient", was, n, err)
	}
	eventually(t, wait, "late delivered after resume", func() bool { return h.gone(late) })
	if len(mx.Delivered()) != 1 {
		t.Errorf("the MX got %d messages, want late's", len(mx.Delivered()))
	}
}

// fakeSuspensions is a SuspensionStore in memory.
type fakeSuspensions struct {
	mu sync.Mutex
	m  map[string]queue.Suspension
}

func (f *fakeSuspensions) Suspensions() ([]queue.Suspension, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []queue.Suspension
	for _, s := range f.m {
		out = append(out, s)
	}
	return out, true
}

func (f *fakeSuspensions) PutSuspension(s queue.Suspension) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[s.Domain] = s
	return true
}

func (f *fakeSuspensions) DeleteSuspension(domain string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, domain)
	return true
}

// TestSharedSuspensions: a suspension another node shares is taken as
// this node's (stored in its queue too), and its removal resumes the
// domain here.
func TestSharedSuspensions(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	store := &fakeSuspensions{m: map[string]queue.Suspension{}}
	h.start(func(o *Options) { o.Suspensions = store })
	now := time.Now()
	store.PutSuspension(queue.Suspension{Domain: "shared.test", Reason: "elsewhere", Since: now, Node: "b"})
	domains := func() []string {
		var out []string
		for _, s := range h.eng.Suspensions(time.Now()) {
			out = append(out, s.Domain)
		}
		return out
	}
	eventually(t, 4*suspendSync, "the shared suspension taken", func() bool { return slices.Equal(domains(), []string{"shared.test"}) })
	if ss, _ := h.q.Suspensions(); len(ss) != 1 || ss[0].Node != "b" {
		t.Errorf("stored suspensions %+v, want the shared one", ss)
	}
	store.DeleteSuspension("shared.test")
	eventually(t, 4*suspendSync, "the shared resume taken", func() bool { return len(domains()) == 0 })
	if ss, _ := h.q.Suspensions(); len(ss) != 0 {
		t.Errorf("stored suspensions %+v after the shared resume", ss)
	}
}
