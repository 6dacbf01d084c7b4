package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Operator actions. Each is one write transaction over the selected
// recipients and returns how many recipients it changed. Selecting by ID
// fails with ErrNotFound if the message does not exist. Selecting by domain
// or All walks the recipient bucket (O(queue)); that is acceptable for rare
// operator actions and keeps the data model free of secondary indexes.

func (s Selector) validate() error {
	criteria := s.ID != 0 || s.Domain != "" || s.Status != "" || s.Reason != "" || s.Sender != "" ||
		!s.ArrivedBefore.IsZero() || s.Tag != ""
	switch {
	case s.All && criteria:
		return fmt.Errorf("%w: a selector for the whole queue takes no other criterion", ErrInvalid)
	case !s.All && !criteria:
		return fmt.Errorf("%w: selector needs All or at least one criterion", ErrInvalid)
	case s.Status != "" && !s.Status.valid():
		return fmt.Errorf("%w: unknown status %q", ErrInvalid, s.Status)
	}
	return nil
}

// only reports whether s selects by ID and nothing else.
func (s Selector) only() bool {
	t := s
	t.ID, t.DryRun = 0, false
	return t.filter() == Filter{}
}

// filter is the part of s that List's Filter tests: all of it.
func (s Selector) filter() Filter {
	return Filter{Status: s.Status, Reason: s.Reason, Domain: s.Domain, Sender: s.Sender, Tag: s.Tag,
		ArrivedBefore: s.ArrivedBefore}
}

// errDryRun rolls back the transaction of an action run with DryRun.
var errDryRun = errors.New("queue: dry run")

// selectRcpts decodes every recipient matched by sel (any status).
// Undecodable ones are returned as problems.
func selectRcpts(tx *bolt.Tx, sel Selector) ([]Recipient, []problem) {
	var out []Recipient
	var ps []problem
	var prefix []byte
	if sel.ID != 0 {
		prefix = idKey(sel.ID)
	}
	f := sel.filter()
	byMsg := f.Sender != "" || f.Tag != "" || !f.ArrivedBefore.IsZero()
	msgOK := map[ID]bool{}
	for rec := range rcptRecords(tx, prefix, &ps) {
		r, p := rec.decode()
		if p != nil {
			ps = append(ps, *p)
			continue
		}
		if !f.matchesRecipient(&r) {
			continue
		}
		if byMsg {
			ok, seen := msgOK[r.Key.ID]
			if !seen {
				ok = matchesMessage(tx, r.Key.ID, &f)
				msgOK[r.Key.ID] = ok
			}
			if !ok {
				continue
			}
		}
		out = append(out, r)
	}
	return out, ps
}

// matchesMessage applies f's message-level filters to message id. A
// message whose record is missing or undecodable is not selected (its
// recipients are repaired by the readers that report it).
func matchesMessage(tx *bolt.Tx, id ID, f *Filter) bool {
	v := tx.Bucket(bMsgs).Get(idKey(id))
	if v == nil {
		return false
	}
	m, err := decodeMessage(id, v)
	return err == nil && f.matchesMessage(&m)
}

// modify runs fn on every recipient sel matches, in one transaction.
// after, if not nil, runs last in the same transaction. When journaled
// messages cannot enter the database (a full disk), it acts on the ones
// the database holds and returns their number with an *UnsettledError.
func (q *Queue) modify(op string, sel Selector, fn func(w *wtx, r Recipient) (bool, error), after func(w *wtx) error) (int, error) {
	if err := sel.validate(); err != nil {
		return 0, err
	}
	// Like Select: a settle that fails (a full disk) leaves the action to
	// what the database holds, which is what an operator needs to act on
	// most then; it returns with an *UnsettledError saying what it lacks.
	var serr error
	if sel.ID != 0 {
		serr = q.settleID(sel.ID)
	} else {
		serr = q.settle()
	}
	unsettled := q.unsettled(serr)
	n := 0
	err := q.update(func(w *wtx) error {
		n = 0
		rs, ps := selectRcpts(w.tx, sel)
		for _, p := range ps {
			if err := w.fix(p); err != nil {
				return err
			}
		}
		if sel.ID != 0 && w.b(bMsgs).Get(idKey(sel.ID)) == nil {
			return fmt.Errorf("message %s: %w", sel.ID, ErrNotFound)
		}
		for _, r := range rs {
			changed, err := fn(w, r)
			if err != nil {
				return err
			}
			if changed {
				n++
			}
		}
		if after != nil {
			if err := after(w); err != nil {
				return err
			}
		}
		if sel.DryRun {
			return errDryRun // counted; nothing is kept
		}
		return nil
	})
	if errors.Is(err, errDryRun) {
		err = nil
	}
	if err != nil {
		return 0, fmt.Errorf("queue: %s: %w", op, readOne(err, unsettled))
	}
	return n, unsettled
}

