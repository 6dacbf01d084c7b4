package delivery

import (
	"encoding/json"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/events"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// outboxKinds returns "rcpt kind" of every event stored for the file sink.
func outboxKinds(t *testing.T, q *queue.Queue) []string {
	t.Helper()
	recs, err := q.Outbox("file", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		var e events.Event
		if err := json.Unmarshal(r.Data[8:], &e); err != nil {
			t.Fatal(err)
		}
		if e.Tag != "app-1" {
			t.Errorf("event %+v without the tag", e)
		}
		out = append(out, e.Rcpt+" "+string(e.Event))
	}
	sort.Strings(out)
	return out
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// eventsHarness is a harness whose queue and engine make events for an
// event file (whose reader never runs: they stay in the queue).
func eventsHarness(t *testing.T, strip bool, mods ...func(c *config.Config)) (*harness, *events.Events) {
	h := newHarness(t, mods...)
	ev := events.New(events.Options{File: filepath.Join(t.TempDir(), "events.jsonl"), StripTag: strip})
	h.q.Close()
	q, err := queue.Open(h.path, ev.QueueOptions(queue.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	h.q = q
	return h, ev
}

// TestEventsWithOutcomes: every outcome's events are in the queue as soon
// as the outcome is (they share its transaction); the tag header is
// stripped from what is sent and kept in the events.
func TestEventsWithOutcomes(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h, ev := eventsHarness(t, true)
	h.dns.MX("ev.test", 10, "mx.ev.test").A("mx.ev.test", ip)
	f := startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(n int, to string) error {
		switch {
		case strings.HasPrefix(to, "bad@"):
			return relaytest.Reply("550 5.1.1 no such user")
		case strings.HasPrefix(to, "grey@") && n == 0:
			return relaytest.Reply("451 4.7.1 greylisted")
		}
		return nil
	}}})
	id := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test",
		Body: []byte("From: <alice@sender.test>\r\nX-Greyrelay-Tag: app-1\r\nMessage-ID: <e@sender.test>\r\n\r\nhi\r\n")},
		"ok@ev.test", "bad@ev.test", "grey@ev.test")
	if _, err := h.q.Message(id); err != nil { // waits until the journaled message is in the database
		t.Fatal(err)
	}
	if got := outboxKinds(t, h.q); strings.Join(got, ",") != "bad@ev.test accepted,grey@ev.test accepted,ok@ev.test accepted" {
		t.Fatalf("after Enqueue: %v", got)
	}
	h.start(func(o *Options) { o.Events = ev })
	eventually(t, wait, "grey deferred", func() bool {
		r, ok := h.rcpt(id, 2)
		if !ok || r.Status != queue.Deferred {
			return false
		}
		// Read after the recipient: stored in its transaction, so there.
		got := outboxKinds(t, h.q)
		if !has(got, "grey@ev.test deferred") || !has(got, "ok@ev.test delivered") || !has(got, "bad@ev.test bounced") {
			t.Errorf("outcomes stored, events not: %v", got)
		}
		return true
	})
	eventually(t, wait, "all final", func() bool { return h.gone(id) })
	want := "bad@ev.test accepted,bad@ev.test bounced,grey@ev.test accepted,grey@ev.test deferred,grey@ev.test delivered," +
		"ok@ev.test accepted,ok@ev.test delivered"
	if got := outboxKinds(t, h.q); strings.Join(got, ",") != want {
		t.Errorf("events %v, want %s", got, want)
	}
	for _, tx := range f.Transactions() {
		if strings.Contains(strings.ToLower(tx.Data), "x-greyrelay-tag") {
			t.Errorf("the tag header was sent:\n%s", tx.Data)
		}
	}
}

// TestEventsOperatorBounce: the operator's bounce is a bounced event,
// stored with the result it reports.
func TestEventsOperatorBounce(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h, ev := eventsHarness(t, false, func(c *config.Config) { c.Retry.InitialInterval, c.Retry.MaxInterval = time.Hour, time.Hour })
	h.dns.MX("full.test", 10, "mx.full.test").A("mx.full.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		return relaytest.Reply("452 4.2.2 mailbox full")
	}}})
	id := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test",
		Body: []byte("X-Greyrelay-Tag: app-1\r\n\r\nhi\r\n")}, "b@full.test")
	h.start(func(o *Options) { o.Events = ev })
	eventually(t, wait, "deferred", func() bool {
		r, _ := h.rcpt(id, 0)
		return r.Status == queue.Deferred
	})
	if _, err := h.eng.Bounce(queue.Selector{ID: id}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(outboxKinds(t, h.q), ","); got != "b@full.test accepted,b@full.test bounced,b@full.test deferred" {
		t.Errorf("events %s", got)
	}
}

// TestEventsDelayedAndExpired: a recipient that is never accepted gets a
// delayed event at the delay-warning step and an expired one (not
// bounced) when its lifetime runs out.
func TestEventsDelayedAndExpired(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h, ev := eventsHarness(t, false, func(c *config.Config) {
		c.Retry.Lifetime, c.Retry.DelayWarnings = 1500*time.Millisecond, []time.Duration{300 * time.Millisecond}
	})
	h.dns.MX("busy.test", 10, "mx.busy.test").A("mx.busy.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		return relaytest.Reply("451 4.3.0 temporary server failure")
	}}})
	id := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test",
		Body: []byte("X-Greyrelay-Tag: app-1\r\n\r\nhi\r\n")}, "w@busy.test")
	h.start(func(o *Options) { o.Events = ev })
	eventually(t, wait, "expired", func() bool { return h.gone(id) })
	count := map[string]int{}
	for _, k := range outboxKinds(t, h.q) {
		count[k]++
	}
	if count["w@busy.test accepted"] != 1 || count["w@busy.test delayed"] != 1 || count["w@busy.test expired"] != 1 ||
		count["w@busy.test deferred"] < 1 || count["w@busy.test bounced"] != 0 {
		t.Errorf("events %v, want one accepted, deferred ones, one delayed, one expired", count)
	}
}
