package delivery

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dsn"
)

// BounceStatus is the RFC 3463 status reported for recipients the operator
// bounces: 5.0.0, "other undefined status", because the message did not
// fail for any reason the peer gave; the DSN explains who returned it and
// quotes the last reply, if there was one.
const BounceStatus = "5.0.0"

// reasonOperator is the stored reason (and metric label) of an operator
// bounce.
const reasonOperator = string(classifier.OperatorBounced)

// Bounce fails the selected recipients now, as the operator's "bounce":
// each becomes Failed with reason "operator", and each message gets one DSN
// (status BounceStatus) listing them, subject to NOTIFY, the null-sender
// rule and the per-sender cap, in the same transaction. Recipients with an
// attempt in flight (Active) are left alone: their attempt decides. It
// returns how many recipients it failed.
func (e *Engine) Bounce(sel queue.Selector, now time.Time) (int, error) {
	rs, err := e.q.Select(sel)
	if err != nil {
		return 0, fmt.Errorf("delivery: bounce: %w", err)
	}
	byMsg := map[queue.ID][]queue.Recipient{}
	var ids []queue.ID
	for _, r := range rs {
		if r.Status == queue.Active || r.Status.Final() {
			continue
		}
		if byMsg[r.Key.ID] == nil {
			ids = append(ids, r.Key.ID)
		}
		byMsg[r.Key.ID] = append(byMsg[r.Key.ID], r)
	}
	n := 0
	var errs []error
	for _, id := range ids {
		if err := e.bounceMessage(id, byMsg[id], now); err != nil {
			errs = append(errs, err)
			continue
		}
		n += len(byMsg[id])
	}
	e.Kick()
	return n, errors.Join(errs...)
}

// bounceMessage fails rs, all recipients of message id, with one DSN.
func (e *Engine) bounceMessage(id queue.ID, rs []queue.Recipient, now time.Time) error {
	msg, err := e.q.Message(id)
	if err != nil {
		return fmt.Errorf("delivery: bounce %s: %w", id, err)
	}
	body, err := e.q.Body(id)
	if err != nil {
		return fmt.Errorf("delivery: bounce %s: %w", id, err)
	}
	var u queue.Update
	var notice []dsn.Recipient
	for _, r := range rs {
		u.Results = append(u.Results, queue.Result{Key: r.Key, Status: queue.Failed, Reason: reasonOperator,
			Reply: r.Reply, Stage: "operator", End: now, FirstGreylisted: r.FirstGreylisted,
			GreylistTries: r.GreylistTries, DelayWarnings: r.DelayWarnings})
		if !notifies(r.Notify, notifyFailure) {
			continue
		}
		rc := dsn.Recipient{Final: r.Addr, Original: r.ORCPT, Action: dsn.Failed, Status: BounceStatus,
			RemoteMTA: r.MXHost, LastAttempt: r.LastAttempt,
			Explanation: "The relay's operator returned this message before it could be delivered. " +
				"Ask the operator of " + e.cfg.Hostname + " why, or send it again later."}
		if r.Reply.Code != 0 {
			rc.Diagnostic = replyLine(r.Reply.Code, r.Reply.Enhanced, r.Reply.Text)
		}
		notice = append(notice, rc)
	}
	e.attachBounceEvents(msg, body, rs, &u)
	if len(notice) > 0 {
		if m, ok := e.dsnMessage(msg, body, notice, now); ok {
			u.DSNs = append(u.DSNs, m)
		}
	}
	if _, err := e.q.Apply(u); err != nil {
		return fmt.Errorf("delivery: bounce %s: %w", id, err)
	}
	if len(u.DSNs) > 0 {
		e.m.DSNs.WithLabelValues(string(dsn.Failed)).Inc()
	}
	for _, r := range rs {
		e.m.Deliveries.WithLabelValues(string(queue.Failed), reasonOperator).Inc()
		e.m.Recent.Add(string(queue.Failed), now)
		e.log.Info("bounced by the operator", zap.String("queue_id", id.String()), zap.String("rcpt", r.Addr),
			zap.String("domain", r.Domain), zap.String("outcome", string(queue.Failed)),
			zap.String("reason", reasonOperator), zap.String("enhanced", BounceStatus))
	}
	return nil
}

