package delivery

import (
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestGreylisting: the first attempt is greylisted; the retry comes after
// retry.greylist_first_retry, from the same source address, to the same
// MX, although the preferred MX is back up by then; it is accepted and the
// destination learns the delay.
func TestGreylisting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		reply error
	}{
		{"rspamd-451-4.7.1", relaytest.Reply("451 4.7.1 Greylisted, please try again later")},
		{"postgrey-450-4.2.0", relaytest.Reply("450 4.2.0 <g@grey.test>: Recipient address rejected: Greylisted, see http://postgrey.schweikert.ch/help/grey.test.html")},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			mx1, mx2 := relaytest.Loopback(t), relaytest.Loopback(t)
			h.dns.MX("grey.test", 10, "mx1.grey.test").A("mx1.grey.test", mx1).
				MX("grey.test", 20, "mx2.grey.test").A("mx2.grey.test", mx2)
			second := startMX(t, mx2, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(n int, _ string) error {
				if n == 0 {
					return c.reply
				}
				return nil
			}}})
			id := h.enqueue("alice@sender.test", "g@grey.test")
			h.start()
			eventually(t, wait, "greylisted once", func() bool { return len(h.outcomes("g@grey.test")) == 1 })
			r, _ := h.rcpt(id, 0)
			if r.Reason != "greylisted" || r.GreylistTries != 1 || r.FirstGreylisted.IsZero() || r.MXAddr != mx2 {
				t.Fatalf("after greylisting: %+v", r)
			}
			// The preferred MX comes back; the greylisted triplet lives at mx2.
			first := startMX(t, mx1, h.port, relaytest.MXOptions{})
			eventually(t, wait, "delivered", func() bool { return h.gone(id) })

			txs := second.Transactions()
			if len(txs) != 2 || !txs[1].Delivered || len(first.Transactions()) != 0 {
				t.Fatalf("mx2 saw %d transactions, mx1 %d; want the retry at mx2", len(txs), len(first.Transactions()))
			}
			if gap := txs[1].At.Sub(txs[0].At); gap < h.cfg.Retry.GreylistFirstRetry {
				t.Errorf("retry after %v, want at least greylist_first_retry %v", gap, h.cfg.Retry.GreylistFirstRetry)
			}
			if txs[0].Client != sourceIP || txs[1].Client != sourceIP {
				t.Errorf("clients %s, %s; want both %s", txs[0].Client, txs[1].Client, sourceIP)
			}
			dst, _, _ := h.q.Destination("grey.test")
			if !dst.Greylists || dst.GreylistSeen != 1 || dst.GreylistPassed != 1 || dst.LearnedDelay < h.cfg.Retry.GreylistFirstRetry {
				t.Errorf("destination %+v, want greylisting learned (delay >= %v)", dst, h.cfg.Retry.GreylistFirstRetry)
			}
			var m dto.Metric
			if err := h.m.GreylistPass.Write(&m); err != nil || m.GetHistogram().GetSampleCount() != 1 {
				t.Errorf("GreylistPass samples = %d, want 1", m.GetHistogram().GetSampleCount())
			}
		})
	}
}

