package queue

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// counts are the Stats counters. They live in memory and in the counts
// bucket:
//
//	counts  "txid"             → id of the last transaction that kept them (8 bytes)
//	        "msgs", "rcpts"    → count
//	        "status/"+status   → count of recipients in that status
//	        "reason/"+reason   → count of live recipients with that Reason
//
// Every write transaction goes through Queue.update, which accumulates a
// delta of the counters (see wtx) and adds it to the stored ones inside the
// same transaction, then to the in-memory ones after the commit. bbolt
// commits a transaction whole or not at all, so the stored counters cannot
// drift from the records they count, and Open reads them instead of
// decoding every record.
//
// The "txid" entry detects the writes that did not keep them: bbolt numbers
// its write transactions, and each of ours stores its own number. If the
// stored number is not that of the last committed transaction, something
// else wrote the file (an older greyrelay, bbolt's tools, a test poking
// records), and Open counts the records again. So does a database written
// before the counters were stored, or one whose counts bucket does not
// decode.
type counts struct {
	byStatus map[Status]int
	byReason map[string]int // live (non-final) recipients with a Reason
	msgs     int
	rcpts    int
}

func newCounts() counts {
	return counts{byStatus: map[Status]int{}, byReason: map[string]int{}}
}

// rcpt adds (sign=+1) or removes (sign=-1) one recipient.
func (c *counts) rcpt(r *Recipient, sign int) {
	c.rcpts += sign
	c.byStatus[r.Status] += sign
	if !r.Status.Final() && r.Reason != "" {
		c.byReason[r.Reason] += sign
	}
}

// add merges d into c and drops zero entries so the maps stay small.
func (c *counts) add(d counts) {
	c.msgs += d.msgs
	c.rcpts += d.rcpts
	for k, v := range d.byStatus {
		if c.byStatus[k] += v; c.byStatus[k] == 0 {
			delete(c.byStatus, k)
		}
	}
	for k, v := range d.byReason {
		if c.byReason[k] += v; c.byReason[k] == 0 {
			delete(c.byReason, k)
		}
	}
}

// minus returns c - base.
func (c counts) minus(base counts) counts {
	d := newCounts()
	d.add(c)
	neg := counts{msgs: -base.msgs, rcpts: -base.rcpts,
		byStatus: make(map[Status]int, len(base.byStatus)), byReason: make(map[string]int, len(base.byReason))}
	for k, v := range base.byStatus {
		neg.byStatus[k] = -v
	}
	for k, v := range base.byReason {
		neg.byReason[k] = -v
	}
	d.add(neg)
	return d
}

func (c *counts) stats() Stats {
	s := Stats{ByStatus: make(map[Status]int, len(c.byStatus)),
		ByReason: make(map[string]int, len(c.byReason)), Messages: c.msgs, Recipients: c.rcpts}
	for k, v := range c.byStatus {
		s.ByStatus[k] = v
	}
	for k, v := range c.byReason {
		s.ByReason[k] = v
	}
	return s
}

// Keys of the counts bucket.
const (
	countTxid        = "txid"
	countMsgs        = "msgs"
	countRcpts       = "rcpts"
	countStatusPfx   = "status/"
	countReasonPfx   = "reason/"
	countsMaxEntries = 1 << 16 // a sanity bound for a bucket Open reads whole
)

// each calls fn for every non-zero counter, by its key in the counts bucket.
func (c *counts) each(fn func(key string, n int) error) error {
	if err := fn(countMsgs, c.msgs); err != nil {
		return err
	}
	if err := fn(countRcpts, c.rcpts); err != nil {
		return err
	}
	for k, v := range c.byStatus {
		if err := fn(countStatusPfx+string(k), v); err != nil {
			return err
		}
	}
	for k, v := range c.byReason {
		if err := fn(countReasonPfx+k, v); err != nil {
			return err
		}
	}
	return nil
}

// set stores n under key, as loadCounts reads it back.
func (c *counts) set(key string, n int) bool {
	switch {
	case key == countMsgs:
		c.msgs = n
	case key == countRcpts:
		c.rcpts = n
	case strings.HasPrefix(key, countStatusPfx):
		s := Status(key[len(countStatusPfx):])
		if !s.valid() {
			return false
		}
		c.byStatus[s] = n
	case strings.HasPrefix(key, countReasonPfx) && len(key) > len(countReasonPfx):
		c.byReason[key[len(countReasonPfx):]] = n
	default:
		return false
	}
	return true
}

