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
const reasonOperator = "operator"

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

// push moves due recipients of a paused (throttled) destination to until
// without an attempt, so the loop does not look at them again and again.
// Recipients whose lifetime is over expire instead (4.4.7 with a DSN).
func (e *Engine) push(d *dest, rs []queue.Recipient, until, now time.Time) {
	byMsg := map[queue.ID][]queue.Recipient{}
	for _, r := range rs {
		byMsg[r.Key.ID] = append(byMsg[r.Key.ID], r)
	}
	for id, group := range byMsg {
		if err := e.pushMessage(d, id, group, until, now); err != nil {
			e.requestRescan() // not moved: still behind the scan position
			e.log.Error("delivery: postponing recipients of a throttled destination failed",
				zap.String("queue_id", id.String()), zap.String("domain", d.name), zap.Error(err))
		}
	}
}

func (e *Engine) pushMessage(d *dest, id queue.ID, rs []queue.Recipient, until, now time.Time) error {
	msg, err := e.q.Message(id)
	if err != nil {
		return err
	}
	if !now.Before(e.deadline(msg)) {
		body, err := e.q.Body(id)
		if err != nil {
			return err
		}
		outs := make([]outcome, len(rs))
		for i, r := range rs {
			outs[i] = outcome{r: r, v: storedVerdict(r)}
		}
		e.settle(d, &attempt{msg: msg, body: body, start: now}, outs)
		return nil
	}
	var u queue.Update
	for _, r := range rs {
		u.Results = append(u.Results, queue.Result{Key: r.Key, Status: r.Status, Reason: r.Reason, Reply: r.Reply,
			Stage: "throttled", End: now, NextAttempt: until, FirstGreylisted: r.FirstGreylisted,
			GreylistTries: r.GreylistTries, DelayWarnings: r.DelayWarnings})
	}
	_, err = e.q.Apply(u)
	return err
}

// storedVerdict rebuilds the verdict of a recipient's last deferral from
// what the queue stored, for an expiry without a new attempt.
func storedVerdict(r queue.Recipient) classifier.Verdict {
	reason := classifier.Reason(r.Reason)
	if reason == "" {
		reason = classifier.RateLimited
	}
	return classifier.Verdict{Outcome: classifier.Deferred, Reason: reason,
		Code: r.Reply.Code, Enhanced: r.Reply.Enhanced, Text: r.Reply.Text}
}
