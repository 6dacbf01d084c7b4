package queue

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Finished messages.
//
// A message leaves the queue when its last recipient is final, and with it
// went everything an operator asks about afterwards ("was it delivered?
// where to? after how many tries?"). Postfix answers that from its logs;
// greyrelay keeps a compact record of each finished message for a while
// instead, so that Show and List answer for it as for a queued one.
//
// The record is written by the transaction that retires the message, from
// the bytes that transaction already holds: the message record, every
// recipient record and every attempt history, copied as they are stored
// (no decoding, no new encoding on the hot path), and never the body. The
// readers decode them with the usual decoders.
//
//	finished   nanos(8)|id(8)   → finished record (keepFinished); the
//	                              bucket's sequence counts the records
//
// Records are keyed by the time they finished, so new ones are appended
// and old ones leave from the front: a commit that retires a message
// writes the last page of one bucket, and now and then the first. Show
// finds a finished message by walking the keys (no values), which an
// operator's look-up can afford; an index by ID would cost every delivery
// a second bucket's pages.
//
// The records are bounded by age (HistoryOptions.Retention) and by number
// (HistoryOptions.MaxMessages), pruned oldest first by the writer as it adds
// new ones. The queue never reads the clock: a record's time is that of the
// outcome that finished it, and age is measured against the newest one.
// Pruning waits until pruneStep records are due and then removes them
// together, so that most commits leave the first pages alone; up to
// pruneStep-1 records may stay past either bound. At most pruneMax go in
// one transaction, so that none grows with a backlog (a shortened
// retention, a lowered maximum): the backlog drains as new messages finish.

var bFinished = []byte(BucketFinished)

// finishedVersion is the layout of a finished record.
const finishedVersion = 1

// Pruning removes records once pruneStep are due, at most pruneMax in one
// transaction.
const (
	pruneStep = 16
	pruneMax  = 64
)

// HistoryOptions bound the records of finished messages (see Options).
type HistoryOptions struct {
	// Retention is how long a finished message stays visible to Show and
	// List, measured from its last outcome. Zero keeps none.
	Retention time.Duration
	// MaxMessages bounds the number of records kept; <= 0: no bound but
	// Retention.
	MaxMessages int
}

func (h HistoryOptions) enabled() bool { return h.Retention > 0 }

func finishedKey(t time.Time, id ID) []byte { return append(timeKey(t), idKey(id)...) }

// raw writes b length-prefixed, as s writes a string, without a copy to a
// string first.
func (e *enc) raw(b []byte) {
	e.u(uint64(len(b)))
	e.b = append(e.b, b...)
}

// keepFinished stores the finished record of message id, whose recipients
// rs (all final) are stored as raws, and prunes old records. It runs in the
// transaction that deletes the message, before the delete.
func (w *wtx) keepFinished(id ID, rs []Recipient, raws [][]byte) error {
	if !w.history.enabled() {
		return nil
	}
	mv := w.b(bMsgs).Get(idKey(id))
	if mv == nil {
		return nil
	}
	hist := w.b(bHist)
	hs := make([][]byte, len(rs))
	for i := range rs {
		hs[i] = hist.Get(rcptKey(rs[i].Key))
	}
	return w.storeFinished(id, mv, rs, raws, hs)
}

// storeFinished stores the finished record of message id from its
// record mv, its recipients rs (stored as raws) and their histories
// (stored as hs), and prunes old records.
func (w *wtx) storeFinished(id ID, mv []byte, rs []Recipient, raws, hs [][]byte) error {
	at := w.finishedAt
	if at.IsZero() { // an operator's delete left only final recipients
		for i := range rs {
			if rs[i].LastAttempt.After(at) {
				at = rs[i].LastAttempt
			}
		}
	}
	e := newEncV(finishedVersion)
	e.t(at)
	e.raw(mv)
	e.u(uint64(len(rs)))
	for i := range rs {
		e.u(uint64(rs[i].Key.Rcpt))
		e.raw(raws[i])
		e.raw(hs[i])
	}
	fb := w.b(bFinished)
	fb.FillPercent = 1.0 // keys mostly grow, as for messages
	if err := fb.Put(finishedKey(at, id), e.b); err != nil {
		return err
	}
	if err := fb.SetSequence(fb.Sequence() + 1); err != nil {
		return err
	}
	return w.pruneFinished(at)
}

