package events

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// decodeAll decodes records, checking they all carry one event's JSON
// per sink in order.
func decodeAll(t *testing.T, recs []queue.Event) (sinks []string, evs []Event) {
	t.Helper()
	for _, r := range recs {
		ts, js, ok := decodeRecord(r.Data)
		if !ok {
			t.Fatalf("record %q does not decode", r.Data)
		}
		var e Event
		if err := json.Unmarshal(js, &e); err != nil {
			t.Fatal(err)
		}
		if !ts.Equal(e.Time) {
			t.Errorf("record time %v, event time %v", ts, e.Time)
		}
		sinks, evs = append(sinks, r.Sink), append(evs, e)
	}
	return sinks, evs
}

func TestOutcomeEvents(t *testing.T) {
	ev := New(Options{Webhooks: []Webhook{{URL: "http://a.test/", Secret: []byte("s")}}, Node: "node-a"})
	msg := queue.Message{ID: 42, From: "app@x.test", EnvID: "env-9", Size: 100}
	head := []byte("Message-ID: <m@x>\r\n\r\n")
	rcpt := queue.Recipient{Key: queue.Key{ID: 42}, Addr: "r@y.test", ORCPT: "rfc822;r@y.test", Attempts: 2, DelayWarnings: 0}
	end := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	reply := queue.Reply{Code: 451, Enhanced: "4.7.1", Text: "greylisted"}
	tests := []struct {
		name    string
		msg     queue.Message
		res     queue.Result
		status  string
		expired bool
		want    []Kind
		check   func(t *testing.T, evs []Event)
	}{
		{name: "delivered", res: queue.Result{Status: queue.Delivered, Reply: queue.Reply{Code: 250, Text: "ok"}, MXHost: "mx.y.test"},
			want: []Kind{Delivered}, check: func(t *testing.T, evs []Event) {
				if evs[0].Reason != "" || evs[0].MX != "mx.y.test" || evs[0].Reply.Code != 250 {
					t.Errorf("%+v", evs[0])
				}
			}},
		{name: "relayed", res: queue.Result{Status: queue.Relayed}, want: []Kind{Relayed}},
		{name: "deferred", res: queue.Result{Status: queue.Deferred, Reason: "greylisted", Reply: reply, NextAttempt: end.Add(5 * time.Minute)},
			want: []Kind{Deferred}, check: func(t *testing.T, evs []Event) {
				e := evs[0]
				if e.NextAttempt == nil || !e.NextAttempt.Equal(end.Add(5*time.Minute)) || e.Explanation == "" || e.Reason != "greylisted" || e.Attempt != 3 {
					t.Errorf("%+v", e)
				}
			}},
		{name: "deferred past a delay warning", res: queue.Result{Status: queue.Deferred, Reason: "greylisted", Reply: reply, DelayWarnings: 1},
			want: []Kind{Deferred, Delayed}, check: func(t *testing.T, evs []Event) {
				if evs[0].ID == evs[1].ID {
					t.Error("deferred and delayed share an ID")
				}
			}},
		{name: "bounced", res: queue.Result{Status: queue.Failed, Reason: "no-such-user", MXHost: "mx.y.test",
			Reply: queue.Reply{Code: 550, Enhanced: "5.1.1", Text: "no such user"}}, status: "5.1.1",
			want: []Kind{Bounced}, check: func(t *testing.T, evs []Event) {
				want := DSN{Action: "failed", Status: "5.1.1", DiagnosticCode: "smtp; 550 5.1.1 no such user", RemoteMTA: "dns; mx.y.test"}
				if evs[0].DSN == nil || *evs[0].DSN != want || evs[0].Explanation == "" {
					t.Errorf("%+v %+v", evs[0], evs[0].DSN)
				}
			}},
		{name: "expired", res: queue.Result{Status: queue.Failed, Reason: "greylisted", Reply: reply}, status: "4.4.7", expired: true,
			want: []Kind{Expired}, check: func(t *testing.T, evs []Event) {
				if evs[0].DSN == nil || evs[0].DSN.Status != "4.4.7" {
					t.Errorf("%+v", evs[0])
				}
			}},
		{name: "the relay's own DSN", msg: queue.Message{ID: 43, DSN: true}, res: queue.Result{Status: queue.Delivered}},
		{name: "queued again (no outcome)", res: queue.Result{Status: queue.Queued}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := msg
			if tt.msg.ID != 0 {
				m = tt.msg
			}
			tt.res.End = end
			_, evs := decodeAll(t, ev.Outcome(Outcome{Msg: m, Head: head, Rcpt: rcpt, Result: tt.res, Attempt: 3,
				Status: tt.status, Expired: tt.expired}))
			var kinds []Kind
			for _, e := range evs {
				kinds = append(kinds, e.Event)
				if e.QueueID != "000000000000002a" || e.Node != "node-a" || e.MessageID != "<m@x>" || e.Tag != "env-9" || e.Rcpt != "r@y.test" ||
					e.ORCPT != "rfc822;r@y.test" || e.From != "app@x.test" || len(e.ID) != 32 || !e.Time.Equal(end) {
					t.Errorf("common fields: %+v", e)
				}
			}
			if strings.Join(kindNames(kinds), ",") != strings.Join(kindNames(tt.want), ",") {
				t.Fatalf("kinds %v, want %v", kinds, tt.want)
			}
			if tt.check != nil {
				tt.check(t, evs)
			}
		})
	}
}