// Retry makes the selected Queued and Deferred recipients due at now.
func (q *Queue) Retry(sel Selector, now time.Time) (int, error) {
	return q.modify("retry", sel, func(w *wtx, r Recipient) (bool, error) {
		if r.Status != Queued && r.Status != Deferred {
			return false, nil
		}
		before := r
		r.NextAttempt = now
		return true, w.putRcpt(&before, &r)
	}, nil)
}

// Hold takes the selected Queued, Deferred and Active recipients out of the
// due index. An attempt already in flight still records its outcome through
// Apply; a non-final outcome leaves the recipient Held.
func (q *Queue) Hold(sel Selector) (int, error) {
	return q.Operate(ReasonHeld, sel, time.Time{}, nil)
}

// Release makes the selected Held recipients due at now (Queued if never
// attempted, else Deferred).
func (q *Queue) Release(sel Selector, now time.Time) (int, error) {
	return q.Operate(ReasonReleased, sel, now, nil)
}

// Decide returns the result the operator's action (ReasonHeld,
// ReasonReleased or ReasonDeleted) stores for recipient r of message m
// (head is the start of its body, at most 64 KiB): for a release, the
// Status (Queued or Deferred), Reason and NextAttempt r gets; for a hold,
// the Reason r keeps; for every action, the Events stored with it. It is
// called inside the action's transaction, which may run it again for the
// same recipient if the transaction is retried, and which a DryRun rolls
// back: the caller reports the results it returned only once Operate has
// returned. It must not call back into the Queue.
type Decide func(action string, m *Message, r Recipient, head []byte) Result

// Operate performs the operator's action on the recipients sel selects,
// in one transaction: ReasonHeld as Hold, ReasonReleased as Release (at
// now), ReasonDeleted as Delete. With decide, each recipient the action
// changes gets the result decide returns, and the events it carries;
// without, the queue's own (operatorResult), and no events: the queue
// makes none itself (the delivery engine's decide does). An
// action writes no attempt history: it is no attempt, and a recipient in
// flight (Active) keeps its in-progress attempt for the attempt's own
// outcome to end through Apply (which leaves a held recipient Held unless
// the outcome is final, and ignores one deleted meanwhile).
func (q *Queue) Operate(action string, sel Selector, now time.Time, decide Decide) (int, error) {
	switch action {
	case ReasonHeld:
		return q.modify("hold", sel, func(w *wtx, r Recipient) (bool, error) {
			if !indexed(r.Status) {
				return false, nil
			}
			return true, w.operate(action, r, now, decide)
		}, nil)
	case ReasonReleased:
		return q.modify("release", sel, func(w *wtx, r Recipient) (bool, error) {
			if r.Status != Held {
				return false, nil
			}
			return true, w.operate(action, r, now, decide)
		}, nil)
	case ReasonDeleted:
		return q.delete(sel, decide)
	}
	return 0, fmt.Errorf("%w: unknown operator action %q", ErrInvalid, action)
}

// operatorResult is the queue's own result of action on r at now: a
// released recipient is due at now, Queued if never attempted, with
// reason ReasonReleased; a held one keeps its reason (why it was not
// delivered: the status Held says the rest).
func operatorResult(action string, r Recipient, now time.Time) Result {
	res := Result{Key: r.Key, Status: r.Status, Reason: r.Reason, Reply: r.Reply, End: now}
	switch action {
	case ReasonHeld:
		res.Status = Held
	case ReasonReleased:
		res.Status, res.NextAttempt, res.Reason = Deferred, now, ReasonReleased
		if r.Attempts == 0 {
			res.Status = Queued
		}
	}
	return res
}

// operate stores the operator's action on r (see Operate): the result
// decide returns, or the queue's own.
func (w *wtx) operate(action string, r Recipient, now time.Time, decide Decide) error {
	res := operatorResult(action, r, now)
	if decide != nil {
		m, head, ok := w.messageHead(r.Key.ID)
		if ok {
			res = decide(action, &m, r, head)
		}
	}
	before := r
	switch action {
	case ReasonHeld:
		r.Status, r.Reason = Held, res.Reason
	case ReasonReleased:
		if res.Status != Queued && res.Status != Deferred {
			return fmt.Errorf("%w: release to %q for %s", ErrInvalid, res.Status, r.Key)
		}
		r.Status, r.Reason, r.NextAttempt = res.Status, res.Reason, res.NextAttempt
		if r.NextAttempt.IsZero() {
			r.NextAttempt = now
		}
	}
	if action != ReasonDeleted {
		if err := w.putRcpt(&before, &r); err != nil {
			return err
		}
	}
	if err := w.putEvents(res.Events); err != nil || action != ReasonDeleted {
		return err
	}
	return w.deleteRcpt(&r)
}

