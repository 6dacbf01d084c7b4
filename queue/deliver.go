package queue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// History outcomes written by the queue itself; finished attempts carry the
// resulting Status.
const (
	outcomeInProgress  = "in-progress"
	outcomeInterrupted = "interrupted"
)

// History is capped at the first historyFirst and the last historyLast
// attempts: the first ones show how a problem started, the last ones what is
// happening now; the middle of a 5-day greylisting saga adds nothing.
const (
	historyFirst = 3
	historyLast  = 20
)

// Message returns the envelope of message id, without recipients. When the
// database cannot take every message Enqueue acknowledged, a message it
// does not hold may be among them: Message then fails with an
// *UnsettledError instead of ErrNotFound (so do Show, Body and OpenBody).
func (q *Queue) Message(id ID) (Message, error) {
	unsettled := q.unsettled(q.settleID(id))
	var m Message
	var ps []problem
	err := q.view(func(tx *bolt.Tx) error {
		var err error
		m, err = getMessage(tx, id, &ps)
		return err
	})
	q.fixup(ps)
	return m, readOne(err, unsettled)
}

func getMessage(tx *bolt.Tx, id ID, ps *[]problem) (Message, error) {
	v := tx.Bucket(bMsgs).Get(idKey(id))
	if v == nil {
		return Message{}, fmt.Errorf("queue: message %s: %w", id, ErrNotFound)
	}
	m, err := decodeMessage(id, v)
	if err != nil {
		*ps = append(*ps, problem{corruptRecord, bMsgs, idKey(id), err})
		return Message{}, fmt.Errorf("queue: message %s: %w", id, err)
	}
	return m, nil
}

// Show returns message id with all its recipients, including their history.
// A message that has finished is shown from its finished record (with
// Message.Finished set) while it is kept (Options.History).
func (q *Queue) Show(id ID) (Message, error) {
	unsettled := q.unsettled(q.settleID(id))
	var m Message
	var ps []problem
	err := q.view(func(tx *bolt.Tx) error {
		var err error
		if tx.Bucket(bMsgs).Get(idKey(id)) == nil {
			m, err = showFinished(tx, id)
			return err
		}
		if m, err = getMessage(tx, id, &ps); err != nil {
			return err
		}
		hist, marks := tx.Bucket(bHist), tx.Bucket(bSalvaged)
		for rec := range rcptRecords(tx, idKey(id), &ps) {
			r, p := rec.decode()
			if p != nil {
				ps = append(ps, *p)
				continue
			}
			if marks != nil {
				if v := marks.Get(rec.k); len(v) == 8 {
					r.Salvaged = time.Unix(0, int64(binary.BigEndian.Uint64(v))).UTC()
				}
			}
			if hv := hist.Get(rec.k); hv != nil {
				if r.History, err = decodeHistory(r.Key, hv, historyRef(&r)); err != nil {
					ps = append(ps, problem{corruptRecord, bHist, bytes.Clone(rec.k), err})
				}
			}
			m.Recipients = append(m.Recipients, r)
		}
		return nil
	})
	q.fixup(ps)
	return m, readOne(err, unsettled)
}

// Body returns a copy of the stored body of message id. A message whose
// record exists but whose body is missing cannot be delivered: it is moved
// to quarantine, and Body fails with ErrNotFound as for a deleted one.
func (q *Queue) Body(id ID) ([]byte, error) {
	c, err := q.OpenBody(id) // which settles
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if c.unmap == nil {
		return c.b, nil // already a copy
	}
	return bytes.Clone(c.b), nil
}

// OpenBody opens the body of message id for reading: a copy of a body kept
// in the database, or a read-only mapping of a spooled one, so that sending
// a large message does not copy it onto the heap. Close it when done.
// Errors are as for Body.
func (q *Queue) OpenBody(id ID) (*Content, error) {
	unsettled := q.unsettled(q.settleID(id))
	var body []byte
	var spooled string
	var m Message
	var ps []problem
	err := q.view(func(tx *bolt.Tx) error {
		mv := tx.Bucket(bMsgs).Get(idKey(id))
		if mv == nil {
			return readOne(fmt.Errorf("queue: body %s: %w", id, ErrNotFound), unsettled)
		}
		var err error
		if m, err = decodeMessageRec(id, mv); err != nil {
			ps = append(ps, problem{corruptRecord, bMsgs, idKey(id), err})
			return fmt.Errorf("queue: body %s: %w (%v)", id, ErrNotFound, err)
		}
		v := tx.Bucket(bBodies).Get(idKey(id))
		if v == nil {
			if name := tx.Bucket(bSpool).Get(idKey(id)); name != nil {
				spooled = string(name)
				return nil
			}
			ps = append(ps, problem{missingBody, bMsgs, idKey(id), errMissing("message body")})
			return fmt.Errorf("queue: body %s: %w", id, ErrNotFound)
		}
		if err := checkBody(&m, v); err != nil {
			ps = append(ps, problem{badBody, bMsgs, idKey(id), err})
			return fmt.Errorf("queue: body %s: %w (%v)", id, ErrNotFound, err)
		}
		body = bytes.Clone(v) // v points into the mmap, valid only inside the tx
		return nil
	})
	q.fixup(ps)
	if err != nil {
		return nil, err
	}
	if spooled == "" {
		return &Content{b: body}, nil
	}
	c, err := q.openSpooled(spooled)
	if errors.Is(err, fs.ErrNotExist) {
		// The database names a file that is gone (removed by hand, a
		// restore that missed it): as for a missing body, the message is
		// quarantined rather than tried again and again.
		q.quarantineSpooled(id, spooled, err)
		return nil, fmt.Errorf("queue: body %s: %w (%v)", id, ErrNotFound, err)
	}
	if err != nil {
		return nil, fmt.Errorf("queue: body %s: %w", id, err)
	}
	if err := checkBody(&m, c.b); err != nil {
		c.Close()
		q.quarantineSpooled(id, spooled, err)
		return nil, fmt.Errorf("queue: body %s: %w (%v)", id, ErrNotFound, err)
	}
	return c, nil
}