// push moves due recipients of a paused (throttled or suspended)
// destination to until without an attempt, so the loop does not look at
// them again and again; why says which. Recipients whose lifetime is over
// expire instead (4.4.7 with a DSN).
func (e *Engine) push(d *dest, rs []queue.Recipient, until, now time.Time, why postponement) {
	byMsg := map[queue.ID][]queue.Recipient{}
	for _, r := range rs {
		byMsg[r.Key.ID] = append(byMsg[r.Key.ID], r)
	}
	for id, group := range byMsg {
		if err := e.pushMessage(d, id, group, until, now, why); err != nil {
			e.requestRescan() // not moved: still behind the scan position
			e.log.Error("delivery: postponing recipients of a paused destination failed", zap.String("stage", why.stage),
				zap.String("queue_id", id.String()), zap.String("domain", d.name), zap.Error(err))
		}
	}
}

// postponement says why recipients are moved without an attempt.
type postponement struct {
	stage string             // the stage stored in their attempt history
	v     classifier.Verdict // why, for recipients never attempted: the reason of their expiry
	label bool               // also store v's reason and reply on such recipients when postponing
	log   string             // if set, the line logged for each recipient postponed
}

// throttled is the postponement of a paused destination's recipients.
var throttled = postponement{stage: "throttled", v: classifier.Verdict{Reason: classifier.RateLimited}}

// pushMessage moves rs, recipients of message id, to until without an
// attempt (see push), or expires them if their lifetime is over.
func (e *Engine) pushMessage(d *dest, id queue.ID, rs []queue.Recipient, until, now time.Time, why postponement) error {
	msg, err := e.q.Message(id)
	if err != nil {
		return err
	}
	dl := e.deadline(msg)
	if !now.Before(dl) {
		body, err := e.q.Body(id)
		if err != nil {
			return err
		}
		outs := make([]outcome, len(rs))
		for i, r := range rs {
			outs[i] = outcome{r: r, v: storedVerdict(r, why.v)}
		}
		e.settle(d, &attempt{msg: msg, body: body, start: now, none: true}, outs)
		return nil
	}
	if until.After(dl) {
		until = dl // it expires at its deadline, not at the end of a longer pause
	}
	var u queue.Update
	for _, r := range rs {
		reason, reply := r.Reason, r.Reply
		if reason == "" && why.label {
			reason, reply = string(why.v.Reason), queue.Reply{Code: why.v.Code, Enhanced: why.v.Enhanced, Text: why.v.Text}
		}
		u.Results = append(u.Results, queue.Result{Key: r.Key, Status: r.Status, Reason: reason, Reply: reply,
			Stage: why.stage, End: now, NextAttempt: until, FirstGreylisted: r.FirstGreylisted,
			GreylistTries: r.GreylistTries, DelayWarnings: r.DelayWarnings})
	}
	if _, err = e.q.Apply(u); err != nil || why.log == "" {
		return err
	}
	for _, r := range rs {
		e.log.Info(why.log, zap.String("queue_id", r.Key.ID.String()), zap.String("rcpt", r.Addr),
			zap.String("domain", r.Domain), zap.Int("attempts", r.Attempts), zap.Time("next_attempt", until))
	}
	return nil
}

// storedVerdict rebuilds the verdict of a recipient's last deferral from
// what the queue stored, for an expiry without a new attempt; a recipient
// never attempted gets fallback (why it was postponed).
func storedVerdict(r queue.Recipient, fallback classifier.Verdict) classifier.Verdict {
	if r.Reason == "" {
		fallback.Outcome = classifier.Deferred
		return fallback
	}
	return classifier.Verdict{Outcome: classifier.Deferred, Reason: classifier.Reason(r.Reason),
		Code: r.Reply.Code, Enhanced: r.Reply.Enhanced, Text: r.Reply.Text}
}
