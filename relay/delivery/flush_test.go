package delivery

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// longDeadHosts keeps a refused address on the dead-host list for a
// minute (retry.initial_interval), far longer than any wait of these tests.
func longDeadHosts(c *config.Config) {
	c.Retry.InitialInterval, c.Retry.MaxInterval = time.Minute, time.Hour
}

// TestFlush_DeadHostNoAttempt: while every address of a destination is on
// the dead-host list, a new message for it is postponed until the first
// address may be dialed again, without an attempt: nothing is dialed, its
// attempt count stays 0 and it says why.
func TestFlush_DeadHostNoAttempt(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, longDeadHosts)
	h.dns.MX("down.test", 10, "mx.down.test").A("mx.down.test", ip) // nothing listens
	a := h.enqueue("alice@sender.test", "a@down.test")
	h.start()
	eventually(t, wait, "a's refused attempt", func() bool { return len(h.outcomes("a@down.test")) == 1 })
	b := h.enqueue("alice@sender.test", "b@down.test")
	eventually(t, wait, "b postponed", func() bool {
		return h.logs.FilterMessageSnippet("delivery postponed").FilterField(zap.String("rcpt", "b@down.test")).Len() == 1
	})
	rb, _ := h.rcpt(b, 0)
	if rb.Attempts != 0 || rb.Status != queue.Queued || rb.Reason != "connect" ||
		rb.NextAttempt.Before(time.Now().Add(30*time.Second)) {
		t.Errorf("b after postponing: %d attempts, %s, reason %q, next %v; want 0 attempts, queued, connect, in about a minute",
			rb.Attempts, rb.Status, rb.Reason, time.Until(rb.NextAttempt))
	}
	if outs := h.outcomes("b@down.test"); len(outs) != 0 {
		t.Errorf("b: attempt lines %v without a connection", outs)
	}
	if ra, _ := h.rcpt(a, 0); ra.Attempts != 1 {
		t.Errorf("a: %d attempts, want the 1 that was refused", ra.Attempts)
	}
}

// TestFlush_RetryForgetsDeadHosts: after the next hop comes back, the
// operator's retry forgets the dead-host list and both the deferred and
// the postponed message are delivered at once, not a minute later when
// the list runs out; the postponed one at its first attempt.
func TestFlush_RetryForgetsDeadHosts(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, longDeadHosts)
	h.dns.MX("back.test", 10, "mx.back.test").A("mx.back.test", ip)
	a := h.enqueue("alice@sender.test", "a@back.test")
	h.start()
	eventually(t, wait, "a's refused attempt", func() bool { return len(h.outcomes("a@back.test")) == 1 })
	b := h.enqueue("alice@sender.test", "b@back.test")
	eventually(t, wait, "b postponed", func() bool {
		r, _ := h.rcpt(b, 0)
		return r.Reason == "connect"
	})
	mx := startMX(t, ip, h.port, relaytest.MXOptions{}) // the next hop is back
	n, err := h.eng.Retry(queue.Selector{All: true}, time.Now())
	if err != nil || n != 2 {
		t.Fatalf("Retry: %d, %v; want 2 recipients", n, err)
	}
	h.eng.Kick()
	eventually(t, wait, "both delivered", func() bool { return h.gone(a) && h.gone(b) })
	if got := len(mx.Delivered()); got != 2 {
		t.Errorf("the MX got %d messages, want 2", got)
	}
	if outs := h.outcomes("b@back.test"); len(outs) != 1 || outs[0]["attempt"] != int64(1) {
		t.Errorf("b: %v, want delivered at attempt 1", outs)
	}
	if dst, _, _ := h.q.Destination("back.test"); len(dst.DeadHosts) != 0 {
		t.Errorf("dead hosts %v after the flush and a delivery", dst.DeadHosts)
	}
}