// quarantineSpooled quarantines message id if its body is still the spool
// file name, which could not be found.
func (q *Queue) quarantineSpooled(id ID, name string, cause error) {
	_ = q.update(func(w *wtx) error {
		if string(w.b(bSpool).Get(idKey(id))) == name {
			w.quarantineMessage(id, fmt.Errorf("%w: spool file %s: %v", errCorrupt, name, cause))
		}
		return nil
	})
}

// NextDue returns the time of the earliest due entry, skipping the leases of
// Active recipients; ok is false when nothing is waiting. A result in the
// past means work is due now.
func (q *Queue) NextDue() (t time.Time, ok bool, err error) {
	err = q.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bDue).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if isActive(v) {
				continue
			}
			if dt, _, good := parseDueKey(k); good {
				t, ok = dt, true
				return nil
			}
		}
		return nil
	})
	return t, ok, err
}

// dueRecipient loads and checks the recipient a due entry points at.
func dueRecipient(rcpts, msgs *bolt.Bucket, dk []byte) (Recipient, *problem) {
	stale := &problem{staleDue, bDue, bytes.Clone(dk), nil}
	_, key, ok := parseDueKey(dk)
	if !ok {
		return Recipient{}, stale
	}
	rk := rcptKey(key)
	v := rcpts.Get(rk)
	if v == nil {
		return Recipient{}, stale
	}
	r, err := decodeRecipient(key, v)
	if err != nil {
		return Recipient{}, &problem{corruptRecord, bRcpts, rk, err}
	}
	if !bytes.Equal(expectedDueKey(&r), dk) || r.Status == Active {
		return Recipient{}, stale
	}
	mv := msgs.Get(idKey(key.ID))
	if mv == nil {
		return Recipient{}, &problem{orphanRcpt, bRcpts, rk, errMissing("message record")}
	}
	// A record that does not decode leaves MessageRead false: whoever
	// loads the message finds out.
	if m, err := decodeMessage(key.ID, mv); err == nil {
		r.RequireTLS, r.TLSOptional, r.MessageRead = m.RequireTLS, m.TLSOptional, true
	}
	return r, nil
}

