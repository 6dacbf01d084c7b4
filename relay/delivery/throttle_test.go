package delivery

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// steppedClock is the real clock plus what a test adds to it: the test
// moves the engine past a deadline once what must happen before it has
// happened, instead of racing a real one.
type steppedClock struct{ ahead atomic.Int64 }

// Now is the engine's clock (Options.Now).
func (c *steppedClock) Now() time.Time { return time.Now().Add(time.Duration(c.ahead.Load())) }

// to moves the clock to t, if t is ahead of it.
func (c *steppedClock) to(t time.Time) {
	if d := t.Sub(c.Now()); d > 0 {
		c.ahead.Add(int64(d))
	}
}

// TestThrottledExpiry: a destination rate-limits every attempt, pausing
// longer than the first message has left to live, so that message expires
// while the destination is paused, without an attempt. Its log line and
// DSN still name the route of its last real attempt (MX, address, source
// IP), and its expiry leaves the throttle alone while a second message
// waits; once that one expires too, nothing waits and the throttle decays.
//
// The engine runs on a stepped clock, moved to each deadline once the
// attempt before it is stored and then kicked: with real deadlines (a
// lifetime of 600 ms), a first attempt slower than that on a loaded
// machine came after the deadline and expired the message itself.
func TestThrottledExpiry(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	clk := &steppedClock{}
	h := newHarness(t, func(c *config.Config) { c.Retry.Lifetime, c.Retry.HintMax = 10*time.Minute, time.Hour })
	h.dns.MX("thr.test", 10, "mx.thr.test").A("mx.thr.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		// The hint pauses the destination past the deadline of the
		// message refused.
		return relaytest.Reply("451 4.7.28 mail flood detected, slow down, try again in 20 minutes")
	}}})
	now := clk.Now()
	a := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test", Arrival: now}, "a@thr.test")
	// b arrives (and is due) after a's deadline, while the pause lasts: it
	// waits while a expires.
	b := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test", Arrival: now.Add(15 * time.Minute)}, "b@thr.test")
	h.start(func(o *Options) { o.Now = clk.Now })

	// a's deadline comes while the pause lasts.
	eventually(t, wait, "a rate-limited", func() bool { return len(h.outcomes("a@thr.test")) == 1 })
	expireDuringPause(t, h, clk, a)
	eventually(t, wait, "a expired", func() bool { return h.gone(a) })
	outs := h.outcomes("a@thr.test")
	if len(outs) != 2 {
		t.Fatalf("a: logged %v, want a rate-limited attempt and the expiry", outs)
	}
	last := outs[len(outs)-1]
	if last["outcome"] != "failed" || last["mx"] != "mx.thr.test" || last["mx_addr"] != ip ||
		last["source_ip"] != sourceIP || last["reason"] != "rate-limited" || last["attempt"] != int64(1) {
		t.Errorf("a's expiry logged %v, want failed rate-limited without a new attempt, with the last attempt's route mx.thr.test [%s] from %s",
			last, ip, sourceIP)
	}
	dst, _, _ := h.q.Destination("thr.test")
	if dst.ThrottleLevel == 0 {
		t.Errorf("throttle level 0 after a expired while b waits, want it kept: %+v", dst)
	}

	// The pause ends after b arrived: b has its real attempt, is paused
	// again and expires during that pause.
	clk.to(now.Add(15 * time.Minute)) // b's arrival
	clk.to(dst.ThrottledUntil.Add(time.Millisecond))
	h.eng.Kick()
	eventually(t, wait, "b rate-limited", func() bool { return len(h.outcomes("b@thr.test")) == 1 })
	expireDuringPause(t, h, clk, b)
	eventually(t, wait, "b expired", func() bool { return h.gone(b) })
	eventually(t, wait, "two DSNs", func() bool { return len(h.dsns()) == 2 })
	for _, d := range h.dsns() {
		if !strings.Contains(d.Data, "Remote-MTA: dns; mx.thr.test") || !strings.Contains(d.Data, "Status: 4.4.7") {
			t.Errorf("expiry DSN without the last attempt's Remote-MTA:\n%s", d.Data)
		}
	}
	dst, _, _ = h.q.Destination("thr.test")
	if dst.ThrottleLevel != 0 || !dst.ThrottledUntil.IsZero() {
		t.Errorf("destination %+v after its last message expired, want the throttle decayed (level 0, no pause)", dst)
	}
}

// expireDuringPause checks that message id's only recipient was deferred
// to its deadline, inside the destination's pause, and moves the clock
// there.
func expireDuringPause(t *testing.T, h *harness, clk *steppedClock, id queue.ID) {
	t.Helper()
	r, ok := h.rcpt(id, 0)
	dst, _, _ := h.q.Destination("thr.test")
	if !ok || r.Reason != "rate-limited" || !r.NextAttempt.Before(dst.ThrottledUntil) {
		t.Fatalf("recipient %+v next at %v, want rate-limited and due before the pause ends at %v", r, r.NextAttempt, dst.ThrottledUntil)
	}
	clk.to(r.NextAttempt)
	h.eng.Kick()
}
