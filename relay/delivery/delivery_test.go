package delivery

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/metrics"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

const wait = 5 * time.Second

// TestDeliver_OneTransactionPerDomain: a message for two domains goes out
// once per domain, each copy carrying exactly that domain's recipients,
// from the pinned source address.
func TestDeliver_OneTransactionPerDomain(t *testing.T) {
	t.Parallel()
	ip1, ip2 := relaytest.Loopback(t), relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("one.test", 10, "mx.one.test").A("mx.one.test", ip1)
	h.dns.MX("two.test", 10, "mx.two.test").A("mx.two.test", ip2)
	one := startMX(t, ip1, h.port, relaytest.MXOptions{})
	two := startMX(t, ip2, h.port, relaytest.MXOptions{})
	id := h.enqueue("alice@sender.test", "a@one.test", "b@two.test", "c@one.test")
	h.start()
	eventually(t, wait, "message delivered", func() bool { return h.gone(id) })

	for _, c := range []struct {
		mx   *relaytest.FakeMX
		want []string
	}{{one, []string{"a@one.test", "c@one.test"}}, {two, []string{"b@two.test"}}} {
		txs := c.mx.Transactions()
		if len(txs) != 1 || !txs[0].Delivered {
			t.Fatalf("%s: transactions %+v, want one delivered", c.mx.Addr(), txs)
		}
		if !slices.Equal(txs[0].Accepted, c.want) || txs[0].From != "alice@sender.test" {
			t.Errorf("%s: MAIL %q RCPT %v, want alice@sender.test %v", c.mx.Addr(), txs[0].From, txs[0].Accepted, c.want)
		}
		if got := c.mx.Connections(); !slices.Equal(got, []string{sourceIP}) {
			t.Errorf("%s: connections from %v, want one from %s", c.mx.Addr(), got, sourceIP)
		}
	}
	for _, rc := range []string{"a@one.test", "b@two.test", "c@one.test"} {
		outs := h.outcomes(rc)
		if len(outs) != 1 || outs[0]["outcome"] != "delivered" || outs[0]["source_ip"] != sourceIP {
			t.Errorf("%s: logged %v, want one delivered attempt from %s", rc, outs, sourceIP)
		}
	}
	if got := counter(h.m.Deliveries, "delivered", "none"); got != 3 {
		t.Errorf("Deliveries{delivered} = %v, want 3", got)
	}
}

// TestDeliver_MixedRecipientReplies: 250/450/550 in one transaction give
// three outcomes, and the DSN names only the failed recipient.
func TestDeliver_MixedRecipientReplies(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("mixed.test", 10, "mx.mixed.test").A("mx.mixed.test", ip)
	f := startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(n int, to string) error {
		switch {
		case strings.HasPrefix(to, "later@"):
			return relaytest.Reply("450 4.2.1 mailbox busy, try later")
		case strings.HasPrefix(to, "bad@"):
			return relaytest.Reply("550 5.1.1 no such user")
		}
		return nil
	}}})
	id := h.enqueue("alice@sender.test", "ok@mixed.test", "later@mixed.test", "bad@mixed.test")
	h.start()
	eventually(t, wait, "a DSN", func() bool { return len(h.dsns()) == 1 })

	txs := f.Delivered()
	if len(txs) == 0 || !slices.Equal(txs[0].Accepted, []string{"ok@mixed.test"}) {
		t.Fatalf("first transaction %+v, want only ok@ accepted", txs)
	}
	if r, _ := h.rcpt(id, 0); r.Status != queue.Delivered {
		t.Errorf("ok@ is %q, want delivered", r.Status)
	}
	if r, ok := h.rcpt(id, 1); !ok || (r.Status != queue.Deferred && r.Status != queue.Active) || r.Reply.Code != 450 {
		t.Errorf("later@: %+v, want deferred with the 450", r)
	}
	if r, ok := h.rcpt(id, 2); !ok || r.Status != queue.Failed || r.Reply.Code != 550 {
		t.Errorf("bad@: %+v, want failed with the 550", r)
	}
	d := h.dsns()[0]
	for _, want := range []string{"Final-Recipient: rfc822; bad@mixed.test", "Action: failed", "Status: 5.1.1",
		"Diagnostic-Code: smtp; 550 5.1.1 no such user", "Auto-Submitted: auto-replied"} {
		if !strings.Contains(d.Data, want) {
			t.Errorf("DSN lacks %q:\n%s", want, d.Data)
		}
	}
	if strings.Contains(d.Data, "ok@mixed.test") || strings.Contains(d.Data, "later@mixed.test") {
		t.Errorf("DSN names a recipient that did not fail:\n%s", d.Data)
	}
	if d.From != "" || !slices.Equal(d.Accepted, []string{"alice@sender.test"}) {
		t.Errorf("DSN envelope %q -> %v, want <> -> alice@sender.test", d.From, d.Accepted)
	}
	// The status page's per-minute charts count the same outcomes.
	recent := func(class int) int {
		n := 0
		for _, c := range h.m.Recent.Series(class, time.Now(), metrics.RecentMinutes) {
			n += c
		}
		return n
	}
	eventually(t, wait, "one of each outcome in the recent counts", func() bool {
		return recent(metrics.RecentDelivered) >= 1 && recent(metrics.RecentDeferred) >= 1 && recent(metrics.RecentBounced) == 1
	})
}