// Requeue routes the selected Queued, Deferred and Held recipients
// again, as Postfix's `postsuper -r` does: each becomes due at now
// (Queued if never attempted, else Deferred), forgets where its last
// attempt went (the sticky source address and MX, so the next attempt
// chooses both anew), and gets its domain recomputed from its address by
// domainOf (the canonical form the caller compares domains in; a record
// stored by an older version may have another spelling). Its attempts,
// greylisting counts and history stay. Active recipients are left to the
// attempt in flight. A held recipient is first released, as Operate
// releases it with decide (nil: the queue's own result and events).
func (q *Queue) Requeue(sel Selector, now time.Time, domainOf func(addr string) string, decide Decide) (int, error) {
	return q.modify("requeue", sel, func(w *wtx, r Recipient) (bool, error) {
		if r.Status == Held {
			if err := w.operate(ReasonReleased, r, now, decide); err != nil {
				return false, err
			}
			r, _ = w.getRcpt(r.Key)
		}
		if r.Status != Queued && r.Status != Deferred {
			return false, nil
		}
		before := r
		r.Status, r.NextAttempt = Deferred, now
		if r.Attempts == 0 {
			r.Status = Queued
		}
		r.SourceIP, r.MXHost, r.MXAddr = "", "", ""
		if d := domainOf(r.Addr); d != "" {
			r.Domain = d
		}
		return true, w.putRcpt(&before, &r)
	}, nil)
}

// Delete removes the selected recipients of any status, without DSNs. By ID
// alone or All, whole messages go (record, body, every recipient).
// Otherwise only the selected recipients go, and a message goes with them
// once no live recipient is left. It returns the number of recipients removed.
func (q *Queue) Delete(sel Selector) (int, error) {
	return q.Operate(ReasonDeleted, sel, time.Time{}, nil)
}

// delete is Delete, its recipients' results decided by decide (Operate).
func (q *Queue) delete(sel Selector, decide Decide) (int, error) {
	touched := map[ID]bool{}
	del := func(w *wtx, r Recipient) (bool, error) {
		touched[r.Key.ID] = true
		return true, w.operate(ReasonDeleted, r, time.Time{}, decide)
	}
	after := func(w *wtx) error {
		switch {
		case sel.ID != 0 && sel.only():
			return w.deleteMessage(sel.ID, nil)
		case sel.All: // also messages whose recipients were all quarantined
			var ids []ID
			c := w.b(bMsgs).Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				if len(k) == 8 {
					ids = append(ids, ID(binary.BigEndian.Uint64(k)))
				}
			}
			for _, id := range ids {
				if err := w.deleteMessage(id, nil); err != nil {
					return err
				}
			}
			return nil
		}
		for id := range touched {
			if err := w.finishIfDone(id); err != nil {
				return err
			}
		}
		return nil
	}
	return q.modify("delete", sel, del, after)
}

// Select returns the selected recipients that are not final, e.g. for a
// bounce-now the caller performs through Apply. History is not filled.
// Like List, it may return what the database holds with an
// *UnsettledError.
func (q *Queue) Select(sel Selector) ([]Recipient, error) {
	if err := sel.validate(); err != nil {
		return nil, err
	}
	// By ID, like Show: only a message that may still be on its way to the
	// database waits for it, and only its absence is in doubt.
	var serr error
	if sel.ID != 0 {
		serr = q.settleID(sel.ID)
	} else {
		serr = q.settle()
	}
	unsettled := q.unsettled(serr)
	var out []Recipient
	var ps []problem
	err := q.view(func(tx *bolt.Tx) error {
		if sel.ID != 0 && tx.Bucket(bMsgs).Get(idKey(sel.ID)) == nil {
			return fmt.Errorf("message %s: %w", sel.ID, ErrNotFound)
		}
		var rs []Recipient
		rs, ps = selectRcpts(tx, sel)
		for _, r := range rs {
			if !r.Status.Final() {
				out = append(out, r)
			}
		}
		return nil
	})
	q.fixup(ps)
	if err != nil {
		return nil, fmt.Errorf("queue: select: %w", readOne(err, unsettled))
	}
	return out, unsettled
}