func kindNames(ks []Kind) []string {
	var out []string
	for _, k := range ks {
		out = append(out, string(k))
	}
	return out
}

// Accepted events: one per recipient, naming the node; the tag header
// wins over ENVID; a webhook gets only the kinds it asked for, the file
// every kind.
func TestAcceptEvents(t *testing.T) {
	ev := New(Options{Webhooks: []Webhook{{URL: "http://a.test/x?token=secret", Secret: []byte("s"), Kinds: []Kind{Bounced}},
		{URL: "http://b.test/", Secret: []byte("s")}}, File: "/nonexistent/events.jsonl", Node: "node-a"})
	m := queue.NewMessage{From: "app@x.test", EnvID: "env-1", Arrival: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Body: []byte("X-Greyrelay-Tag: t-1\r\n\r\n"),
		To: []queue.NewRecipient{{Addr: "a@y.test"}, {Addr: "b@y.test"}}}
	sinks, evs := decodeAll(t, ev.Accept(7, &m, m.Body))
	if got := strings.Join(sinks, ","); got != "webhook http://b.test/,file,webhook http://b.test/,file" {
		t.Errorf("sinks %s", got)
	}
	if evs[0].Tag != "t-1" || evs[0].Node != "node-a" || evs[0].Event != Accepted || evs[0].Rcpt != "a@y.test" || evs[2].Rcpt != "b@y.test" || evs[0].ID != evs[1].ID || evs[0].ID == evs[2].ID {
		t.Errorf("%+v", evs)
	}
	m.Body = []byte("Subject: x\r\n\r\n")
	if _, evs := decodeAll(t, ev.Accept(7, &m, m.Body)); evs[0].Tag != "env-1" {
		t.Errorf("tag %q, want the ENVID", evs[0].Tag)
	}
	if got := Label("http://user:pw@a.test/x?token=secret#f"); got != "http://a.test/x" {
		t.Errorf("Label = %s", got)
	}
	if New(Options{}).Accept(7, &m, m.Body) != nil {
		t.Error("events without sinks")
	}
}

// The operator's hold, release and delete each give one event, explained
// as the operator's action; a bounce by the operator is an outcome
// (bounced, reason "operator") explained as such, not by the last reply;
// the relay's own DSNs and unknown actions give none.
func TestOperatorEvents(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ev := New(Options{Webhooks: []Webhook{{URL: "http://a.test/", Secret: []byte("s")}}, Now: func() time.Time { return now }})
	msg := queue.Message{ID: 42, From: "app@x.test", EnvID: "env-9", Size: 100}
	head := []byte("Message-ID: <m@x>\r\n\r\n")
	full := queue.Reply{Code: 452, Enhanced: "4.2.2", Text: "Mailbox full"}
	rcpt := queue.Recipient{Key: queue.Key{ID: 42}, Addr: "r@y.test", Reason: "mailbox-full", Reply: full, NextAttempt: now}
	tests := []struct {
		action string
		want   Kind // "": no event
		says   string
	}{
		{queue.ReasonHeld, Held, "on hold"},
		{queue.ReasonReleased, Released, "released this recipient from hold"},
		{queue.ReasonDeleted, Deleted, "deleted this recipient"},
		{"renamed", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.action, func(t *testing.T) {
			_, evs := decodeAll(t, ev.Operator(tt.action, &msg, &rcpt, head))
			if tt.want == "" {
				if len(evs) != 0 {
					t.Fatalf("%d events for an unknown action", len(evs))
				}
				return
			}
			if len(evs) != 1 {
				t.Fatalf("%d events, want 1", len(evs))
			}
			e := evs[0]
			if e.Event != tt.want || e.Reason != tt.action || !strings.Contains(e.Explanation, tt.says) ||
				strings.Contains(e.Explanation, "Class 4") || e.QueueID != "000000000000002a" || e.MessageID != "<m@x>" ||
				e.Tag != "env-9" || e.Rcpt != "r@y.test" || !e.Time.Equal(now) {
				t.Errorf("%+v", e)
			}
			if (e.NextAttempt != nil) != (tt.want == Released) {
				t.Errorf("next_attempt %v for %s", e.NextAttempt, tt.want)
			}
		})
	}
	dsn := msg
	dsn.DSN = true
	if recs := ev.Operator(queue.ReasonHeld, &dsn, &rcpt, head); len(recs) != 0 {
		t.Errorf("%d events for the relay's own DSN", len(recs))
	}
	_, evs := decodeAll(t, ev.Outcome(Outcome{Msg: msg, Head: head, Rcpt: rcpt, Attempt: 0, Status: "5.0.0",
		Result: queue.Result{Key: rcpt.Key, Status: queue.Failed, Reason: "operator", Reply: full, End: now}}))
	if len(evs) != 1 || evs[0].Event != Bounced || !strings.Contains(evs[0].Explanation, "returned this message to its sender") ||
		strings.Contains(evs[0].Explanation, "keeps retrying") {
		t.Errorf("the operator's bounce: %+v", evs)
	}
}