// TestFlush_RetryForgetsThrottlePause: a destination that paused us for
// half an hour takes the message at once after the operator's retry of
// its domain.
func TestFlush_RetryForgetsThrottlePause(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.Retry.HintMax = time.Hour })
	h.dns.MX("paused.test", 10, "mx.paused.test").A("mx.paused.test", ip)
	mx := startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(n int, _ string) error {
		if n == 0 {
			return relaytest.Reply("451 4.7.28 mail flood detected, slow down, try again in 30 minutes")
		}
		return nil
	}}})
	id := h.enqueue("alice@sender.test", "p@paused.test")
	h.start()
	eventually(t, wait, "rate-limited", func() bool { return len(h.outcomes("p@paused.test")) == 1 })
	if dst, _, _ := h.q.Destination("paused.test"); dst.ThrottledUntil.Before(time.Now().Add(20 * time.Minute)) {
		t.Fatalf("destination %+v, want paused for about 30 minutes", dst)
	}
	if n, err := h.eng.Retry(queue.Selector{Domain: "PAUSED.test"}, time.Now()); err != nil || n != 1 {
		t.Fatalf("Retry: %d, %v; want 1 recipient", n, err)
	}
	h.eng.Kick()
	eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	if got := len(mx.Delivered()); got != 1 {
		t.Errorf("the MX got %d messages, want 1", got)
	}
}

// TestFlush_Forget drops the learned record of one destination (in memory
// and stored), or of all; forgetting what is not known changes nothing.
func TestFlush_Forget(t *testing.T) {
	t.Parallel()
	ip1, ip2 := relaytest.Loopback(t), relaytest.Loopback(t)
	h := newHarness(t, longDeadHosts)
	h.dns.MX("gone1.test", 10, "mx.gone1.test").A("mx.gone1.test", ip1) // nothing listens
	h.dns.MX("gone2.test", 10, "mx.gone2.test").A("mx.gone2.test", ip2)
	h.enqueue("alice@sender.test", "x@gone1.test", "y@gone2.test")
	h.start()
	eventually(t, wait, "both refused", func() bool {
		_, ok1, _ := h.q.Destination("gone1.test")
		_, ok2, _ := h.q.Destination("gone2.test")
		return ok1 && ok2
	})
	if n, err := h.eng.Forget("Gone1.test.", false, time.Now()); err != nil || n != 1 {
		t.Errorf("Forget gone1: %d, %v; want 1", n, err)
	}
	if _, ok, _ := h.q.Destination("gone1.test"); ok {
		t.Error("gone1.test still stored")
	}
	if n, err := h.eng.Forget("never.test", false, time.Now()); err != nil || n != 0 {
		t.Errorf("Forget never.test: %d, %v; want 0", n, err)
	}
	if n, err := h.eng.Forget("", true, time.Now()); err != nil || n != 1 {
		t.Errorf("Forget all: %d, %v; want 1", n, err)
	}
	if ds, _ := h.q.Destinations(); len(ds) != 0 {
		t.Errorf("destinations left: %+v", ds)
	}
}

// TestFlush_RetryWhileAttemptInFlight: the flush also reaches what a
// running attempt has learned but not stored yet. The first MX refuses
// the connection (a dead host, noted in memory), the second holds the
// transaction open; a retry of the domain meanwhile forgets the dead host,
// so the outcome stored afterwards does not bring it back.
func TestFlush_RetryWhileAttemptInFlight(t *testing.T) {
	t.Parallel()
	ip1, ip2 := relaytest.Loopback(t), relaytest.Loopback(t)
	h := newHarness(t, longDeadHosts)
	// mx1 refuses (nothing listens there); mx2 holds the transaction.
	h.dns.MX("inflight.test", 10, "mx1.inflight.test").A("mx1.inflight.test", ip1)
	h.dns.MX("inflight.test", 20, "mx2.inflight.test").A("mx2.inflight.test", ip2)
	inRcpt, release := make(chan struct{}), make(chan struct{})
	startMX(t, ip2, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		close(inRcpt)
		<-release
		return nil
	}}})
	id := h.enqueue("alice@sender.test", "f@inflight.test")
	h.start()
	select {
	case <-inRcpt:
	case <-time.After(wait):
		t.Fatal("no transaction at the second MX")
	}
	if _, err := h.eng.Retry(queue.Selector{Domain: "inflight.test"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	close(release)
	eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	dst, ok, _ := h.q.Destination("inflight.test")
	if !ok || len(dst.DeadHosts) != 0 {
		t.Errorf("destination %+v (stored %v), want no dead host after the flush", dst, ok)
	}
}
