package delivery

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestSuppressOnlyAddressFailures: Options.Suppress hears of a 5xx about
// the mailbox (5.1.1, 5.2.1, "user unknown"), not of a policy or content
// refusal, and a suppressed bounce carries a suppressed event.
func TestSuppressOnlyAddressFailures(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h, ev := eventsHarness(t, false)
	h.dns.MX("sup.test", 10, "mx.sup.test").A("mx.sup.test", ip)
	replies := map[string]string{
		"unknown":  "550 5.1.1 no such user",
		"disabled": "550 5.2.1 mailbox disabled",
		"text":     "550 User unknown in local recipient table",
		"policy":   "554 5.7.1 rejected by policy",
		"spam":     "550 5.7.1 message looks like spam",
	}
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(_ int, to string) error {
		if r, ok := replies[strings.Split(to, "@")[0]]; ok {
			return relaytest.Reply(r)
		}
		return nil
	}}})
	var mu sync.Mutex
	var got []string
	h.start(func(o *Options) {
		o.Events = ev
		o.Suppress = func(from, rcpt, reason, reply string, _ time.Time) bool {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, rcpt+" "+reason+" "+reply)
			return true
		}
	})
	id := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test",
		Body: []byte("From: <alice@sender.test>\r\nX-Greyrelay-Tag: app-1\r\n\r\nhi\r\n")},
		"unknown@sup.test", "disabled@sup.test", "text@sup.test", "policy@sup.test", "spam@sup.test")
	eventually(t, wait, "all final", func() bool { return h.gone(id) })
	mu.Lock()
	defer mu.Unlock()
	want := map[string]bool{"unknown@sup.test no-such-user 550 5.1.1 no such user": true,
		"disabled@sup.test no-such-user 550 5.2.1 mailbox disabled": true}
	n := 0
	for _, g := range got {
		if want[g] || strings.HasPrefix(g, "text@sup.test no-such-user 550") {
			n++
		} else {
			t.Errorf("suppressed %q", g)
		}
	}
	if n != 3 {
		t.Errorf("suppressed %q, want unknown@, disabled@ and text@", got)
	}
	kinds := outboxKinds(t, h.q)
	for _, r := range []string{"unknown", "disabled", "text"} {
		if !has(kinds, r+"@sup.test suppressed") {
			t.Errorf("no suppressed event for %s: %v", r, kinds)
		}
	}
	if has(kinds, "policy@sup.test suppressed") || has(kinds, "spam@sup.test suppressed") {
		t.Errorf("a policy refusal has a suppressed event: %v", kinds)
	}
}

// TestBounceSuppressed: with Options.Suppressed (suppression.action
// bounce), a suppressed recipient fails at once without a connection,
// with reason suppressed, a DSN naming the suppression and a bounced
// event; the message's other recipient is delivered as usual.
func TestBounceSuppressed(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h, ev := eventsHarness(t, false)
	h.dns.MX("sup.test", 10, "mx.sup.test").A("mx.sup.test", ip)
	mx := startMX(t, ip, h.port, relaytest.MXOptions{})
	since := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	h.start(func(o *Options) {
		o.Events = ev
		o.Suppressed = func(sender, rcpt string) (time.Time, string, string, bool) {
			if rcpt == "gone@sup.test" {
				return since, "no-such-user", "550 5.1.1 no such user", true
			}
			return time.Time{}, "", "", false
		}
	})
	id := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test",
		Body: []byte("From: <alice@sender.test>\r\nX-Greyrelay-Tag: app-1\r\n\r\nhi\r\n")},
		"gone@sup.test", "here@sup.test")
	eventually(t, wait, "all final, the DSN delivered", func() bool { return h.gone(id) && h.drained() })
	for _, tx := range mx.Transactions() {
		if slices.Contains(tx.Tried, "gone@sup.test") {
			t.Errorf("the suppressed recipient was sent to the destination: %+v", tx.Tried)
		}
	}
	outs := h.outcomes("gone@sup.test")
	if len(outs) != 1 || outs[0]["reason"] != "suppressed" || outs[0]["outcome"] != "failed" {
		t.Fatalf("the suppressed recipient's attempts: %v", outs)
	}
	dsns := h.dsns()
	if len(dsns) != 1 || !strings.Contains(string(dsns[0].Data), "Recipient address suppressed since 2026-11-30 (reason: no-such-user): 550 5.1.1 no such user") {
		t.Fatalf("DSNs: %d, want one naming the suppression", len(dsns))
	}
	kinds := outboxKinds(t, h.q)
	if !has(kinds, "gone@sup.test bounced") || !has(kinds, "here@sup.test delivered") || has(kinds, "gone@sup.test suppressed") {
		t.Errorf("events %v", kinds)
	}
}
