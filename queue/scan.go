package queue

import (
	"bytes"
	"time"

	bolt "go.etcd.io/bbolt"
)

// scan runs in Open when the stored counters cannot be trusted (see
// counters.go) or Options.FullScan asks for it. In one write transaction it
// decodes every record once (no bodies), counts them, repairs what it found
// (undecodable records, messages without a body and recipients without a
// message go to quarantine; malformed due entries are dropped) and stores
// the counters. It is O(records) (BenchmarkOpenScan100k measures it), with
// bounded memory (only problems are
// kept). Nothing else runs during Open, so the long write transaction
// holds no one up.
func (q *Queue) scan() error {
	return q.update(func(w *wtx) error {
		c := newCounts()
		var ps []problem
		ps = append(ps, scanMessages(w.tx, &c)...)
		rps := scanRcpts(w.tx, &c)
		ps = append(ps, rps...)
		ps = append(ps, scanValidate(w.tx, bHist)...)
		ps = append(ps, scanValidate(w.tx, bDests)...)
		ps = append(ps, scanDue(w.tx, rps)...)
		for _, p := range ps {
			if err := w.fix(p); err != nil {
				return err
			}
		}
		// c counted the records before the repairs; the repairs' delta
		// takes out what they removed (records that did not decode were
		// not counted).
		c.add(w.delta)
		w.setCounts(c)
		return nil
	})
}

func scanMessages(tx *bolt.Tx, c *counts) []problem {
	var ps []problem
	cur := tx.Bucket(bMsgs).Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		if err := validate(bMsgs, k, v); err != nil {
			ps = append(ps, problem{corruptRecord, bMsgs, bytes.Clone(k), err})
			continue
		}
		c.msgs++
		if !hasBody(tx, k) {
			ps = append(ps, problem{missingBody, bMsgs, bytes.Clone(k),
				errMissing("message body")})
		}
	}
	return ps
}

func scanRcpts(tx *bolt.Tx, c *counts) []problem {
	var ps []problem
	msgs := tx.Bucket(bMsgs)
	var lastID ID
	lastOK := false
	for rec := range rcptRecords(tx, nil, &ps) {
		key := rec.key
		r, p := rec.decode()
		if p != nil {
			ps = append(ps, *p)
			continue
		}
		if key.ID != lastID || !lastOK {
			lastID, lastOK = key.ID, msgs.Get(idKey(key.ID)) != nil
		}
		c.rcpt(&r, +1)
		if !lastOK {
			ps = append(ps, problem{orphanRcpt, bRcpts, bytes.Clone(rec.k), errMissing("message record")})
		}
	}
	return ps
}

func scanValidate(tx *bolt.Tx, bucket []byte) []problem {
	var ps []problem
	cur := tx.Bucket(bucket).Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		if err := validate(bucket, k, v); err != nil {
			ps = append(ps, problem{corruptRecord, bucket, bytes.Clone(k), err})
		}
	}
	return ps
}

// scanDue finds malformed due entries and those of recipients that are
// about to be quarantined (an undecodable record cannot tell where its entry
// is, so the index is searched; this only happens when there is corruption).
func scanDue(tx *bolt.Tx, bad []problem) []problem {
	var ps []problem
	gone := map[string]bool{}
	for _, p := range bad {
		if p.kind == corruptRecord {
			gone[string(p.key)] = true
		}
	}
	cur := tx.Bucket(bDue).Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		if len(k) != dueKeyLen || len(v) < 1 || (v[0] != flagDue && v[0] != flagActive) ||
			(len(gone) > 0 && gone[string(k[8:])]) {
			ps = append(ps, problem{staleDue, bDue, bytes.Clone(k), nil})
		}
	}
	return ps
}

// Recover is called once at startup, before any delivery: every Active
// recipient (an attempt was in flight when the process stopped) becomes
// Deferred and due at now, and its in-progress history entry is marked
// "interrupted". The message may or may not have reached the destination, so
// this can cause a duplicate delivery; it can never lose one (mox semantics:
// a duplicate is better than a loss). It walks the due index (Active recipients keep their entry at the
// lease), not the recipient bucket, and returns how many it recovered.
//
// When the counters say no recipient is Active (after a clean stop), it
// reads nothing: walking the index of a large queue would read it all into
// memory for no result. The counters are exact (see counters.go).
func (q *Queue) Recover(now time.Time) (int, error) {
	q.mu.Lock()
	active := q.counts.byStatus[Active]
	q.mu.Unlock()
	if active == 0 {
		return 0, nil
	}
	n := 0
	err := q.update(func(w *wtx) error {
		n = 0
		var keys [][]byte
		cur := w.b(bDue).Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			if isActive(v) {
				keys = append(keys, bytes.Clone(k))
			}
		}
		for _, dk := range keys {
			ok, err := w.recoverOne(dk, now)
			if err != nil {
				return err
			}
			if ok {
				n++
			}
		}
		return nil
	})
	return n, err
}

func (w *wtx) recoverOne(dk []byte, now time.Time) (bool, error) {
	_, k, ok := parseDueKey(dk)
	if !ok {
		return false, w.b(bDue).Delete(dk)
	}
	r, found := w.getRcpt(k)
	if !found || r.Status != Active || !bytes.Equal(expectedDueKey(&r), dk) {
		return false, w.fix(problem{staleDue, bDue, dk, nil})
	}
	before := r
	r.Status, r.NextAttempt = Deferred, now
	return true, w.putRcptHistory(&before, &r, func(h []Attempt) []Attempt {
		if i := inProgress(h); i >= 0 {
			h[i].Outcome = outcomeInterrupted
			h[i].Reason = "attempt interrupted by a restart; outcome unknown"
		}
		return h
	})
}
