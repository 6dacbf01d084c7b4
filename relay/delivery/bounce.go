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

// bounceMessage fails rs, all recipients of message id, with one DSN: an
// outcome of kind bounced each, settled like any other (settleNow).
func (e *Engine) bounceMessage(id queue.ID, rs []queue.Recipient, now time.Time) error {
	msg, err := e.q.Message(id)
	if err != nil {
		return fmt.Errorf("delivery: bounce %s: %w", id, err)
	}
	body, err := e.q.Body(id)
	if err != nil {
		return fmt.Errorf("delivery: bounce %s: %w", id, err)
	}
	outs := make([]outcome, len(rs))
	for i, r := range rs {
		outs[i] = outcome{r: r, kind: bounced}
	}
	if err := e.settleNow(&attempt{msg: msg, body: body, start: now, none: true}, outs, now); err != nil {
		return fmt.Errorf("delivery: bounce %s: %w", id, err)
	}
	return nil
}

// bounced records the operator's bounce of o.r: Failed with reason
// "operator" at stage "operator", keeping the last reply for the
// diagnosis, and a failure notice (status BounceStatus) that says who
// returned the message.
func (e *Engine) bounced(s *settlement, a *attempt, o outcome, res *queue.Result) {
	res.Status, res.Reason, res.Reply, res.Stage = queue.Failed, reasonOperator, o.r.Reply, "operator"
	if notifies(o.r.Notify, notifyFailure) {
		rc := dsn.Recipient{Final: o.r.Addr, Original: o.r.ORCPT, Action: dsn.Failed, Status: BounceStatus,
			RemoteMTA: o.r.MXHost, LastAttempt: o.r.LastAttempt,
			Explanation: "The relay's operator returned this message before it could be delivered. " +
				"Ask the operator of " + e.cfg.Hostname + " why, or send it again later."}
		if o.r.Reply.Code != 0 {
			rc.Diagnostic = replyLine(o.r.Reply.Code, o.r.Reply.Enhanced, o.r.Reply.Text)
		}
		s.notices[dsn.Failed] = append(s.notices[dsn.Failed], rc)
	}
	s.lines = append(s.lines, logLine{r: o.r, res: *res, outcome: string(queue.Failed), reason: reasonOperator,
		code: o.r.Reply.Code, enhanced: o.r.Reply.Enhanced, text: o.r.Reply.Text, status: BounceStatus, kind: bounced})
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
		if err := e.pushMessage(d, id, group, until, now, why, e.settle); err != nil {
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
// attempt (see push), or expires them if their lifetime is over, with
// settle: the loop's own (Engine.settle) when the loop pushes, a
// worker's way to it (settleAttempt) when a worker postpones.
func (e *Engine) pushMessage(d *dest, id queue.ID, rs []queue.Recipient, until, now time.Time, why postponement,
	settle func(*dest, *attempt, []outcome)) error {
	msg, err := e.q.Message(id)
	if err != nil {
		return err
	}
	dl := e.deadline(msg)
	if until.After(dl) {
		until = dl // it expires at its deadline, not at the end of a longer pause
	}
	outs := make([]outcome, len(rs))
	for i, r := range rs {
		outs[i] = outcome{r: r, v: storedVerdict(r, why.v), kind: postponed, why: &why, until: until}
	}
	if now.Before(dl) {
		return e.settleNow(&attempt{msg: msg, start: now, none: true}, outs, now)
	}
	// Their lifetime is over: they expire (settleOne), and the destination
	// learns from it as from any expiry (settle).
	body, err := e.q.Body(id)
	if err != nil {
		return err
	}
	settle(d, &attempt{msg: msg, body: body, start: now, none: true}, outs)
	return nil
}

// postponed records o.r moved to o.until without an attempt: its status
// stays, and so do its reason and reply, unless it has none and the
// postponement labels it (o.why).
func (e *Engine) postponed(s *settlement, o outcome, res *queue.Result) {
	res.Status, res.Reason, res.Reply = o.r.Status, o.r.Reason, o.r.Reply
	if res.Reason == "" && o.why.label {
		v := o.why.v
		res.Reason, res.Reply = string(v.Reason), queue.Reply{Code: v.Code, Enhanced: v.Enhanced, Text: v.Text}
	}
	res.Stage, res.NextAttempt = o.why.stage, o.until
	s.lines = append(s.lines, logLine{r: o.r, res: *res, outcome: string(o.r.Status), reason: res.Reason,
		kind: postponed, note: o.why.log})
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
