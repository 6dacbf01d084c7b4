package delivery

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dsn"
)

// TestOutcomeKinds: every kind of outcome (an attempt's deferral, failure
// and acceptance, an expiry without an attempt, the operator's bounce,
// hold, release and delete, the postponement of a throttled, suspended or
// unreachable destination's recipients) stores its result with exactly the
// event, DSN, counter and log line its kind makes, through the entry point
// that produces it in production.
func TestOutcomeKinds(t *testing.T) {
	t.Parallel()
	const rcpt = "r@kind.test"
	deferral := classifier.Verdict{Reason: classifier.ServerError, Stage: smtpvocab.StageRCPT,
		Code: 451, Enhanced: "4.3.0", Text: "try later"}
	refusal := classifier.Verdict{Outcome: classifier.Failed, Reason: classifier.NoSuchUser, Stage: smtpvocab.StageRCPT,
		Code: 550, Enhanced: "5.1.1", Text: "no such user"}
	unreachable := deadHost
	unreachable.v = classifier.Verdict{Reason: classifier.Connect, Stage: smtpvocab.StageConnect,
		Enhanced: "4.4.1", Text: "every address failed recently"}
	type env struct {
		h   *harness
		d   *dest
		r   queue.Recipient
		a   *attempt
		now time.Time
	}
	tests := []struct {
		name string
		late bool // now is past the message's lifetime
		run  func(t *testing.T, x env)
		// What the queue holds of the recipient afterwards.
		status        queue.Status
		reason, stage string
		// What was made of it: the event kind ("" none), the Deliveries
		// labels ("" none), the log line ("" none), the DSN action ("" none),
		// the OperatorActions label ("" none).
		event, counted, line string
		dsn                  dsn.Action
		operator             string
		// gone: the recipient is no longer in the queue.
		gone bool
	}{
		{name: "attempt deferred", run: func(t *testing.T, x env) {
			x.h.eng.settle(x.d, x.a, []outcome{{r: x.r, v: deferral}})
		}, status: queue.Deferred, reason: "server-error", stage: "rcpt",
			event: "deferred", counted: "deferred server-error", line: "delivery attempt"},
		{name: "attempt failed", run: func(t *testing.T, x env) {
			x.h.eng.settle(x.d, x.a, []outcome{{r: x.r, v: refusal}})
		}, status: queue.Failed, reason: "no-such-user", stage: "rcpt",
			event: "bounced", counted: "failed no-such-user", line: "delivery attempt", dsn: dsn.Failed},
		{name: "attempt accepted", run: func(t *testing.T, x env) {
			x.h.eng.settle(x.d, x.a, []outcome{{r: x.r, ok: true, reply: smtpvocab.Reply{Code: 250, Text: "ok"}}})
		}, status: queue.Delivered, stage: "end-of-data",
			event: "delivered", counted: "delivered none", line: "delivery attempt"},
		{name: "expired while throttled", late: true, run: func(t *testing.T, x env) {
			if err := x.h.eng.pushMessage(x.d, x.r.Key.ID, []queue.Recipient{x.r}, x.now.Add(time.Hour), x.now, throttled, x.h.eng.settle); err != nil {
				t.Fatal(err)
			}
		}, status: queue.Failed, reason: "rate-limited", stage: "dns",
			event: "expired", counted: "failed rate-limited", line: "delivery attempt; lifetime expired, giving up (4.4.7)", dsn: dsn.Failed},
		{name: "bounced by the operator", run: func(t *testing.T, x env) {
			if n, err := x.h.eng.Bounce(queue.Selector{Domain: "kind.test"}, x.now); n != 1 || err != nil {
				t.Fatalf("Bounce = %d, %v", n, err)
			}
		}, status: queue.Failed, reason: "operator", stage: "operator",
			event: "bounced", counted: "failed operator", line: "bounced by the operator", dsn: dsn.Failed},
		{name: "held by the operator", run: func(t *testing.T, x env) {
			if n, err := x.h.eng.Operate(queue.ReasonHeld, queue.Selector{Domain: "kind.test"}, x.now); n != 1 || err != nil {
				t.Fatalf("Operate(held) = %d, %v", n, err)
			}
		}, status: queue.Held, event: "held", line: "held by the operator", operator: "held"},
		{name: "released by the operator", run: func(t *testing.T, x env) {
			holdQuietly(t, x.h.q, x.now)
			if n, err := x.h.eng.Operate(queue.ReasonReleased, queue.Selector{Domain: "kind.test"}, x.now); n != 1 || err != nil {
				t.Fatalf("Operate(released) = %d, %v", n, err)
			}
		}, status: queue.Queued, reason: "released", event: "released", line: "released by the operator", operator: "released"},
		{name: "deleted by the operator", run: func(t *testing.T, x env) {
			if n, err := x.h.eng.Operate(queue.ReasonDeleted, queue.Selector{Domain: "kind.test"}, x.now); n != 1 || err != nil {
				t.Fatalf("Operate(deleted) = %d, %v", n, err)
			}
		}, gone: true, event: "deleted", line: "deleted by the operator", operator: "deleted"},
		{name: "a dry run reports nothing", run: func(t *testing.T, x env) {
			if n, err := x.h.eng.Operate(queue.ReasonDeleted, queue.Selector{Domain: "kind.test", DryRun: true}, x.now); n != 1 || err != nil {
				t.Fatalf("Operate(deleted, dry run) = %d, %v", n, err)
			}
		}, status: queue.Queued},
		{name: "postponed while throttled", run: func(t *testing.T, x env) {
			if err := x.h.eng.pushMessage(x.d, x.r.Key.ID, []queue.Recipient{x.r}, x.now.Add(time.Hour), x.now, throttled, x.h.eng.settle); err != nil {
				t.Fatal(err)
			}
		}, status: queue.Queued, stage: "throttled"},
		{name: "postponed while suspended", run: func(t *testing.T, x env) {
			if err := x.h.eng.pushMessage(x.d, x.r.Key.ID, []queue.Recipient{x.r}, x.now.Add(time.Hour), x.now, suspended, x.h.eng.settle); err != nil {
				t.Fatal(err)
			}
		}, status: queue.Queued, stage: "suspended", line: suspended.log},
		{name: "postponed after a deferral", run: func(t *testing.T, x env) {
			x.h.eng.settle(x.d, x.a, []outcome{{r: x.r, v: deferral}})
			r, _ := x.h.rcpt(x.r.Key.ID, 0)
			if err := x.h.eng.pushMessage(x.d, r.Key.ID, []queue.Recipient{r}, x.now.Add(time.Hour), x.now, throttled, x.h.eng.settle); err != nil {
				t.Fatal(err)
			}
		}, status: queue.Deferred, reason: "server-error", stage: "throttled", // only the attempt is told of
			event: "deferred", counted: "deferred server-error", line: "delivery attempt"},
		{name: "postponed, every address dead", run: func(t *testing.T, x env) {
			if err := x.h.eng.pushMessage(x.d, x.r.Key.ID, []queue.Recipient{x.r}, x.now.Add(time.Hour), x.now, unreachable, x.h.eng.settle); err != nil {
				t.Fatal(err)
			}
		}, status: queue.Queued, reason: "connect", stage: "dead-host", line: unreachable.log},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, ev := eventsHarness(t, false)
			// A second recipient keeps the message (and the first one's
			// history) in the queue after the first is final.
			id := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test",
				Body: []byte("X-Greyrelay-Tag: app-1\r\n\r\nhi\r\n")}, rcpt, "keep@other.test")
			msg, err := h.q.Message(id)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			if tc.late {
				now = msg.Arrival.Add(time.Hour + time.Minute) // baseYAML's lifetime is 1h
			}
			h.build(func(o *Options) { o.Events, o.Now = ev, func() time.Time { return now } })
			t.Cleanup(h.stop)
			t.Cleanup(h.eng.record()) // runs first: the recorder ends before the queue closes
			r, _ := h.rcpt(id, 0)
			if err := h.eng.loadDests([]queue.Recipient{r}); err != nil {
				t.Fatal(err)
			}
			body, err := h.q.Body(id)
			if err != nil {
				t.Fatal(err)
			}
			x := env{h: h, d: h.eng.dests["kind.test"], r: r, now: now,
				a: &attempt{msg: msg, body: body, start: now, none: true}}
			tc.run(t, x)
			var got queue.Recipient
			var there bool
			if tc.stage != "" {
				eventually(t, wait, "the outcome stored", func() bool {
					got, _ = h.rcpt(id, 0)
					return len(got.History) > 0
				})
			} else if got, there = h.rcpt(id, 0); there == tc.gone { // stored before the call returned
				t.Errorf("recipient in the queue: %v, want %v", there, !tc.gone)
			}
			var last queue.Attempt // the operator's actions and the postponements without stage write none
			if len(got.History) > 0 {
				last = got.History[len(got.History)-1]
			}
			if got.Status != tc.status || got.Reason != tc.reason || last.Stage != tc.stage {
				t.Errorf("stored %s, reason %q, stage %q; want %s, %q, %q", got.Status, got.Reason, last.Stage,
					tc.status, tc.reason, tc.stage)
			}
			var kinds []string
			for _, k := range outboxKinds(t, h.q) {
				if k, ok := strings.CutPrefix(k, rcpt+" "); ok && k != "accepted" {
					kinds = append(kinds, k)
				}
			}
			if want := []string{tc.event}; !slices.Equal(kinds, want) && !(tc.event == "" && len(kinds) == 0) {
				t.Errorf("events %v, want %q", kinds, tc.event)
			}
			switch n := testutil.CollectAndCount(h.m.Deliveries); {
			case tc.counted == "" && n != 0:
				t.Errorf("%d outcome counters, want none", n)
			case tc.counted != "" && (n != 1 || counter(h.m.Deliveries, strings.Fields(tc.counted)...) != 1):
				t.Errorf("outcome counters: %d series, %q = %v; want that one once", n, tc.counted,
					counter(h.m.Deliveries, strings.Fields(tc.counted)...))
			}
			switch n := testutil.CollectAndCount(h.m.OperatorActions); {
			case tc.operator == "" && n != 0:
				t.Errorf("%d operator counters, want none", n)
			case tc.operator != "" && (n != 1 || counter(h.m.OperatorActions, tc.operator) != 1):
				t.Errorf("operator counters: %d series, %s = %v; want that one once", n, tc.operator,
					counter(h.m.OperatorActions, tc.operator))
			}
			var lines []string
			for _, e := range h.logs.FilterField(zap.String("rcpt", rcpt)).All() {
				lines = append(lines, e.Message)
			}
			if want := []string{tc.line}; !slices.Equal(lines, want) && !(tc.line == "" && len(lines) == 0) {
				t.Errorf("log lines %q, want %q", lines, tc.line)
			}
			switch n := testutil.CollectAndCount(h.m.DSNs); {
			case tc.dsn == "" && n != 0:
				t.Errorf("%d DSN counters, want none", n)
			case tc.dsn != "" && (n != 1 || counter(h.m.DSNs, string(tc.dsn)) != 1):
				t.Errorf("DSN counters: %d series, %s = %v; want that one once", n, tc.dsn, counter(h.m.DSNs, string(tc.dsn)))
			}
		})
	}
}

// holdQuietly holds the recipients of kind.test in q with a result that
// carries no event, as a start for the release's case.
func holdQuietly(t *testing.T, q *queue.Queue, now time.Time) {
	t.Helper()
	quiet := func(_ string, _ *queue.Message, r queue.Recipient, _ []byte) queue.Result {
		return queue.Result{Key: r.Key, Reason: r.Reason}
	}
	if n, err := q.Operate(queue.ReasonHeld, queue.Selector{Domain: "kind.test"}, now, quiet); n != 1 || err != nil {
		t.Fatalf("hold = %d, %v", n, err)
	}
}