// TestDeliver_MXFallback: the first MX refuses the connection, the second
// takes the message; the refusing address goes on the dead-host list for
// retry.initial_interval.
func TestDeliver_MXFallback(t *testing.T) {
	t.Parallel()
	ip1, ip2 := relaytest.Loopback(t), relaytest.Loopback(t)
	// The mark lasts retry.initial_interval from the refusal, and settle
	// prunes marks that ran out before it stores the record with the
	// outcome: with baseYAML's 150 ms, a session with the second MX
	// slower than that on a loaded machine left DeadHosts empty.
	h := newHarness(t, func(c *config.Config) { c.Retry.InitialInterval, c.Retry.MaxInterval = time.Hour, time.Hour })
	h.dns.MX("fallback.test", 10, "mx1.fallback.test").A("mx1.fallback.test", ip1).
		MX("fallback.test", 20, "mx2.fallback.test").A("mx2.fallback.test", ip2)
	second := startMX(t, ip2, h.port, relaytest.MXOptions{})
	id := h.enqueue("alice@sender.test", "x@fallback.test")
	start := time.Now()
	h.start()
	eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	if n := len(second.Delivered()); n != 1 {
		t.Fatalf("second MX got %d messages, want 1", n)
	}
	outs := h.outcomes("x@fallback.test")
	if len(outs) != 1 || outs[0]["mx"] != "mx2.fallback.test" || outs[0]["mx_addr"] != ip2 {
		t.Errorf("logged %v, want one attempt ending at mx2", outs)
	}
	dst, ok, err := h.q.Destination("fallback.test")
	if err != nil || !ok {
		t.Fatalf("destination: %v %v", ok, err)
	}
	if until, dead := dst.DeadHosts[ip1]; !dead || until.Before(start.Add(h.cfg.Retry.InitialInterval)) ||
		until.After(time.Now().Add(h.cfg.Retry.InitialInterval)) {
		t.Errorf("DeadHosts = %v, want %s until retry.initial_interval (%v) after the refusal", dst.DeadHosts, ip1, h.cfg.Retry.InitialInterval)
	}
}

// TestDeliver_DNSOutcomes: NXDOMAIN and null MX fail with a DSN naming the
// RFC 3463 status; SERVFAIL defers.
func TestDeliver_DNSOutcomes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, domain string
		setup        func(h *harness)
		status       string // DSN status; "" means deferred, no DSN
	}{
		{"nxdomain", "nx.test", func(h *harness) { h.dns.NXDomain("nx.test") }, "5.1.2"},
		{"null-mx", "null.test", func(h *harness) { h.dns.NullMX("null.test") }, "5.1.10"},
		{"servfail", "sf.test", func(h *harness) { h.dns.ServFail("sf.test") }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			c.setup(h)
			rcpt := "u@" + c.domain
			id := h.enqueue("alice@sender.test", rcpt)
			h.start()
			if c.status == "" {
				eventually(t, wait, "a deferral", func() bool { return len(h.outcomes(rcpt)) > 0 })
				r, ok := h.rcpt(id, 0)
				if !ok || r.Reason != "dns" || (r.Status != queue.Deferred && r.Status != queue.Active) {
					t.Errorf("recipient %+v, want deferred for dns", r)
				}
				// The deferral is stored, so a DSN about it would be queued.
				if n, dsns := h.queued(), len(h.dsns()); n != 1 || dsns != 0 {
					t.Errorf("%d messages queued (want 1, no DSN), %d DSNs delivered for a temporary DNS failure", n, dsns)
				}
				return
			}
			eventually(t, wait, "a DSN", func() bool { return len(h.dsns()) == 1 })
			if !h.gone(id) {
				t.Error("message still queued after a permanent DNS failure")
			}
			if d := h.dsns()[0].Data; !strings.Contains(d, "Status: "+c.status) || !strings.Contains(d, rcpt) {
				t.Errorf("DSN lacks status %s or %s:\n%s", c.status, rcpt, d)
			}
		})
	}
}

