package delivery

import (
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// backlog queues n single-recipient messages to rcpt in one transaction.
func (h *harness) backlog(rcpt, domain string, n int) {
	h.t.Helper()
	ms := make([]queue.NewMessage, n)
	for i := range ms {
		ms[i] = queue.NewMessage{From: "alice@sender.test", Arrival: time.Now(), Body: []byte("Subject: b\r\n\r\nb\r\n"),
			To: []queue.NewRecipient{{Addr: rcpt, Domain: domain}}}
	}
	if _, err := h.q.EnqueueBatch(ms); err != nil {
		h.t.Fatal(err)
	}
}

// TestScheduler_BacklogDoesNotHideNewWork: a destination whose only
// connection hangs holds a backlog far larger than one scan batch; new
// messages for a healthy domain, queued one by one while the backlog stays
// due, are each picked up and delivered.
func TestScheduler_BacklogDoesNotHideNewWork(t *testing.T) {
	t.Parallel()
	ip1, ip2 := relaytest.Loopback(t), relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) {
		c.Delivery.MaxPerDestination = 1
		c.Delivery.DataTimeout = time.Minute
	})
	h.dns.MX("stuck.test", 10, "mx.stuck.test").A("mx.stuck.test", ip1).
		MX("healthy.test", 10, "mx.healthy.test").A("mx.healthy.test", ip2)
	gate := make(chan struct{})
	stuck := startMX(t, ip1, h.port, relaytest.MXOptions{Script: relaytest.Script{Data: func(int) error { <-gate; return nil }}})
	healthy := startMX(t, ip2, h.port, relaytest.MXOptions{})
	h.backlog("s@stuck.test", "stuck.test", 3*scanBatch)
	h.start()
	t.Cleanup(func() { close(gate) }) // runs before the harness stops
	eventually(t, wait, "stuck.test connection hanging", func() bool { return len(stuck.Transactions()) > 0 })
	for i := range 20 {
		id := h.enqueue("alice@sender.test", "h@healthy.test")
		eventually(t, wait, "healthy message "+string(rune('a'+i))+" delivered", func() bool { return h.gone(id) })
	}
	if n := len(healthy.Delivered()); n != 20 {
		t.Errorf("healthy.test got %d messages, want 20", n)
	}
	if n := len(stuck.Transactions()); n != 1 {
		t.Errorf("stuck.test saw %d transactions, want the one hanging", n)
	}
}

// TestScheduler_PassedOverPickedUpWhenCapacityFrees: a burst larger than a
// destination's job list leaves recipients in the queue behind the scan
// position; as the destination drains they are picked up, with no new
// enqueue to wake the scheduler and long before the periodic full rescan.
func TestScheduler_PassedOverPickedUpWhenCapacityFrees(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.Delivery.MaxPerDestination = 1 })
	h.dns.MX("burst.test", 10, "mx.burst.test").A("mx.burst.test", ip)
	f := startMX(t, ip, h.port, relaytest.MXOptions{})
	n := 5 * reuseShare
	h.backlog("b@burst.test", "burst.test", n)
	h.start()
	eventually(t, wait, "the whole burst delivered", func() bool { return len(f.Delivered()) == n })
	// The peer counts a message before its 250 reaches us, so the last
	// outcomes may still be on their way into the queue.
	eventually(t, wait, "the queue empty", func() bool {
		st, err := h.q.Stats()
		return err == nil && st.Messages == 0
	})
	if got := len(f.Delivered()); got != n {
		t.Errorf("%d messages delivered, want %d (none twice)", got, n)
	}
}
