// Package events tells applications what happened to their mail: one JSON
// object per recipient and event (accepted, delivered or relayed, deferred,
// delayed, bounced, expired, the operator's held, released, deleted, and
// suppressed and refused for the suppression list), POSTed in signed batches to webhooks and
// written as JSON lines to a file for log shippers.
//
// Durability comes from the queue, not from this package. An event is
// encoded before the change it reports is stored, and handed to the queue
// as outbox records (queue.Event), one per sink that wants it, which the
// queue commits in the same bbolt transaction as the change: the
// acceptance of a message in the transaction that inserts it (also when
// the queue replays its intake journal after a crash), a delivery
// outcome with its result, an operator's hold, release or deletion with
// the change (the delivery engine's outcome of it, through
// queue.Operate). So an event exists iff its change was stored,
// and a crash loses neither. Each sink's reader (one goroutine per webhook,
// one for the file; never one per message) takes its oldest records,
// passes them on, and only then removes them: at-least-once. A record
// passed on and not yet removed when the relay dies goes out again after
// the restart with the same event ID, so receivers deduplicate on "id".
//
// A webhook that fails is tried again with exponential backoff (1 s
// doubling to 5 min); records older than Options.MaxAge are dropped with
// a log line and a metric, so a receiver that is gone for good does not
// fill the disk.
//
// The application's tag is its X-Greyrelay-Tag header, or else the
// envelope ID (RFC 3461 §4.4 ENVID). Options.StripTag removes the header
// from the message on its way out (Wire), so the next hop never sees it;
// the queued copy keeps it, which is where every later event reads it
// from.
package events

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/metrics"
)

// Kind is the type of an event.
type Kind string

// The kinds of events.
const (
	Accepted  Kind = "accepted"  // the relay took responsibility (250 after DATA)
	Delivered Kind = "delivered" // the destination's MTA accepted the recipient
	Relayed   Kind = "relayed"   // a relaying next hop (smarthost) accepted it
	Deferred  Kind = "deferred"  // a temporary failure; retried at next_attempt
	Delayed   Kind = "delayed"   // still not delivered after a retry.delay_warnings step
	Bounced   Kind = "bounced"   // a permanent failure
	Expired   Kind = "expired"   // the lifetime ran out (4.4.7)
	Held      Kind = "held"      // the operator put the recipient on hold (no attempts until released)
	Released  Kind = "released"  // the operator released it from hold (due at once)
	Deleted   Kind = "deleted"   // the operator deleted it (no DSN; nothing more happens to it)
	// Suppressed: a bounce for a reason about the address put it on the
	// suppression list; later mail to it is refused at RCPT.
	Suppressed Kind = "suppressed"
	// Refused: intake refused a recipient at RCPT (or the sending API
	// refused it) because its address is on the suppression list; nothing
	// was queued for it, so the event has no queue ID.
	Refused Kind = "refused"
)

// Event is the JSON object sent for one recipient and event.
type Event struct {
	ID          string     `json:"id"` // unique; the same in every copy of this event
	Event       Kind       `json:"event"`
	Time        time.Time  `json:"time"`
	QueueID     string     `json:"queue_id"`
	Node        string     `json:"node,omitempty"` // the node that holds the message (Options.Node)
	MessageID   string     `json:"message_id,omitempty"`
	Tag         string     `json:"tag,omitempty"`
	From        string     `json:"from"` // "" for the null sender
	Rcpt        string     `json:"rcpt"`
	ORCPT       string     `json:"orcpt,omitempty"`
	EnvID       string     `json:"envid,omitempty"`
	Size        int64      `json:"size,omitempty"`
	Attempt     int        `json:"attempt,omitempty"`
	Reason      string     `json:"reason,omitempty"`
	Reply       *Reply     `json:"reply,omitempty"`
	Explanation string     `json:"explanation,omitempty"`
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
	MX          string     `json:"mx,omitempty"`
	DSN         *DSN       `json:"dsn,omitempty"`
}

// Reply is an SMTP reply in an event.
type Reply struct {
	Code     int    `json:"code"`
	Enhanced string `json:"enhanced,omitempty"`
	Text     string `json:"text"`
}

// DSN holds the per-recipient fields of a delivery status notification
// (RFC 3464 §2.3) for bounced and expired events.
type DSN struct {
	Action         string `json:"action"`
	Status         string `json:"status"`
	DiagnosticCode string `json:"diagnostic_code,omitempty"`
	RemoteMTA      string `json:"remote_mta,omitempty"`
}

// Webhook is one receiver of events.
type Webhook struct {
	URL    string
	Kinds  []Kind // empty: every kind
	Secret []byte // HMAC-SHA256 key
}

// Options configure New.
type Options struct {
	Webhooks []Webhook
	File     string        // the JSON lines file; "" for none
	MaxAge   time.Duration // older undelivered events are dropped; 0: never
	StripTag bool          // remove X-Greyrelay-Tag from outgoing messages
	Timeout  time.Duration // one webhook POST; 0: 30 s
	Batch    int           // events per POST at most; 0: 100
	Client   *http.Client  // nil: a client with Timeout
	Rand     io.Reader     // event IDs; nil: crypto/rand
	// Node names this node in every event, so that an application fed
	// by several nodes knows which one holds the message.
	Node    string
	Now     func() time.Time
	Logger  *zap.Logger
	Metrics *metrics.Events
}