// TestDeliver_ConnectionReuse: two messages for one domain share one
// connection (no RSET between: the first transaction completed).
func TestDeliver_ConnectionReuse(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("reuse.test", 10, "mx.reuse.test").A("mx.reuse.test", ip)
	f := startMX(t, ip, h.port, relaytest.MXOptions{})
	a := h.enqueue("alice@sender.test", "a@reuse.test")
	b := h.enqueue("bob@sender.test", "b@reuse.test")
	h.start()
	eventually(t, wait, "both delivered", func() bool { return h.gone(a) && h.gone(b) })
	if n := len(f.Delivered()); n != 2 {
		t.Fatalf("%d messages delivered, want 2", n)
	}
	if c := f.Connections(); len(c) != 1 {
		t.Errorf("%d connections, want 1", len(c))
	}
}

// TestDeliver_TooManyRecipients: a peer that takes two RCPTs per
// transaction and answers 452 4.5.3 to the rest gets the rest in
// follow-up transactions right away (RFC 5321 §4.5.3.1.10).
func TestDeliver_TooManyRecipients(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("many.test", 10, "mx.many.test").A("mx.many.test", ip)
	var f *relaytest.FakeMX
	f = startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(n int, to string) error {
		if len(f.Transactions()[n].Accepted) >= 2 {
			return relaytest.Reply("452 4.5.3 too many recipients")
		}
		return nil
	}}})
	to := []string{"a@many.test", "b@many.test", "c@many.test", "d@many.test", "e@many.test"}
	id := h.enqueue("alice@sender.test", to...)
	start := time.Now()
	h.start()
	eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	if el := time.Since(start); el >= h.cfg.Retry.InitialInterval*3 {
		t.Logf("took %v; follow-ups should not wait for the backoff", el)
	}
	var got []string
	for _, tx := range f.Delivered() {
		got = append(got, tx.Accepted...)
	}
	if !slices.Equal(got, to) || len(f.Delivered()) != 3 || len(f.Connections()) != 1 {
		t.Errorf("delivered %v in %d transactions on %d connections, want %v in 3 on 1",
			got, len(f.Delivered()), len(f.Connections()), to)
	}
	for _, rc := range to {
		if outs := h.outcomes(rc); len(outs) != 1 || outs[0]["outcome"] != "delivered" {
			t.Errorf("%s: %v, want delivered at the first attempt", rc, outs)
		}
	}
}

// TestDeliver_NullSenderAndNotifyNever: no DSN about a bounce (RFC 5321
// §6.1) and none when NOTIFY=NEVER.
func TestDeliver_NoDSN(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("rej.test", 10, "mx.rej.test").A("mx.rej.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		return relaytest.Reply("550 5.1.1 no such user")
	}}})
	never := h.enqueue("alice@sender.test", "x@rej.test|NEVER")
	bounce := h.enqueue("", "y@rej.test")
	dsnMsg := h.enqueueMsg(queue.NewMessage{From: "", DSN: true}, "z@rej.test")
	h.start()
	eventually(t, wait, "all failed", func() bool { return h.gone(never) && h.gone(bounce) && h.gone(dsnMsg) })
	// Every outcome is stored, so a DSN about one would be queued.
	if n, dsns := h.queued(), len(h.dsns()); n != 0 || dsns != 0 {
		t.Errorf("%d messages queued, %d DSNs delivered, want none", n, dsns)
	}
	for _, rc := range []string{"x@rej.test", "y@rej.test", "z@rej.test"} {
		if outs := h.outcomes(rc); len(outs) != 1 || outs[0]["outcome"] != "failed" {
			t.Errorf("%s: %v, want one failed attempt", rc, outs)
		}
	}
}

