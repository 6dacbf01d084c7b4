package delivery

import (
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/dsn"
)

// DSN policy (RFC 3461, RFC 3464):
//
//   - one DSN per message and event, listing every recipient the event
//     concerns (all recipients of a transaction that failed together);
//   - "failed" (5xx, NXDOMAIN, null MX, lifetime expired) when NOTIFY is
//     absent or contains FAILURE; "delayed" at each retry.delay_warnings age
//     when NOTIFY is absent or contains DELAY; "relayed" when NOTIFY
//     contains SUCCESS and the next hop did not take the DSN parameters
//     (RFC 3461 §5.2.2); NOTIFY=NEVER gets nothing;
//   - never a DSN about a message from the null sender or about a DSN
//     (RFC 5321 §6.1, "MUST NOT send error messages in response to error
//     messages"): such failures are logged and dropped;
//   - at most dsn.max_per_sender_per_hour DSNs to one sender (backscatter);
//     the rest are dropped and counted;
//   - the DSN is queued in the same queue.Apply as the outcome it reports,
//     from the null sender, marked DSN so it never bounces itself.
//   - a DSN is retried for retry.dsn_lifetime (48h), not retry.lifetime
//     (RFC 5321 §4.5.4.1 allows the shorter limit); one still undeliverable
//     then is logged and dropped.

// NOTIFY keywords (RFC 3461 §4.1).
const (
	notifySuccess = "SUCCESS"
	notifyFailure = "FAILURE"
	notifyDelay   = "DELAY"
	notifyNever   = "NEVER"
)

// notifies reports whether a recipient's NOTIFY parameter asks for a DSN of
// kind what. Without NOTIFY we report failures and delays (RFC 3461 §4.1
// leaves the default to the MTA; "FAILURE,DELAY" is what Postfix does).
func notifies(notify, what string) bool {
	notify = strings.TrimSpace(notify)
	if notify == "" {
		return what == notifyFailure || what == notifyDelay
	}
	for _, k := range strings.Split(notify, ",") {
		k = strings.ToUpper(strings.TrimSpace(k))
		if k == notifyNever {
			return false
		}
		if k == what {
			return true
		}
	}
	return false
}

// dsnRecipient describes one recipient in a DSN.
func (e *Engine) dsnRecipient(a *attempt, o outcome, action dsn.Action, status string, now time.Time) dsn.Recipient {
	rc := dsn.Recipient{Final: o.r.Addr, Original: o.r.ORCPT, Action: action, Status: status,
		RemoteMTA: a.t.host, LastAttempt: now}
	switch {
	case rc.RemoteMTA != "" || o.v.Code == 0:
	case a.none:
		rc.RemoteMTA = o.r.MXHost // no attempt now: the reply came from the last real one
	default:
		rc.RemoteMTA = a.tried.host // the reply came from the last host tried (overHosts)
	}
	switch {
	case action == dsn.Relayed:
		rc.Diagnostic = replyLine(o.reply.Code, o.reply.Enhanced, o.reply.Text)
		rc.Explanation = "The message was handed to " + orUnknown(a.t.host) +
			", which does not support delivery notifications; no further report will follow."
		return rc
	case o.v.Code != 0:
		rc.Diagnostic = replyLine(o.v.Code, o.v.Enhanced, o.v.Text)
	}
	expired := action == dsn.Failed && status == "4.4.7"
	explain := classifier.Explain
	if expired {
		explain = classifier.ExplainExpired // no "keeps retrying": it gave up
	}
	ex := explain(o.v.Reason, o.v.Status()).String()
	if o.v.Code == 0 && o.v.Text != "" {
		ex = o.v.Text + ". " + ex // no remote reply: our own diagnosis
	}
	switch {
	case action == dsn.Delayed:
		rc.WillRetryUntil = e.deadline(a.msg)
	case expired:
		ex = fmt.Sprintf("greyrelay gave up after retrying for %v. The last problem: %s", e.lifetime(a.msg), ex)
	}
	rc.Explanation = ex
	return rc
}