// Begin records an attempt before it is made (mox): for every key the
// recipient becomes Active, Attempts is incremented, FirstAttempt (if unset)
// and LastAttempt are set to s.Time, the route (SourceIP, MXHost, MXAddr) is
// stored, an "in-progress" Attempt is appended to the history, and the due
// entry moves to s.LeaseUntil (NextAttempt = LeaseUntil while Active). All
// keys change in one transaction, or none: a missing key fails with
// ErrNotFound, a recipient that is not Queued or Deferred with ErrState.
// Due and NextDue never return an Active recipient, even after its lease has
// passed (the attempt may still be running); only Apply, Hold or Recover end
// the Active state.
func (q *Queue) Begin(s Start) error {
	if len(s.Keys) == 0 || s.Time.IsZero() || s.LeaseUntil.IsZero() {
		return fmt.Errorf("%w: Begin needs keys, a start time and a lease", ErrInvalid)
	}
	err := q.submit(len(s.Keys), 0, func(w *wtx) error {
		if err := w.checkBegin(s.Keys); err != nil {
			return &refused{err}
		}
		for _, k := range s.Keys {
			if err := w.begin(k, &s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("queue: begin: %w", err)
	}
	return nil
}

// checkBegin refuses a Begin before it writes anything (it shares its
// transaction with other calls): every key must exist, be Queued or
// Deferred, and appear once. Only a record that fails to decode is moved to
// quarantine here; that repair is kept even though the call fails.
func (w *wtx) checkBegin(keys []Key) error {
	seen := make(map[Key]bool, len(keys))
	for _, k := range keys {
		r, ok := w.getRcpt(k)
		if !ok {
			return fmt.Errorf("recipient %s: %w", k, ErrNotFound)
		}
		if seen[k] {
			return fmt.Errorf("recipient %s given twice: %w", k, ErrState)
		}
		seen[k] = true
		if r.Status != Queued && r.Status != Deferred {
			return fmt.Errorf("recipient %s is %s: %w", k, r.Status, ErrState)
		}
	}
	return nil
}

func (w *wtx) begin(k Key, s *Start) error {
	r, ok := w.getRcpt(k)
	if !ok {
		return fmt.Errorf("recipient %s: %w", k, ErrNotFound)
	}
	if r.Status != Queued && r.Status != Deferred {
		return fmt.Errorf("recipient %s is %s: %w", k, r.Status, ErrState)
	}
	before := r
	return w.putRcptHistory(&before, &r, beginRcpt(&r, s))
}

// beginRcpt makes r Active for the attempt s starts (see Begin) and
// returns the edit that adds the attempt to its history.
func beginRcpt(r *Recipient, s *Start) func([]Attempt) []Attempt {
	r.Status = Active
	r.Attempts++
	r.LastAttempt = s.Time
	if r.FirstAttempt.IsZero() {
		r.FirstAttempt = s.Time
	}
	r.SourceIP, r.MXHost, r.MXAddr = s.SourceIP, s.MXHost, s.MXAddr
	r.NextAttempt = s.LeaseUntil
	return func(h []Attempt) []Attempt {
		return append(h, Attempt{Start: s.Time, SourceIP: s.SourceIP, MXHost: s.MXHost,
			MXAddr: s.MXAddr, Outcome: outcomeInProgress})
	}
}

// inProgress returns the index of the last in-progress attempt, or -1.
func inProgress(h []Attempt) int {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Outcome == outcomeInProgress {
			return i
		}
	}
	return -1
}

// Apply records attempt outcomes, enqueues DSNs and stores destination
// state in ONE transaction, so a failed recipient and its bounce commit
// together or not at all. Final recipients leave the due index; Deferred and
// Queued ones are due at Result.NextAttempt (zero: Result.End). A recipient
// the operator held meanwhile stays Held unless the result is final. Results
// for recipients that no longer exist (deleted by the operator) or are
// already final are ignored. A message whose recipients are all final is
// deleted with its body. Apply returns the IDs of the enqueued DSNs.
func (q *Queue) Apply(u Update) ([]ID, error) {
	return q.ApplyAsync(u).Wait()
}

func validateUpdate(u *Update) error {
	for _, r := range u.Results {
		switch r.Status {
		case Deferred, Delivered, Relayed, Failed, Queued:
		default:
			return fmt.Errorf("%w: result status %q for %s", ErrInvalid, r.Status, r.Key)
		}
	}
	for i := range u.DSNs {
		if err := validateNew(&u.DSNs[i]); err != nil {
			return err
		}
	}
	for _, d := range u.Destinations {
		if strings.TrimSpace(d.Domain) == "" {
			return fmt.Errorf("%w: destination without domain", ErrInvalid)
		}
	}
	return nil
}

// apply stores one result; it reports whether the recipient became final.
// A non-nil start begins the recipient first if it is Queued or Deferred
// (Update.Starts), in memory: the record is written once, with the
// outcome, instead of once Active and again with the outcome.
func (w *wtx) apply(res *Result, start *Start) (bool, error) {
	r, ok := w.loadRcpt(res.Key)
	if !ok || r.Status.Final() {
		return false, nil
	}
	if err := w.putEvents(res.Events); err != nil {
		return false, err
	}
	before := r
	var begun func([]Attempt) []Attempt
	if start != nil && (r.Status == Queued || r.Status == Deferred) {
		begun = beginRcpt(&r, start)
	}
	if r.Status != Held || res.Status.Final() {
		r.Status = res.Status
	}
	r.Reason, r.Reply = res.Reason, res.Reply
	r.FirstGreylisted, r.GreylistTries, r.DelayWarnings = res.FirstGreylisted, res.GreylistTries, res.DelayWarnings
	setIf(&r.SourceIP, res.SourceIP)
	setIf(&r.MXHost, res.MXHost)
	setIf(&r.MXAddr, res.MXAddr)
	switch {
	case r.Status.Final():
		r.NextAttempt = time.Time{}
	case !res.NextAttempt.IsZero():
		r.NextAttempt = res.NextAttempt
	default:
		r.NextAttempt = res.End
	}
	err := w.storeOutcome(&before, &r, func(h []Attempt) []Attempt {
		if begun != nil {
			h = begun(h)
		}
		i := inProgress(h)
		if i < 0 { // an outcome without Begin, e.g. the operator's bounce-now
			h = append(h, Attempt{Start: res.End, SourceIP: r.SourceIP, MXHost: r.MXHost, MXAddr: r.MXAddr})
			i = len(h) - 1
		}
		a := &h[i]
		a.End, a.Stage, a.Outcome, a.Reason, a.Reply = res.End, res.Stage, string(res.Status), res.Reason, res.Reply
		setIf(&a.SourceIP, res.SourceIP)
		setIf(&a.MXHost, res.MXHost)
		setIf(&a.MXAddr, res.MXAddr)
		setIf(&a.TLS, res.TLS)
		return h
	})
	return r.Status.Final(), err
}

func setIf(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}
