package delivery

import (
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestThrottledExpiry: a destination rate-limits every attempt, pausing
// longer than the first message has left to live, so that message expires
// while the destination is paused, without an attempt. Its log line and
// DSN still name the route of its last real attempt (MX, address, source
// IP), and its expiry leaves the throttle alone while a second message
// waits; once that one expires too, nothing waits and the throttle decays.
func TestThrottledExpiry(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.Retry.Lifetime = 600 * time.Millisecond })
	h.dns.MX("thr.test", 10, "mx.thr.test").A("mx.thr.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		// The hint (clamped to retry.hint_max, 1s) pauses the destination
		// past the first message's deadline.
		return relaytest.Reply("451 4.7.28 mail flood detected, slow down, try again in 60 seconds")
	}}})
	now := time.Now()
	a := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test", Arrival: now}, "a@thr.test")
	// b arrives (and is due) later: it waits while a expires.
	b := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test", Arrival: now.Add(2 * time.Second)}, "b@thr.test")
	h.start()
	eventually(t, wait, "a expired", func() bool { return h.gone(a) })

	outs := h.outcomes("a@thr.test")
	if len(outs) < 2 {
		t.Fatalf("a: logged %v, want a rate-limited attempt and the expiry", outs)
	}
	last := outs[len(outs)-1]
	if last["outcome"] != "failed" || last["mx"] != "mx.thr.test" || last["mx_addr"] != ip ||
		last["source_ip"] != sourceIP || last["reason"] != "rate-limited" {
		t.Errorf("a's expiry logged %v, want failed rate-limited, with the last attempt's route mx.thr.test [%s] from %s",
			last, ip, sourceIP)
	}
	dst, _, _ := h.q.Destination("thr.test")
	if dst.ThrottleLevel == 0 {
		t.Errorf("throttle level 0 after a expired while b waits, want it kept: %+v", dst)
	}

	eventually(t, 2*wait, "b expired", func() bool { return h.gone(b) })
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