// TestRateLimited: 451 4.7.28 throttles the whole destination: concurrency
// 1 and a learned pace instead of a pause. Transactions after the refusal
// start one pace interval apart (the refused recipient comes back in line
// one interval later, not after retry.initial_interval), and accepted
// messages relax the throttle and speed the pace up.
func TestRateLimited(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.Retry.InitialInterval, c.Retry.MaxInterval = time.Hour, time.Hour })
	// Finished messages keep their attempts (with the start the pace let
	// each take) for Show.
	h.q.Close()
	h.qopt.History = queue.HistoryOptions{Retention: time.Hour}
	h.openQueue()
	h.dns.MX("rl.test", 10, "mx.rl.test").A("mx.rl.test", ip)
	f := startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(n int, _ string) error {
		if n == 0 {
			return relaytest.Reply("451 4.7.28 mail flood detected, slow down")
		}
		return nil
	}}})
	a := h.enqueue("alice@sender.test", "a@rl.test")
	h.start()
	eventually(t, wait, "rate-limited once", func() bool { return len(h.outcomes("a@rl.test")) == 1 })
	dst, _, _ := h.q.Destination("rl.test")
	if dst.ThrottleLevel != 1 || !dst.ThrottledUntil.IsZero() || dst.PaceInterval <= 0 {
		t.Fatalf("destination %+v, want throttled (level 1), paced, not paused", dst)
	}
	interval := dst.PaceInterval
	refused := backoff.Pace{Interval: dst.PaceInterval, Base: dst.PaceBase, Refusals: dst.PaceRefusals, Run: dst.PaceRun, RunStart: dst.PaceRunStart}
	if r, _ := h.rcpt(a, 0); r.Reason != "rate-limited" || r.NextAttempt.After(time.Now().Add(interval)) {
		t.Errorf("a: reason %q next attempt %v, want rate-limited, back within the pace interval %v", r.Reason, r.NextAttempt, interval)
	}
	b := h.enqueue("alice@sender.test", "b@rl.test")
	c := h.enqueue("alice@sender.test", "c@rl.test")
	eventually(t, 3*wait, "all delivered", func() bool { return h.gone(a) && h.gone(b) && h.gone(c) })
	if txs := f.Transactions(); len(txs) != 4 {
		t.Fatalf("%d transactions, want 4 (a refused, then a, b, c)", len(txs))
	}
	// Each attempt starts once the pace lets it: the previous start plus
	// the interval then learned, which slow start shortens by 10% per
	// accepted message (backoff.Pace). The starts are the engine's own
	// (stored with each attempt): the MX's arrival times would add the
	// first connection's dial, greeting and EHLO to the first gap, and
	// load to any. A quarter of each gap is left for a start that woke
	// late, which shortens the next gap.
	var starts []time.Time
	for _, id := range []queue.ID{a, b, c} {
		m, err := h.q.Show(id)
		if err != nil {
			t.Fatalf("show %s: %v", id, err)
		}
		for _, at := range m.Recipients[0].History {
			starts = append(starts, at.Start)
		}
	}
	slices.SortFunc(starts, time.Time.Compare)
	if len(starts) != 4 {
		t.Fatalf("%d attempts stored, want 4", len(starts))
	}
	p := refused
	for i := 1; i < len(starts); i++ {
		want := p.Start(starts[i-1], starts[i-1]).Sub(starts[i-1])
		if gap := starts[i].Sub(starts[i-1]); gap < want*3/4 {
			t.Errorf("attempt %d started %v after the previous one, want the pace's %v", i+1, gap, want)
		}
		p = p.OnAccepted(starts[i])
	}
	dst, _, _ = h.q.Destination("rl.test")
	if dst.ThrottleLevel != 0 || dst.PaceInterval >= interval {
		t.Errorf("after three acceptances: throttle level %d, pace %v; want 0 and faster than %v", dst.ThrottleLevel, dst.PaceInterval, interval)
	}
}

// TestLifetimeExpiry: a recipient deferred past retry.lifetime fails with
// exactly one DSN, status 4.4.7, quoting the last reply.
func TestLifetimeExpiry(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.Retry.Lifetime = 700 * time.Millisecond })
	h.dns.MX("slowgrey.test", 10, "mx.slowgrey.test").A("mx.slowgrey.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		return relaytest.Reply("451 4.7.1 Greylisted, please try again later")
	}}})
	id := h.enqueue("alice@sender.test", "x@slowgrey.test")
	h.start()
	eventually(t, wait, "expired", func() bool { return h.gone(id) })
	eventually(t, wait, "the DSN", func() bool { return len(h.dsns()) == 1 })
	eventually(t, wait, "every DSN delivered", h.drained)
	ds := h.dsns()
	if len(ds) != 1 {
		t.Fatalf("%d DSNs, want exactly 1", len(ds))
	}
	for _, want := range []string{"Action: failed", "Status: 4.4.7", "Diagnostic-Code: smtp; 451 4.7.1 Greylisted"} {
		if !strings.Contains(ds[0].Data, want) {
			t.Errorf("DSN lacks %q:\n%s", want, ds[0].Data)
		}
	}
	// The text says the relay gave up: neither a "permanent error" nor
	// the class 4 promise to keep retrying.
	text := strings.Join(strings.Fields(strings.ReplaceAll(ds[0].Data, "=\r\n", "")), " ")
	for _, bad := range []string{"permanent error", "keeps retrying"} {
		if strings.Contains(text, bad) {
			t.Errorf("expiry DSN says %q:\n%s", bad, ds[0].Data)
		}
	}
	if !strings.Contains(text, "greyrelay gave up") || !strings.Contains(text, "time in the queue ran out") {
		t.Errorf("expiry DSN does not say the relay gave up:\n%s", ds[0].Data)
	}
	outs := h.outcomes("x@slowgrey.test")
	if last := outs[len(outs)-1]; last["outcome"] != "failed" || last["reason"] != "greylisted" {
		t.Errorf("last attempt %v, want failed, reason greylisted", last)
	}
}

