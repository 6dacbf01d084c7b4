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
//	finished    id(8)            → finished record (encodeFinished)
//	finished-at nanos(8)|id(8)   → empty; the time index, oldest first.
//	                               Its bucket sequence counts its entries.
//
// The records are bounded by age (HistoryOptions.Retention) and by number
// (HistoryOptions.MaxMessages), pruned oldest first by the writer as it adds
// new ones, a few at a time so that no transaction grows with the backlog.
// The queue never reads the clock: a record's time is that of the outcome
// that finished it, and age is measured against the newest one.

var (
	bFinished   = []byte("finished")
	bFinishedAt = []byte("finished-at")
)

// finishedVersion is the layout of a finished record.
const finishedVersion = 1

// pruneStep is how many old records one new record may remove: more than
// one, so that a backlog (a shortened retention, a lowered maximum) drains
// as new messages finish.
const pruneStep = 8

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

func finishedAtKey(t time.Time, id ID) []byte { return append(timeKey(t), idKey(id)...) }

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
	hist := w.b(bHist)
	for i := range rs {
		e.u(uint64(rs[i].Key.Rcpt))
		e.raw(raws[i])
		e.raw(hist.Get(rcptKey(rs[i].Key)))
	}
	fb, ib := w.b(bFinished), w.b(bFinishedAt)
	fb.FillPercent, ib.FillPercent = 1.0, 1.0 // keys mostly grow, as for messages
	if err := fb.Put(idKey(id), e.b); err != nil {
		return err
	}
	if err := ib.Put(finishedAtKey(at, id), nil); err != nil {
		return err
	}
	if err := ib.SetSequence(ib.Sequence() + 1); err != nil {
		return err
	}
	return w.pruneFinished(at)
}

// pruneFinished removes up to pruneStep records that are older than the
// retention before now, or beyond the maximum number.
func (w *wtx) pruneFinished(now time.Time) error {
	fb, ib := w.b(bFinished), w.b(bFinishedAt)
	n := ib.Sequence()
	cutoff := timeKey(now.Add(-w.history.Retention))
	var old [][]byte
	c := ib.Cursor()
	for k, _ := c.First(); k != nil && len(old) < pruneStep; k, _ = c.Next() {
		over := w.history.MaxMessages > 0 && n-uint64(len(old)) > uint64(w.history.MaxMessages)
		if !over && bytes.Compare(k[:min(len(k), 8)], cutoff) >= 0 {
			break
		}
		old = append(old, bytes.Clone(k))
	}
	for _, k := range old {
		if len(k) == 16 {
			if err := fb.Delete(k[8:]); err != nil {
				return err
			}
		}
		if err := ib.Delete(k); err != nil {
			return err
		}
	}
	if len(old) == 0 {
		return nil
	}
	return ib.SetSequence(n - uint64(len(old)))
}

// finishedRecord is a decoded finished record. Recipient histories are
// decoded only on request.
type finishedRecord struct {
	at    time.Time
	msg   Message
	rcpts []Recipient
	hists [][]byte
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
			if r.History, err = decodeHistory(hv, historyRef(&r)); err != nil {
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
	v := tx.Bucket(bFinished).Get(idKey(id))
	if v == nil {
		return Message{}, fmt.Errorf("queue: message %s: %w", id, ErrNotFound)
	}
	f, err := decodeFinished(id, v, true)
	if err != nil {
		return Message{}, fmt.Errorf("queue: finished message %s: %w", id, err)
	}
	f.msg.Recipients = f.rcpts
	return f.msg, nil
}

// Finished returns how many finished messages are kept (see
// HistoryOptions).
func (q *Queue) Finished() (int, error) {
	var n uint64
	err := q.view(func(tx *bolt.Tx) error {
		n = tx.Bucket(bFinishedAt).Sequence()
		return nil
	})
	return int(n), err
}

// visitFinished lists the recipients of one finished record (List with a
// final status).
func (l *lister) visitFinished(k, v []byte) {
	if len(k) != 8 {
		return
	}
	f, err := decodeFinished(ID(binary.BigEndian.Uint64(k)), v, false)
	if err != nil || !l.f.matchesMessage(&f.msg) {
		return // a damaged record only hides itself; Show reports it
	}
	for i := range f.rcpts {
		l.add(&f.msg, &f.rcpts[i])
	}
}
