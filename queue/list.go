package queue

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// List returns one row per recipient matching f, in key order (message ID,
// then recipient index), skipping f.Offset matches and returning at most
// f.Limit (<= 0: all); total is the number of matches. It walks the
// recipient bucket with one cursor in one short read transaction, decoding
// each record with the reflection-free codec and each message envelope once
// (recipients of a message are adjacent). History is not filled. A filter
// on a final status (Delivered, Relayed, Failed) also lists the recipients
// of finished messages that are kept (Options.History), with
// Message.Finished set: after the queued ones, in the order they finished
// (so the last page holds the latest). So does a filter on the
// application's own names for a message (Tag, EnvID, MessageID) without a
// status: looking a message up by them should find it wherever it is.
//
// When the database cannot take every message Enqueue acknowledged, List
// returns what it holds with an *UnsettledError (see there).
func (q *Queue) List(f Filter) (rows []Row, total int, err error) {
	unsettled := q.unsettled(q.settle())
	var ps []problem
	err = q.view(func(tx *bolt.Tx) error {
		l := lister{f: f, msgs: tx.Bucket(bMsgs)}
		ps = l.walk(tx, f.withFinished())
		rows, total = l.rows, l.total
		return nil
	})
	q.fixup(ps)
	if err != nil {
		return nil, 0, fmt.Errorf("queue: list: %w", err)
	}
	return rows, total, unsettled
}

// Walk calls fn for every recipient that f selects, in List's order (with
// a final status, the finished messages too), ignoring f.Offset and
// f.Limit, until fn returns false. It runs inside one read transaction: fn
// must be quick, must not call the Queue, and must not keep m or r (they
// are reused for the next call). Summaries over the whole
// queue (the admin API's shape, the status page) use it without building
// every row. Like List, it may return an *UnsettledError after walking
// what the database holds.
func (q *Queue) Walk(f Filter, fn func(m *Message, r *Recipient) bool) error {
	unsettled := q.unsettled(q.settle())
	var ps []problem
	err := q.view(func(tx *bolt.Tx) error {
		l := lister{f: f, msgs: tx.Bucket(bMsgs), fn: fn}
		ps = l.walk(tx, f.withFinished())
		return nil
	})
	q.fixup(ps)
	if err != nil {
		return fmt.Errorf("queue: walk: %w", err)
	}
	return unsettled
}

// walk visits the recipient records in key order and, with finished, then
// the finished records, oldest first; it stops early when fn says so.
func (l *lister) walk(tx *bolt.Tx, finished bool) []problem {
	var ps []problem
	for rec := range rcptRecords(tx, nil, &ps) {
		if l.stop {
			break
		}
		if p := l.visit(rec); p != nil {
			ps = append(ps, *p)
		}
	}
	if finished {
		c := tx.Bucket(bFinished).Cursor()
		for k, v := c.First(); k != nil && !l.stop; k, v = c.Next() {
			l.visitFinished(k, v)
		}
	}
	return ps
}

type lister struct {
	f          Filter
	fn         func(*Message, *Recipient) bool // instead of collecting rows; false stops
	stop       bool                            // fn returned false
	msgs       *bolt.Bucket
	id         ID
	loaded     bool // loadMessage ran for id
	msg        Message
	msgOK      bool // msg is loaded for id and passes the message filters
	msgMissing bool // id has no message record
	seen       bool
	r          Recipient // the recipient visit decoded, reused: fn gets a pointer to it
	rows       []Row
	total      int
}

// visit decodes a recipient record and takes it if it and its message
// pass the filter. With a filter on the recipient (domain, status,
// reason), the recipient is tested first and its message read only if it
// passes: such a filter usually matches few of a large queue's
// recipients, and reading and decoding each one's message took half of
// such a listing's time. Otherwise the message is read first, and the
// recipients of one that does not pass are never decoded.
func (l *lister) visit(rec rcptRecord) *problem {
	if !l.seen || rec.key.ID != l.id {
		l.seen, l.id, l.loaded = true, rec.key.ID, false
	}
	if !l.f.byRecipient() {
		if ok, p := l.message(rec); !ok {
			return p
		}
	}
	var p *problem
	if l.r, p = rec.decode(); p != nil {
		return p
	}
	if !l.f.matchesRecipient(&l.r) {
		return nil
	}
	if ok, p := l.message(rec); !ok {
		return p
	}
	l.add(&l.msg, &l.r)
	return nil
}

