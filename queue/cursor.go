package queue

import (
	"bytes"
	"time"

	bolt "go.etcd.io/bbolt"
)

// DueCursor reads the due index incrementally: each Next continues after
// the last entry the previous one examined, so a scheduler that scans on
// every enqueue pays for the new entries, not for the whole backlog.
//
// What a resumed scan could miss, and why it does not: the index is
// ordered by time, and everything before the resume position was examined
// by an earlier Next. An entry can appear before that position only when a
// write transaction puts it there (an Enqueue whose arrival time is a few
// milliseconds old, an operator's Retry or Release at "now", Recover, a
// Queued result due at its end time). Every committed write lowers the
// cursor's mark to the smallest due key it put (Active leases excepted:
// Next passes over them anyway), and Next starts at the smaller of its
// position and that mark. The mark is taken before Next opens its read
// transaction, so a commit either is visible to this Next or lowers the
// mark for the following one, whose Wake signal comes after the mark.
//
// What Next itself passes over stays behind the position: entries the
// skip filter refused (the caller's business: call Reset when that reason
// ends, e.g. a full destination frees capacity) and entries that were due
// but not taken because the caller later dropped them. Reset makes the
// next Next start from the first key.
//
// A DueCursor is used by one goroutine; Close it when done.
type DueCursor struct {
	q    *Queue
	from []byte // next Next starts here (inclusive); nil: the first key
	low  []byte // smallest due key written since the last Next; guarded by q.mu
}

// DueCursor returns a new cursor positioned at the start of the due index.
func (q *Queue) DueCursor() *DueCursor {
	c := &DueCursor{q: q}
	q.mu.Lock()
	q.cursors = append(q.cursors, c)
	q.mu.Unlock()
	return c
}

// Close unregisters c; it must not be used afterwards.
func (c *DueCursor) Close() {
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
	for i, x := range c.q.cursors {
		if x == c {
			c.q.cursors = append(c.q.cursors[:i], c.q.cursors[i+1:]...)
			return
		}
	}
}

// Reset makes the next Next scan from the first key.
func (c *DueCursor) Reset() { c.from = nil }

// Rewind moves the position back (never forward) to the first entry due
// at or after t, e.g. to the first entry the caller passed over.
func (c *DueCursor) Rewind(t time.Time) {
	if k := timeKey(t); c.from != nil && bytes.Compare(k, c.from) < 0 {
		c.from = k
	}
}

// Next returns up to limit due recipients at or before now, from the
// cursor's position, in index order; a true skip passes over an entry
// before its recipient is decoded (entries that do not match their
// recipient are skipped and repaired; History is not filled). It then moves the position
// just after the last entry it examined (taken, skipped or active), or
// after the last one taken when the limit cut the walk short. skip also
// gets the entry's due time.
func (c *DueCursor) Next(now time.Time, limit int, skip func(domain string, k Key, due time.Time) bool) ([]Recipient, error) {
	c.q.mu.Lock()
	low := c.low
	c.low = nil
	c.q.mu.Unlock()
	start := c.from
	if start != nil && low != nil && bytes.Compare(low, start) < 0 {
		start = low
	}
	out, last, err := c.q.dueFrom(start, now, limit, skip)
	if err != nil {
		c.from = nil // be safe: the next Next rescans everything
		return nil, err
	}
	switch {
	case last != nil:
		c.from = append(last, 0) // the smallest key after last
	default:
		c.from = start
	}
	return out, nil
}

// noteDue lowers the write's mark to due key k.
func (w *wtx) noteDue(k []byte) {
	if w.low == nil || bytes.Compare(k, w.low) < 0 {
		w.low = k
	}
}

// lowerCursors passes a committed write's mark to every cursor. Called
// with q.mu held.
func (q *Queue) lowerCursors(low []byte) {
	if low == nil {
		return
	}
	for _, c := range q.cursors {
		if c.low == nil || bytes.Compare(low, c.low) < 0 {
			c.low = low
		}
	}
}

// dueFrom walks the due index from start (nil: the first key) up to now.
// It returns the last key examined (a copy; nil if none).
func (q *Queue) dueFrom(start []byte, now time.Time, limit int, skip func(domain string, k Key, due time.Time) bool) ([]Recipient, []byte, error) {
	var out []Recipient
	var ps []problem
	var last []byte
	end := timeKey(now)
	err := q.view(func(tx *bolt.Tx) error {
		rcpts, msgs := tx.Bucket(bRcpts), tx.Bucket(bMsgs)
		c := tx.Bucket(bDue).Cursor()
		k, v := c.First()
		if start != nil {
			k, v = c.Seek(start)
		}
		var lastK []byte
		for ; k != nil; k, v = c.Next() {
			if len(k) >= 8 && bytes.Compare(k[:8], end) > 0 {
				break
			}
			lastK = k
			if isActive(v) {
				continue
			}
			if len(v) < 1 || v[0] != flagDue { // damaged: fix puts the right value back
				ps = append(ps, problem{staleDue, bDue, bytes.Clone(k), nil})
				continue
			}
			if skip != nil && len(v) > 1 {
				if due, key, good := parseDueKey(k); good && skip(string(v[1:]), key, due) {
					continue
				}
			}
			r, p := dueRecipient(rcpts, msgs, k)
			if p != nil {
				ps = append(ps, *p)
				continue
			}
			out = append(out, r)
			if limit > 0 && len(out) >= limit {
				break
			}
		}
		if lastK != nil {
			last = bytes.Clone(lastK) // k points into the mmap, valid only inside the tx
		}
		return nil
	})
	q.fixup(ps)
	return out, last, err
}