// consistent reports whether c could describe a queue: nothing negative,
// and the recipients by status add up to the recipient count.
func (c *counts) consistent() bool {
	if c.msgs < 0 || c.rcpts < 0 {
		return false
	}
	sum := 0
	for _, v := range c.byStatus {
		if v <= 0 {
			return false
		}
		sum += v
	}
	for _, v := range c.byReason {
		if v <= 0 || v > c.rcpts {
			return false
		}
	}
	return sum == c.rcpts
}

func encodeCount(n int) []byte { e := newEnc(); e.i(int64(n)); return e.b }

func decodeCount(b []byte) (int, error) {
	d := newDec(b)
	n := d.i()
	return int(n), d.done()
}

func txidValue(id int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(id)) }

// loadCounts reads the stored counters. ok is false unless they were kept
// by the transaction with id txid (the last committed one when called from a
// read transaction, the one before it from a write transaction), decode and
// add up.
func loadCounts(b *bolt.Bucket, txid int) (c counts, ok bool) {
	c = newCounts()
	if b == nil || !bytes.Equal(b.Get([]byte(countTxid)), txidValue(txid)) {
		return c, false
	}
	n := 0
	cur := b.Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		if n++; n > countsMaxEntries {
			return c, false
		}
		if string(k) == countTxid {
			continue
		}
		x, err := decodeCount(v)
		if err != nil || !c.set(string(k), x) {
			return newCounts(), false
		}
	}
	if !c.consistent() {
		return newCounts(), false
	}
	return c, true
}

// saveCounts adds the transaction's delta to the stored counters and stamps
// them with the transaction's id; after a recount (w.reset) it replaces them.
// Stored counters that were already stale stay so (and unstamped): only a
// recount, at the next Open, makes them valid again.
func (w *wtx) saveCounts() error {
	b := w.b(bCounts)
	if w.reset != nil {
		if err := clearBucket(b); err != nil {
			return err
		}
		err := w.reset.each(func(key string, n int) error {
			if n == 0 {
				return nil
			}
			return b.Put([]byte(key), encodeCount(n))
		})
		if err != nil {
			return err
		}
		return b.Put([]byte(countTxid), txidValue(w.tx.ID()))
	}
	if !bytes.Equal(b.Get([]byte(countTxid)), txidValue(w.tx.ID()-1)) {
		return nil
	}
	damaged := false
	err := w.delta.each(func(key string, d int) error {
		if d == 0 || damaged {
			return nil
		}
		var n int
		if v := b.Get([]byte(key)); v != nil {
			var err error
			if n, err = decodeCount(v); err != nil {
				damaged = true
				return nil
			}
		}
		if n += d; n == 0 {
			return b.Delete([]byte(key))
		}
		return b.Put([]byte(key), encodeCount(n))
	})
	if err != nil {
		return err
	}
	if damaged { // leave them unstamped: the next Open counts again
		return b.Delete([]byte(countTxid))
	}
	return b.Put([]byte(countTxid), txidValue(w.tx.ID()))
}

// setCounts makes c the counters as of the end of this transaction: the
// stored ones are replaced, and the delta becomes what turns the counters
// as they were before this transaction into c, so that the in-memory
// counters follow when it commits. Open's in-memory counters start from
// the stored ones if they were valid and from zero otherwise, as here.
func (w *wtx) setCounts(c counts) {
	before, _ := loadCounts(w.b(bCounts), w.tx.ID()-1)
	w.delta = c.minus(before)
	w.reset = &c
	w.recount = false
}

// countAll counts the records as Open's scan does (records that do not
// decode are not counted). It is used after a record whose contribution
// to the counters is unknown (it no longer decodes) was quarantined.
func countAll(tx *bolt.Tx) counts {
	c := newCounts()
	scanMessages(tx, &c)
	scanRcpts(tx, &c)
	return c
}

func clearBucket(b *bolt.Bucket) error {
	var keys [][]byte
	cur := b.Cursor()
	for k, _ := cur.First(); k != nil; k, _ = cur.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return fmt.Errorf("queue: clear counters: %w", err)
		}
	}
	return nil
}
