package delivery

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dsn"
)

// TestOperatorInFlight: the operator's hold or delete of a recipient whose
// attempt is in flight (Active, Begun) takes effect at once, and the
// attempt still ends as it ends: a held recipient records the attempt's
// deferral in the attempt's own history entry and stays Held; a
// deleted one stays gone, its outcome's result and event not stored. The
// attempt's log line and counter tell what happened on the wire either
// way, and so does the failure's DSN: the deletion itself sends none.
func TestOperatorInFlight(t *testing.T) {
	t.Parallel()
	const rcpt = "r@kind.test"
	deferral := classifier.Verdict{Reason: classifier.ServerError, Stage: smtpvocab.StageRCPT,
		Code: 451, Enhanced: "4.3.0", Text: "try later"}
	refusal := classifier.Verdict{Outcome: classifier.Failed, Reason: classifier.NoSuchUser, Stage: smtpvocab.StageRCPT,
		Code: 550, Enhanced: "5.1.1", Text: "no such user"}
	tests := []struct {
		action string
		v      classifier.Verdict
		events []string // of rcpt, in order
		dsns   float64  // failure DSNs counted
	}{
		{action: queue.ReasonHeld, v: deferral, events: []string{"deferred", "held"}},
		{action: queue.ReasonDeleted, v: refusal, events: []string{"deleted"}, dsns: 1},
	}
	for _, tc := range tests {
		t.Run(tc.action, func(t *testing.T) {
			t.Parallel()
			h, ev := eventsHarness(t, false)
			id := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test",
				Body: []byte("X-Greyrelay-Tag: app-1\r\n\r\nhi\r\n")}, rcpt, "keep@other.test")
			msg, err := h.q.Message(id)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			h.build(func(o *Options) { o.Events, o.Now = ev, func() time.Time { return now } })
			t.Cleanup(h.stop)
			t.Cleanup(h.eng.record())
			r, _ := h.rcpt(id, 0)
			if err := h.eng.loadDests([]queue.Recipient{r}); err != nil {
				t.Fatal(err)
			}
			if err := h.q.Begin(queue.Start{Keys: []queue.Key{r.Key}, Time: now, MXHost: "mx.kind.test",
				LeaseUntil: now.Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			if n, err := h.eng.Operate(tc.action, queue.Selector{Domain: "kind.test"}, now); n != 1 || err != nil {
				t.Fatalf("Operate(%s) of an Active recipient = %d, %v", tc.action, n, err)
			}
			body, err := h.q.Body(id)
			if err != nil {
				t.Fatal(err)
			}
			// none: settle waits for the commit to be decided.
			a := &attempt{msg: msg, body: body, start: now, none: true}
			h.eng.settle(h.eng.dests["kind.test"], a, []outcome{{r: r, v: tc.v}})

			got, there := h.rcpt(id, 0)
			switch tc.action {
			case queue.ReasonHeld:
				if !there || got.Status != queue.Held || got.Reason != "server-error" || len(got.History) != 1 ||
					got.History[0].Outcome != string(queue.Deferred) || got.History[0].Stage != "rcpt" {
					t.Errorf("held in flight, then deferred: %v %s %q, history %+v", there, got.Status, got.Reason, got.History)
				}
			case queue.ReasonDeleted:
				if there {
					t.Errorf("deleted in flight, then failed: still there, %+v", got)
				}
			}
			var kinds []string
			for _, k := range outboxKinds(t, h.q) {
				if k, ok := strings.CutPrefix(k, rcpt+" "); ok && k != "accepted" {
					kinds = append(kinds, k)
				}
			}
			if !slices.Equal(kinds, tc.events) {
				t.Errorf("events %q, want %q", kinds, tc.events)
			}
			if n := counter(h.m.OperatorActions, tc.action); n != 1 {
				t.Errorf("operator counter %s = %v, want 1", tc.action, n)
			}
			if n := counter(h.m.Deliveries, string(outcomeOf(tc.v)), string(tc.v.Reason)); n != 1 {
				t.Errorf("the attempt counted %v times, want once", n)
			}
			if n := counter(h.m.DSNs, string(dsn.Failed)); n != tc.dsns {
				t.Errorf("failure DSNs %v, want %v", n, tc.dsns)
			}
		})
	}
}

// outcomeOf is the Deliveries label of a verdict's outcome.
func outcomeOf(v classifier.Verdict) queue.Status {
	if v.Outcome == classifier.Failed {
		return queue.Failed
	}
	return queue.Deferred
}

// TestRequeueReleasesAsAnOutcome: a requeue releases a held recipient as
// Operate does, through the same outcome: its event, log line and counter,
// once.
func TestRequeueReleasesAsAnOutcome(t *testing.T) {
	t.Parallel()
	const rcpt = "r@kind.test"
	h, ev := eventsHarness(t, false)
	h.enqueueMsg(queue.NewMessage{From: "alice@sender.test",
		Body: []byte("X-Greyrelay-Tag: app-1\r\n\r\nhi\r\n")}, rcpt)
	now := time.Now()
	holdQuietly(t, h.q, now)
	h.start(func(o *Options) { o.Events = ev })
	if n, err := h.eng.Requeue(queue.Selector{Domain: "kind.test"}, now); n != 1 || err != nil {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	kinds := outboxKinds(t, h.q) // the attempt that follows may add its own
	if n := len(slices.DeleteFunc(kinds, func(k string) bool { return k != rcpt+" released" })); n != 1 {
		t.Errorf("%d released events, want 1", n)
	}
	if n := counter(h.m.OperatorActions, queue.ReasonReleased); n != 1 {
		t.Errorf("operator counter released = %v, want 1", n)
	}
	if n := h.logs.FilterMessage("released by the operator").FilterField(zap.String("rcpt", rcpt)).Len(); n != 1 {
		t.Errorf("%d released lines, want 1", n)
	}
}