// message reads the message of rec (once per message) and reports whether
// it passes the message filters, or the problem it has: an undecodable
// record is reported once, a missing one for every recipient.
func (l *lister) message(rec rcptRecord) (bool, *problem) {
	if !l.loaded {
		l.loaded = true
		var p *problem
		if l.msgOK, l.msgMissing, p = l.loadMessage(rec.key.ID); p != nil {
			return false, p
		}
	}
	if l.msgMissing {
		return false, &problem{orphanRcpt, bRcpts, bytes.Clone(rec.k), errMissing("message record")}
	}
	return l.msgOK, nil
}

// byRecipient reports whether f has a recipient-level filter.
func (f *Filter) byRecipient() bool { return f.Status != "" || f.Reason != "" || f.Domain != "" }

// matchesRecipient applies the recipient-level filters.
func (f *Filter) matchesRecipient(r *Recipient) bool {
	return (f.Status == "" || r.Status == f.Status) && (f.Reason == "" || r.Reason == f.Reason) &&
		(f.Domain == "" || strings.EqualFold(r.Domain, f.Domain))
}

// add takes r (which passed the filters): it goes to fn, or is counted and
// kept if it falls within the page.
func (l *lister) add(m *Message, r *Recipient) {
	if l.fn != nil {
		l.stop = l.stop || !l.fn(m, r)
		return
	}
	l.total++
	if l.total > l.f.Offset && (l.f.Limit <= 0 || len(l.rows) < l.f.Limit) {
		l.rows = append(l.rows, Row{Message: *m, Recipient: *r})
	}
}

// loadMessage decodes message id and applies the message-level filters.
// Recipients of a missing or undecodable message are not listed; they are
// reported for repair (a missing record once per recipient, an
// undecodable one once, which quarantines the whole message).
func (l *lister) loadMessage(id ID) (ok, missing bool, p *problem) {
	v := l.msgs.Get(idKey(id))
	if v == nil {
		return false, true, nil
	}
	m, err := decodeMessage(id, v)
	if err != nil {
		return false, false, &problem{corruptRecord, bMsgs, idKey(id), err}
	}
	l.msg = m
	return l.f.matchesMessage(&m), false, nil
}

// matchesMessage applies the message-level filters.
func (f *Filter) matchesMessage(m *Message) bool {
	if f.Sender != "" {
		if f.Sender == "<>" {
			if m.From != "" {
				return false
			}
		} else if !strings.EqualFold(m.From, f.Sender) {
			return false
		}
	}
	if f.Tag != "" && m.Tag != f.Tag || f.EnvID != "" && m.EnvID != f.EnvID ||
		f.MessageID != "" && trimAngles(m.MessageID) != trimAngles(f.MessageID) {
		return false
	}
	return f.ArrivedBefore.IsZero() || m.Arrival.Before(f.ArrivedBefore)
}

// withFinished reports whether f lists finished messages too (see List).
func (f *Filter) withFinished() bool {
	return f.Status.Final() || f.Status == "" && (f.Tag != "" || f.EnvID != "" || f.MessageID != "")
}

// trimAngles drops a msg-id's angle brackets (RFC 5322 §3.6.4), which
// people leave out when they copy one.
func trimAngles(id string) string {
	return strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(id), "<"), ">")
}

// Stats returns counts by status, by reason (live recipients with a
// non-empty Reason), of messages and recipients, and the arrival time of the
// oldest queued message. The counts come from memory: Open reads them from
// the database, where every commit stores its delta with its records, and
// every commit adds the same delta in memory (see counts), so Stats costs
// the same at 1,000,000 recipients as at 10. Oldest reads the first message
// record: IDs are assigned in enqueue order, so that is the message enqueued
// first (Arrival is as the caller passed it). Like List, it may return the
// database's counts with an *UnsettledError.
func (q *Queue) Stats() (Stats, error) {
	unsettled := q.unsettled(q.settle())
	q.mu.Lock()
	s := q.counts.stats()
	q.mu.Unlock()
	err := q.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bMsgs).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 8 {
				continue
			}
			if m, err := decodeMessage(ID(binary.BigEndian.Uint64(k)), v); err == nil {
				s.Oldest = m.Arrival
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("queue: stats: %w", err)
	}
	return s, unsettled
}