// pruneFinished removes the oldest records when at least pruneStep of them
// are older than the retention before now or beyond the maximum number (at
// most pruneMax).
func (w *wtx) pruneFinished(now time.Time) error {
	fb := w.b(bFinished)
	n := fb.Sequence()
	over := uint64(0)
	if w.history.MaxMessages > 0 && n > uint64(w.history.MaxMessages) {
		over = n - uint64(w.history.MaxMessages)
	}
	cutoff := timeKey(now.Add(-w.history.Retention))
	if over < pruneStep && !expiredAt(fb, cutoff, pruneStep-1) {
		return nil
	}
	var old [][]byte
	c := fb.Cursor()
	for k, _ := c.First(); k != nil && len(old) < pruneMax; k, _ = c.Next() {
		if uint64(len(old)) >= over && bytes.Compare(k[:min(len(k), 8)], cutoff) >= 0 {
			break
		}
		old = append(old, bytes.Clone(k))
	}
	for _, k := range old {
		if err := fb.Delete(k); err != nil {
			return err
		}
	}
	return fb.SetSequence(n - uint64(len(old)))
}

// expiredAt reports whether the record at position i (from 0, oldest
// first) finished before cutoff.
func expiredAt(fb *bolt.Bucket, cutoff []byte, i int) bool {
	c := fb.Cursor()
	k, _ := c.First()
	for ; k != nil && i > 0; i-- {
		k, _ = c.Next()
	}
	return k != nil && bytes.Compare(k[:min(len(k), 8)], cutoff) < 0
}

// finishedRecord is a decoded finished record. Recipient histories are
// decoded only on request.
type finishedRecord struct {
	at    time.Time
	msg   Message
	rcpts []Recipient
}

func decodeFinished(id ID, b []byte, withHistory bool) (finishedRecord, error) {
	var f finishedRecord
	d := &dec{b: b}
	if v := d.byte(); d.err == nil && v != finishedVersion {
		d.fail(fmt.Sprintf("unknown finished record version %d", v))
	}
	f.at = d.t()
	mv := d.bytes(d.u())
	n := d.count()
	for i := 0; i < n && d.err == nil; i++ {
		idx := d.u()
		rv := d.bytes(d.u())
		hv := d.bytes(d.u())
		if d.err != nil {
			break
		}
		r, err := decodeRecipient(Key{id, int(idx)}, rv)
		if err != nil {
			return f, err
		}
		if withHistory && len(hv) > 0 {
			if r.History, err = decodeHistory(r.Key, hv, historyRef(&r)); err != nil {
				return f, err
			}
		}
		f.rcpts = append(f.rcpts, r)
	}
	if err := d.done(); err != nil {
		return f, err
	}
	m, err := decodeMessage(id, mv)
	if err != nil {
		return f, err
	}
	m.Finished = f.at
	f.msg = m
	return f, nil
}

// showFinished returns the finished record of id as Show does, or
// ErrNotFound.
func showFinished(tx *bolt.Tx, id ID) (Message, error) {
	want := idKey(id)
	c := tx.Bucket(bFinished).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 16 || !bytes.Equal(k[8:], want) {
			continue
		}
		f, err := decodeFinished(id, v, true)
		if err != nil {
			return Message{}, fmt.Errorf("queue: finished message %s: %w", id, err)
		}
		f.msg.Recipients = f.rcpts
		return f.msg, nil
	}
	return Message{}, fmt.Errorf("queue: message %s: %w", id, ErrNotFound)
}

// Finished returns how many finished messages are kept (see
// HistoryOptions).
func (q *Queue) Finished() (int, error) {
	var n uint64
	err := q.view(func(tx *bolt.Tx) error {
		n = tx.Bucket(bFinished).Sequence()
		return nil
	})
	return int(n), err
}

// visitFinished lists the recipients of one finished record (List with a
// final status).
func (l *lister) visitFinished(k, v []byte) {
	if len(k) != 16 {
		return
	}
	f, err := decodeFinished(ID(binary.BigEndian.Uint64(k[8:])), v, false)
	if err != nil || !l.f.matchesMessage(&f.msg) {
		return // a damaged record only hides itself; Show reports it
	}
	for i := 0; i < len(f.rcpts) && !l.stop; i++ {
		if l.f.matchesRecipient(&f.rcpts[i]) {
			l.add(&f.msg, &f.rcpts[i])
		}
	}
}
