package delivery

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dsn"
)

// operatorKinds are the outcome kinds of the operator's hold, release and
// delete, by the queue's name of the action.
var operatorKinds = map[string]outcomeKind{
	queue.ReasonHeld:     opHeld,
	queue.ReasonReleased: opReleased,
	queue.ReasonDeleted:  opDeleted,
}

// action is the queue's name of an operator kind's action ("" for another
// kind).
func (k outcomeKind) action() string {
	switch k {
	case opHeld:
		return queue.ReasonHeld
	case opReleased:
		return queue.ReasonReleased
	case opDeleted:
		return queue.ReasonDeleted
	}
	return ""
}

// operatorReport is what one recipient's operator outcome reports once
// the action is stored.
type operatorReport struct {
	a     attempt
	lines []logLine
}

// Operate performs the operator's hold, release or delete (action is
// queue.ReasonHeld, ReasonReleased or ReasonDeleted) of the selected
// recipients, in the queue's one transaction (queue.Operate), as an
// outcome of its kind for each recipient it changes: settleOne decides
// its result, conclude adds its events, and report logs and counts it
// once the transaction is stored, as for every other outcome. A DryRun
// changes and reports nothing. A recipient in flight (Active) is held or
// deleted at once, its in-progress attempt left to the attempt's own
// outcome: that outcome leaves a held recipient Held unless it is final,
// and is ignored for a deleted one (queue.Apply). It returns how many
// recipients the action changed.
func (e *Engine) Operate(action string, sel queue.Selector, now time.Time) (int, error) {
	if _, ok := operatorKinds[action]; !ok {
		return 0, fmt.Errorf("delivery: %w: unknown operator action %q", queue.ErrInvalid, action)
	}
	decide, report := e.decider(now)
	n, err := e.q.Operate(action, sel, now, decide)
	report(sel, err)
	return n, err
}

// decider returns the queue.Decide of the operator's actions at now, which
// settles each as an outcome of its kind (settleOne, conclude), and
// report, which reports the outcomes it decided (report) once the action
// that decided them has returned err, unless nothing was stored (a
// DryRun, a failed transaction).
func (e *Engine) decider(now time.Time) (queue.Decide, func(sel queue.Selector, err error)) {
	// By key: a transaction the queue runs again decides again.
	reports := map[queue.Key]operatorReport{}
	decide := func(action string, m *queue.Message, r queue.Recipient, head []byte) queue.Result {
		a := attempt{msg: *m, body: head, start: now, none: true}
		o := outcome{r: r, kind: operatorKinds[action], until: now}
		s := &settlement{notices: map[dsn.Action][]dsn.Recipient{}, started: now}
		var rec queue.Destination // learns nothing: no destination answered
		e.settleOne(s, &rec, &a, o, now)
		u, _ := e.conclude(&a, s, []outcome{o}, now) // no DSN: an operator's action sends none
		a.body = nil                                 // valid only inside the transaction
		reports[r.Key] = operatorReport{a: a, lines: s.lines}
		return u.Results[0]
	}
	report := func(sel queue.Selector, err error) {
		var unsettled *queue.UnsettledError
		if sel.DryRun || (err != nil && !errors.As(err, &unsettled)) {
			return // nothing stored
		}
		keys := make([]queue.Key, 0, len(reports))
		for k := range reports {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(x, y queue.Key) int {
			return cmp.Or(cmp.Compare(x.ID, y.ID), cmp.Compare(x.Rcpt, y.Rcpt))
		})
		for _, k := range keys {
			rp := reports[k]
			e.report(&rp.a, rp.lines, nil)
		}
	}
	return decide, report
}

// operated records the operator's action on o.r (o.kind): a hold keeps
// its reason and reply (why it was not delivered; the status Held says
// the rest); a release makes it due at o.until, Queued if never attempted,
// with reason "released"; a deletion removes it, as it was.
func (e *Engine) operated(s *settlement, o outcome, res *queue.Result) {
	action := o.kind.action()
	res.Status, res.Reason, res.Reply, res.Stage = o.r.Status, o.r.Reason, o.r.Reply, "operator"
	switch o.kind {
	case opHeld:
		res.Status = queue.Held
	case opReleased:
		res.Status, res.Reason, res.NextAttempt = queue.Deferred, queue.ReasonReleased, o.until
		if o.r.Attempts == 0 {
			res.Status = queue.Queued
		}
	}
	s.lines = append(s.lines, logLine{r: o.r, res: *res, outcome: string(res.Status), reason: action, kind: o.kind})
}

// logOperated writes the line of the operator's action on one recipient,
// and counts it.
func (e *Engine) logOperated(l logLine) {
	action := l.kind.action()
	e.m.OperatorActions.WithLabelValues(action).Inc()
	fields := []zap.Field{zap.String("queue_id", l.r.Key.ID.String()), zap.String("rcpt", l.r.Addr),
		zap.String("domain", l.r.Domain), zap.String("was", string(l.r.Status))}
	if l.kind == opReleased {
		fields = append(fields, zap.String("status", l.outcome), zap.Time("next_attempt", l.res.NextAttempt))
	}
	e.log.Info(action+" by the operator", fields...)
}