// Events encodes events for the queue's outbox and runs the sinks' readers.
type Events struct {
	opt   Options
	sinks []*sink
	file  *fileSink // nil without an event file
}

// New returns an Events for opt. Its Accept and Stored go into the queue's
// Options; Run starts the readers once the queue is open.
func New(opt Options) *Events {
	if opt.Timeout <= 0 {
		opt.Timeout = 30 * time.Second
	}
	if opt.Batch <= 0 {
		opt.Batch = 100
	}
	if opt.Client == nil {
		opt.Client = &http.Client{Timeout: opt.Timeout}
	}
	if opt.Rand == nil {
		opt.Rand = rand.Reader
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	e := &Events{opt: opt}
	for _, w := range opt.Webhooks {
		e.sinks = append(e.sinks, newWebhookSink(e, w))
	}
	if opt.File != "" {
		e.sinks = append(e.sinks, newFileSink(e, opt.File))
	}
	return e
}

// QueueOptions returns o with Accept and Stored as its outbox hooks, or o
// unchanged when no sink is configured (the queue then does not even read
// a spooled body's head).
func (e *Events) QueueOptions(o queue.Options) queue.Options {
	if e.Enabled() {
		o.OnAccept, o.OnEvents = e.Accept, e.Stored
	}
	return o
}

// Enabled reports whether any sink is configured.
func (e *Events) Enabled() bool { return e != nil && len(e.sinks) > 0 }

// Accept is queue.Options.OnAccept: one accepted event per recipient of
// message id.
func (e *Events) Accept(id queue.ID, m *queue.NewMessage, head []byte) []queue.Event {
	if !e.Enabled() {
		return nil
	}
	msgID, tag := scanHeader(head)
	if tag == "" {
		tag = m.EnvID
	}
	var out []queue.Event
	for _, r := range m.To {
		ev := Event{Event: Accepted, Time: m.Arrival, QueueID: id.String(), MessageID: msgID, Tag: tag,
			From: m.From, Rcpt: r.Addr, ORCPT: r.ORCPT, EnvID: m.EnvID, Size: int64(len(m.Body))}
		if m.File != nil {
			ev.Size = m.File.Len()
		}
		out = e.encode(out, &ev)
	}
	return out
}

// Operator is what the delivery engine stores with the outcome of an
// operator's action (queue.Operate): the event of the operator's
// action on recipient r of message m (queue.ReasonHeld, ReasonReleased or
// ReasonDeleted), with its explanation. A bounce by the operator is an
// outcome (Outcome: bounced, reason "operator").
func (e *Events) Operator(action string, m *queue.Message, r *queue.Recipient, head []byte) []queue.Event {
	kind, ok := map[string]Kind{queue.ReasonHeld: Held, queue.ReasonReleased: Released, queue.ReasonDeleted: Deleted}[action]
	if !e.Enabled() || !ok || m.DSN {
		return nil
	}
	msgID, tag := scanHeader(head)
	if tag == "" {
		tag = m.EnvID
	}
	ev := Event{Event: kind, Time: e.opt.Now(), QueueID: m.ID.String(), MessageID: msgID, Tag: tag,
		From: m.From, Rcpt: r.Addr, ORCPT: r.ORCPT, EnvID: m.EnvID, Size: m.Size, Reason: action,
		Explanation: classifier.Explain(classifier.Reason(action), "").String()}
	if action == queue.ReasonReleased {
		next := r.NextAttempt
		ev.NextAttempt = &next
	}
	return e.encode(nil, &ev)
}

// Refused returns the refused event of recipient rcpt of mail from from,
// refused with reply for reason (classifier.Suppressed) at t.
func (e *Events) Refused(from, rcpt, reason string, code int, enhanced, text string, t time.Time) []queue.Event {
	if !e.Enabled() {
		return nil
	}
	ev := Event{Event: Refused, Time: t, From: from, Rcpt: rcpt, Reason: reason,
		Reply:       &Reply{Code: code, Enhanced: enhanced, Text: text},
		Explanation: classifier.Explain(classifier.Reason(reason), enhanced).String()}
	return e.encode(nil, &ev)
}

// SuppressedBy returns the suppressed event of an address the operator put
// on the suppression list (greyrelay suppression add), without a message:
// reason is the entry's (operator, complaint...), scope its sending domain
// ("" for every sender) as from.
func (e *Events) SuppressedBy(addr, scope, reason string, t time.Time) []queue.Event {
	if !e.Enabled() {
		return nil
	}
	from := ""
	if scope != "" {
		from = "@" + scope
	}
	return e.encode(nil, &Event{Event: Suppressed, Time: t, From: from, Rcpt: addr, Reason: reason})
}

// Outcome is one recipient's stored delivery outcome.
type Outcome struct {
	Msg     queue.Message
	Head    []byte          // the start of the queued body (for Message-ID and tag)
	Rcpt    queue.Recipient // as it was before the attempt
	Result  queue.Result
	Attempt int    // the attempt's number; 0 if none was made
	Status  string // the RFC 3463 status a DSN reports for a failure
	Expired bool   // the lifetime ran out
	// Suppressed: the failure put the address on the suppression list.
	Suppressed bool
}

// Outcome returns the events of o, as records for o.Result.Events: the
// outcome itself, and a delayed event when o crosses a delay-warning step.
func (e *Events) Outcome(o Outcome) []queue.Event {
	if !e.Enabled() || o.Msg.DSN {
		// The relay's own DSNs are not the application's mail.
		return nil
	}
	msgID, tag := scanHeader(o.Head)
	if tag == "" {
		tag = o.Msg.EnvID
	}
	res := &o.Result
	base := Event{Time: res.End, QueueID: o.Msg.ID.String(), MessageID: msgID, Tag: tag, From: o.Msg.From,
		Rcpt: o.Rcpt.Addr, ORCPT: o.Rcpt.ORCPT, EnvID: o.Msg.EnvID, Size: o.Msg.Size, Attempt: o.Attempt,
		Reason: res.Reason, MX: res.MXHost}
	if res.Reply.Code != 0 || res.Reply.Text != "" {
		base.Reply = &Reply{Code: res.Reply.Code, Enhanced: res.Reply.Enhanced, Text: res.Reply.Text}
	}
	var out []queue.Event
	ev := base
	switch res.Status {
	case queue.Delivered:
		ev.Event, ev.Reason = Delivered, ""
	case queue.Relayed:
		ev.Event, ev.Reason = Relayed, ""
	case queue.Failed:
		ev.Event = Bounced
		x := classifier.Explain(classifier.Reason(res.Reason), res.Reply.Enhanced)
		if o.Expired {
			ev.Event = Expired
			x = classifier.ExplainExpired(classifier.Reason(res.Reason), res.Reply.Enhanced)
		}
		ev.Explanation = x.String()
		ev.DSN = dsnFields(o)
	case queue.Deferred:
		ev.Event = Deferred
		ev.Explanation = classifier.Explain(classifier.Reason(res.Reason), res.Reply.Enhanced).String()
		if !res.NextAttempt.IsZero() {
			next := res.NextAttempt
			ev.NextAttempt = &next
		}
	default:
		return nil
	}
	out = e.encode(out, &ev)
	if res.Status == queue.Deferred && res.DelayWarnings > o.Rcpt.DelayWarnings {
		d := ev
		d.Event = Delayed
		out = e.encode(out, &d)
	}
	if o.Suppressed && res.Status == queue.Failed {
		d := ev
		d.Event, d.DSN = Suppressed, nil
		out = e.encode(out, &d)
	}
	return out
}

// dsnFields are the RFC 3464 §2.3 fields a failure DSN carries.
func dsnFields(o Outcome) *DSN {
	d := &DSN{Action: "failed", Status: o.Status}
	if r := o.Result.Reply; r.Code != 0 {
		// RFC 3464 §2.3.6: diagnostic-type "smtp" and the reply.
		d.DiagnosticCode = fmt.Sprintf("smtp; %d %s", r.Code, joinNonEmpty(r.Enhanced, r.Text))
	}
	if o.Result.MXHost != "" {
		d.RemoteMTA = "dns; " + o.Result.MXHost // RFC 3464 §2.3.5
	}
	return d
}

func joinNonEmpty(a, b string) string {
	if a == "" {
		return b
	}
	return a + " " + b
}

// encode gives ev its ID and appends its records for the sinks that want
// it. The record is the event's time (Unix nanoseconds, 8 bytes, for
// MaxAge) and its JSON.
func (e *Events) encode(out []queue.Event, ev *Event) []queue.Event {
	var id [16]byte
	if _, err := io.ReadFull(e.opt.Rand, id[:]); err != nil {
		// crypto/rand does not fail on supported systems; an ID made
		// from the time alone is still unique enough to deduplicate.
		binary.BigEndian.PutUint64(id[:], uint64(e.opt.Now().UnixNano()))
	}
	ev.ID, ev.Node = hex.EncodeToString(id[:]), e.opt.Node
	js, err := json.Marshal(ev)
	if err != nil {
		return out // an Event always encodes
	}
	data := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(js)), uint64(ev.Time.UnixNano()))
	data = append(data, js...)
	for _, s := range e.sinks {
		if s.wants(ev.Event) {
			out = append(out, queue.Event{Sink: s.name, Data: data})
		}
	}
	return out
}

// decodeRecord splits an outbox record into its time and JSON.
func decodeRecord(b []byte) (time.Time, []byte, bool) {
	if len(b) < 8 {
		return time.Time{}, nil, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b))), b[8:], true
}

// Wire returns body as it goes to the next hop: without its
// X-Greyrelay-Tag header fields when Options.StripTag asks.
func (e *Events) Wire(body []byte) []byte {
	if e == nil || !e.opt.StripTag {
		return body
	}
	return stripTag(body)
}