// notices builds the DSN messages for one attempt's events, with their
// actions (for the metric).
func (e *Engine) notices(a *attempt, by map[dsn.Action][]dsn.Recipient, now time.Time) ([]queue.NewMessage, []dsn.Action) {
	var out []queue.NewMessage
	var actions []dsn.Action
	for _, action := range []dsn.Action{dsn.Failed, dsn.Delayed, dsn.Relayed} {
		if rcpts := by[action]; len(rcpts) > 0 {
			if m, ok := e.dsnMessage(a.msg, a.body, rcpts, now); ok {
				out = append(out, m)
				actions = append(actions, action)
			}
		}
	}
	return out, actions
}

// dsnMessage composes one DSN about msg. ok is false when no DSN may be
// sent (null sender, a DSN itself, the per-sender cap) or it cannot be
// built; the reason is logged.
func (e *Engine) dsnMessage(msg queue.Message, body []byte, rcpts []dsn.Recipient, now time.Time) (queue.NewMessage, bool) {
	action := rcpts[0].Action
	logf := func(what string, f ...zap.Field) {
		e.log.Warn(what, append(f, zap.String("queue_id", msg.ID.String()), zap.String("action", string(action)))...)
	}
	if msg.From == "" || msg.DSN {
		logf("no DSN about a bounce (RFC 5321 §6.1); dropped")
		return queue.NewMessage{}, false
	}
	domain, ok := domainOf(msg.From)
	if !ok {
		logf("no DSN: the sender has no domain", zap.String("sender", msg.From))
		return queue.NewMessage{}, false
	}
	if !e.limit.Allow(msg.From, now) {
		e.m.DSNsSuppressed.Inc()
		logf("DSN suppressed by dsn.max_per_sender_per_hour", zap.String("sender", msg.From))
		return queue.NewMessage{}, false
	}
	ret := dsn.ReturnHeaders
	if strings.EqualFold(msg.RET, "FULL") && !msg.RequireTLS {
		// RFC 8689 §5: the path back to the sender may not be protected
		// as the message required, so a REQUIRETLS message's content is
		// not returned (RET=FULL is disregarded): its headers only.
		ret = dsn.ReturnFull
	}
	b, err := dsn.Compose(dsn.Report{ReportingMTA: e.cfg.Hostname, To: msg.From, EnvID: msg.EnvID,
		Arrival: msg.Arrival, Now: now, MessageID: e.dsnMessageID(msg.ID, action, now),
		Recipients: rcpts, Original: body, Return: ret, MaxReturned: e.cfg.DSN.MaxReturnedBytes, UTF8: msg.SMTPUTF8})
	if err != nil {
		logf("DSN could not be composed; dropped", zap.Error(err))
		return queue.NewMessage{}, false
	}
	return queue.NewMessage{
		From: "", DSN: true, Body: b, Arrival: now,
		To:       []queue.NewRecipient{{Addr: msg.From, Domain: domain}},
		SMTPUTF8: msg.SMTPUTF8, EightBit: msg.SMTPUTF8,
		// RFC 8689 §5: a notice about a REQUIRETLS message is itself sent
		// with REQUIRETLS, since it carries the original's headers.
		RequireTLS: msg.RequireTLS,
	}, true
}

// dsnMessageID makes the DSN's Message-ID from the queue ID, the action and
// the time, at our host name.
func (e *Engine) dsnMessageID(id queue.ID, action dsn.Action, now time.Time) string {
	return fmt.Sprintf("%s.%s.%d.dsn@%s", id, action, now.UnixNano(), e.cfg.Hostname)
}

// domainOf returns the domain of addr in its canonical form (a DSN's
// recipient is a destination like any other).
func domainOf(addr string) (string, bool) {
	i := strings.LastIndexByte(addr, '@')
	if i < 0 || i == len(addr)-1 {
		return "", false
	}
	return address.DomainKey(addr[i+1:]), true
}

// replyLine renders a reply as one line: "451 4.7.1 text".
func replyLine(code int, enhanced, text string) string {
	r := smtpvocab.Reply{Code: code, Enhanced: enhanced, Text: text}
	return r.Error()
}

func orUnknown(s string) string {
	if s == "" {
		return "the next hop"
	}
	return s
}