// TestDeliver_RelayedDSN: NOTIFY=SUCCESS to a peer without DSN gets a
// "relayed" DSN; to a peer with DSN, the parameter is passed on instead.
func TestDeliver_RelayedDSN(t *testing.T) {
	t.Parallel()
	ip1, ip2 := relaytest.Loopback(t), relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("plain.test", 10, "mx.plain.test").A("mx.plain.test", ip1).
		MX("dsn.test", 10, "mx.dsn.test").A("mx.dsn.test", ip2)
	startMX(t, ip1, h.port, relaytest.MXOptions{})
	withDSN := startMX(t, ip2, h.port, relaytest.MXOptions{DSN: true})
	a := h.enqueue("alice@sender.test", "a@plain.test|SUCCESS,FAILURE")
	b := h.enqueue("alice@sender.test", "b@dsn.test|SUCCESS")
	h.start()
	eventually(t, wait, "delivered", func() bool { return h.gone(a) && h.gone(b) })
	eventually(t, wait, "a relayed DSN", func() bool { return len(h.dsns()) == 1 })
	eventually(t, wait, "every DSN delivered", h.drained)
	ds := h.dsns()
	if len(ds) != 1 || !strings.Contains(ds[0].Data, "Action: relayed") || !strings.Contains(ds[0].Data, "a@plain.test") {
		t.Fatalf("DSNs %v, want one relayed DSN for a@plain.test", ds)
	}
	if tx := withDSN.Delivered(); len(tx) != 1 || !slices.Equal(tx[0].Notify, []string{"SUCCESS"}) {
		t.Errorf("DSN peer saw %+v, want NOTIFY=SUCCESS passed on", tx)
	}
}

// TestDeliver_DSNCapPerSender: dsn.max_per_sender_per_hour caps the
// bounces one sender gets; the rest are dropped and counted.
func TestDeliver_DSNCapPerSender(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.DSN.MaxPerSenderPerHour = 1 })
	h.dns.MX("cap.test", 10, "mx.cap.test").A("mx.cap.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		return relaytest.Reply("550 5.1.1 no such user")
	}}})
	a := h.enqueue("alice@sender.test", "a@cap.test")
	b := h.enqueue("alice@sender.test", "b@cap.test")
	h.start()
	eventually(t, wait, "both failed", func() bool { return h.gone(a) && h.gone(b) })
	eventually(t, wait, "one DSN", func() bool { return len(h.dsns()) == 1 })
	eventually(t, wait, "every DSN delivered", h.drained)
	if n := len(h.dsns()); n != 1 {
		t.Errorf("%d DSNs, want 1", n)
	}
	if n := testutil.ToFloat64(h.m.DSNsSuppressed); n != 1 {
		t.Errorf("DSNsSuppressed = %v, want 1", n)
	}
}

func TestNotifies(t *testing.T) {
	for _, c := range []struct {
		notify, what string
		want         bool
	}{
		{"", notifyFailure, true}, {"", notifyDelay, true}, {"", notifySuccess, false},
		{"NEVER", notifyFailure, false}, {"NEVER", notifyDelay, false},
		{"SUCCESS", notifySuccess, true}, {"SUCCESS", notifyFailure, false},
		{"success, failure", notifyFailure, true}, {"FAILURE", notifyDelay, false},
		{"DELAY,FAILURE", notifyDelay, true},
	} {
		if got := notifies(c.notify, c.what); got != c.want {
			t.Errorf("notifies(%q, %s) = %v, want %v", c.notify, c.what, got, c.want)
		}
	}
}

func TestTooManyRecipients(t *testing.T) {
	for _, c := range []struct {
		code     int
		enhanced string
		want     bool
	}{
		{452, "4.5.3", true}, {452, "", true}, {552, "5.5.3", true}, {552, "", true},
		{452, "4.2.2", false}, {451, "4.5.3", false}, {550, "5.5.3", false},
	} {
		if got := tooManyRecipients(smtpvocab.Reply{Code: c.code, Enhanced: c.enhanced}); got != c.want {
			t.Errorf("tooManyRecipients(%d %s) = %v, want %v", c.code, c.enhanced, got, c.want)
		}
	}
}