// TestDelayWarning: a delay DSN goes out once the message has waited
// retry.delay_warnings[0], once, and the recipient keeps being retried.
func TestDelayWarning(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.Retry.DelayWarnings = []time.Duration{250 * time.Millisecond} })
	h.dns.MX("busy.test", 10, "mx.busy.test").A("mx.busy.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		return relaytest.Reply("451 4.3.0 temporary server failure")
	}}})
	id := h.enqueue("alice@sender.test", "w@busy.test")
	h.start()
	eventually(t, wait, "a delay DSN", func() bool { return len(h.dsns()) == 1 })
	eventually(t, wait, "two more attempts", func() bool {
		n := len(h.outcomes("w@busy.test"))
		return n >= 5
	})
	ds := h.dsns()
	if len(ds) != 1 || !strings.Contains(ds[0].Data, "Action: delayed") || !strings.Contains(ds[0].Data, "Will-Retry-Until:") {
		t.Fatalf("DSNs %d, want one delayed DSN; first:\n%v", len(ds), ds)
	}
	if r, ok := h.rcpt(id, 0); !ok || r.DelayWarnings != 1 {
		t.Errorf("recipient %+v, want still queued with DelayWarnings 1", r)
	}
}

// TestCrashRecovery: an attempt recorded (Begin) but never finished, as
// after a crash, is made again after Recover, and delivered once.
func TestCrashRecovery(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("crash.test", 10, "mx.crash.test").A("mx.crash.test", ip)
	f := startMX(t, ip, h.port, relaytest.MXOptions{})
	id := h.enqueue("alice@sender.test", "c@crash.test")
	now := time.Now()
	err := h.q.Begin(queue.Start{Keys: []queue.Key{{ID: id, Rcpt: 0}}, Time: now, SourceIP: sourceIP,
		MXHost: "mx.crash.test", MXAddr: ip, LeaseUntil: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	h.q.Close() // the crash
	h.openQueue()
	h.start()
	eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	// Run returns once every attempt it started has ended (and logged its
	// outcome), so nothing can reach the MX after this.
	h.stop()
	if n := len(f.Delivered()); n != 1 {
		t.Errorf("delivered %d times, want once", n)
	}
	if outs := h.outcomes("c@crash.test"); len(outs) != 1 || outs[0]["attempt"] != int64(2) {
		t.Errorf("logged %v, want one attempt, the second recorded", outs)
	}
}

// TestBounce: the operator's bounce fails a deferred recipient at once,
// with a 5.0.0 DSN.
func TestBounce(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.Retry.InitialInterval, c.Retry.MaxInterval = time.Hour, time.Hour })
	h.dns.MX("later.test", 10, "mx.later.test").A("mx.later.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Rcpt: func(int, string) error {
		return relaytest.Reply("452 4.2.2 mailbox full")
	}}})
	id := h.enqueue("alice@sender.test", "b@later.test")
	h.start()
	eventually(t, wait, "deferred", func() bool {
		r, _ := h.rcpt(id, 0)
		return r.Status == queue.Deferred
	})
	n, err := h.eng.Bounce(queue.Selector{ID: id}, time.Now())
	if err != nil || n != 1 {
		t.Fatalf("Bounce = %d, %v; want 1", n, err)
	}
	eventually(t, wait, "the DSN", func() bool { return len(h.dsns()) == 1 })
	if d := h.dsns()[0].Data; !strings.Contains(d, "Status: "+BounceStatus) || !strings.Contains(d, "b@later.test") {
		t.Errorf("DSN:\n%s", d)
	}
	if !h.gone(id) {
		t.Error("bounced message still queued")
	}
}
