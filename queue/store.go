package queue

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Buckets. Keys are big-endian so that bbolt's byte order is numeric order:
//
//	msgs       id(8)                      → message record
//	bodies     id(8)                      → raw body, written once
//	rcpts      id(8)|rcpt(4)              → recipient record
//	hist       id(8)|rcpt(4)              → attempt history of that recipient
//	due        nanos(8)|id(8)|rcpt(4)     → flag byte: 'd' due, 'a' active lease
//	dests      lower(domain)              → destination record
//	quarantine <bucket>/key               → raw bytes that failed to decode
//	counts     name                       → a Stats counter (see counters.go)
//	spool      id(8)                      → name of the body's file in the spool (spool.go)
//	journal    "applied", "salt", "format" → the intake journal's state (journaler.go), the file's format (format.go)
//	finished   nanos(8)|id(8)             → record of a finished message (finished.go)
//
// Invariant: a recipient has exactly one due entry, at NextAttempt, iff its
// status is Queued, Deferred or Active (flag 'a'). Held and final recipients
// have none. Readers verify each entry against its record and drop stale ones.
var (
	bMsgs       = []byte(BucketMessages)
	bBodies     = []byte(BucketBodies)
	bRcpts      = []byte(BucketRecipients)
	bHist       = []byte(BucketHistory)
	bDue        = []byte(BucketDue)
	bDests      = []byte(BucketDests)
	bQuarantine = []byte(BucketQuarantine)
	bCounts     = []byte("counts")
	bSpool      = []byte(BucketSpool)
	allBuckets  = [][]byte{bMsgs, bBodies, bRcpts, bHist, bDue, bDests, bQuarantine, bCounts, bSpool, bJournal,
		bFinished}
)

// bSalvaged marks the recipients queue/salvage took from an older copy of
// their record (rcptKey → the salvage's time, Unix nanoseconds). It is
// created by queue/salvage only; deleteRcpt removes a recipient's mark.
var bSalvaged = []byte(BucketSalvaged)

const (
	flagDue    = 'd'
	flagActive = 'a'
	rcptKeyLen = 12
	dueKeyLen  = 20
)

// The keys are made in one allocation each: they are built several times
// for every message a transaction touches.

func idKey(id ID) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(id)) }

func rcptKey(k Key) []byte { return appendRcptKey(make([]byte, 0, rcptKeyLen), k) }

func appendRcptKey(b []byte, k Key) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(b, uint64(k.ID)), uint32(k.Rcpt))
}

func parseRcptKey(b []byte) (Key, bool) {
	if len(b) != rcptKeyLen {
		return Key{}, false
	}
	return Key{ID(binary.BigEndian.Uint64(b)), int(binary.BigEndian.Uint32(b[8:]))}, true
}

// timeKey is t as 8 sortable bytes: Unix nanoseconds clamped to [0, MaxInt64].
func timeKey(t time.Time) []byte { return appendTimeKey(make([]byte, 0, 8), t) }

func appendTimeKey(b []byte, t time.Time) []byte {
	var n int64
	switch {
	case t.IsZero() || t.Before(time.Unix(0, 0)):
		n = 0
	case t.After(time.Unix(0, math.MaxInt64)):
		n = math.MaxInt64
	default:
		n = t.UnixNano()
	}
	return binary.BigEndian.AppendUint64(b, uint64(n))
}

func dueKey(t time.Time, k Key) []byte {
	return appendRcptKey(appendTimeKey(make([]byte, 0, dueKeyLen), t), k)
}

func parseDueKey(b []byte) (time.Time, Key, bool) {
	if len(b) != dueKeyLen {
		return time.Time{}, Key{}, false
	}
	k, _ := parseRcptKey(b[8:])
	return time.Unix(0, int64(binary.BigEndian.Uint64(b))), k, true
}

// indexed reports whether a recipient in state s has a due entry.
func indexed(s Status) bool { return s == Queued || s == Deferred || s == Active }

// expectedDueKey is the due entry r must have, or nil.
func expectedDueKey(r *Recipient) []byte {
	if !indexed(r.Status) {
		return nil
	}
	return dueKey(r.NextAttempt, r.Key)
}

func dueFlag(r *Recipient) byte {
	if r.Status == Active {
		return flagActive
	}
	return flagDue
}

// dueValue is a due entry's value: the flag, then the lower-cased domain, so
// that the scheduler can pass over a busy destination's entries without
// decoding its recipients (a storm of deferrals for one dead domain must not
// cost every scan for the healthy ones).
func dueValue(r *Recipient) []byte {
	return append([]byte{dueFlag(r)}, strings.ToLower(r.Domain)...)
}

// isActive reports whether a due entry value marks an attempt in flight.
func isActive(v []byte) bool { return len(v) >= 1 && v[0] == flagActive }

func errMissing(what string) error { return fmt.Errorf("%w: missing %s", errCorrupt, what) }

// quarantined is one record moved to the quarantine bucket.
type quarantined struct {
	bucket string
	key    []byte
	err    error
}

// wtx wraps a write transaction. It keeps the due index and the counter delta
// in step with every recipient change, and remembers quarantined records so
// they are reported after the commit.
type wtx struct {
	tx      *bolt.Tx
	delta   counts
	recount bool    // a record whose counts are unknown left: count again before the commit
	reset   *counts // set by setCounts: the counters replace the stored ones
	quar    []quarantined
	wake    bool           // the change may create earlier due work
	low     []byte         // smallest non-active due key put (see DueCursor)
	unlink  []string       // spool files to remove once the commit is done
	newID   func() ID      // Queue.newID: the next message ID
	settled []*insertBatch // journaled batches this transaction inserts
	// history bounds the records of finished messages; finishedAt is
	// the time of the outcomes this transaction stores (zero: none).
	history    HistoryOptions
	finishedAt time.Time
	events     eventTx // outbox records (outbox.go)
	// finish names the journaled messages this transaction both inserts
	// and finishes; it holds them in held instead (finish.go).
	finish map[ID]bool
	held   map[ID]*heldMessage
}

func (w *wtx) b(name []byte) *bolt.Bucket { return w.tx.Bucket(name) }

// setFillPercent tells bbolt how full to pack the pages it splits. bbolt
// keeps a Bucket per transaction, so this holds for the whole transaction.
// Messages, bodies and recipients are inserted with keys that only grow
// (IDs come from a sequence): bbolt's default of half-full pages suits
// random inserts and leaves these half empty. Recipient records then grow
// (about threefold at the first attempt), and a grown page splits into
// full pages and one partial one; at 1,000,000 recipients this packs the
// bucket 71% full instead of 57% (bench scale), and rewrites of similar
// size do not split again (measured with varying reply texts). The due
// index gets random inserts (jittered retry times, leases) and history
// records grow with every attempt, so they keep the default: packed full,
// each later insert or growth splits off a nearly empty page.
func (w *wtx) setFillPercent() {
	w.b(bMsgs).FillPercent = 1.0
	w.b(bBodies).FillPercent = 1.0
	w.b(bRcpts).FillPercent = 1.0
}

// getRcpt loads a recipient. A record that fails to decode is quarantined and
// reported as missing, so one bad record cannot block an operation.
func (w *wtx) getRcpt(k Key) (Recipient, bool) {
	v := w.b(bRcpts).Get(rcptKey(k))
	if v == nil {
		return Recipient{}, false
	}
	r, err := decodeRecipient(k, v)
	if err != nil {
		w.quarantineRcpt(k, err)
		return Recipient{}, false
	}
	return r, true
}

// putRcpt stores after, replacing before (nil for a new recipient), and moves
// the due entry and the counters accordingly.
func (w *wtx) putRcpt(before, after *Recipient) error { return w.putRcptHistory(before, after, nil) }

// putRcptHistory is putRcpt that also lets edit change the recipient's
// attempt history (nil: no change). A history is stored against its
// recipient record (encodeHistory), so it is rewritten whenever the fields
// it refers to change, edited or not.
func (w *wtx) putRcptHistory(before, after *Recipient, edit func([]Attempt) []Attempt) error {
	if err := w.storeRcpt(before, after); err != nil {
		return err
	}
	if edit == nil && (before == nil || sameHistoryRef(before, after)) {
		return nil
	}
	return w.rewriteHistory(before, after, edit)
}

func sameHistoryRef(a, b *Recipient) bool {
	ra, rb := historyRef(a), historyRef(b)
	return sameMask(&ra, &rb)|zeroEnd|sameStage == maskAll
}

// rewriteHistory decodes the history against before, lets edit change it,
// caps it and stores it against after. An undecodable history is
// quarantined (and, if edited, restarted empty).
func (w *wtx) rewriteHistory(before, after *Recipient, edit func([]Attempt) []Attempt) error {
	hb, rk := w.b(bHist), rcptKey(after.Key)
	v := hb.Get(rk)
	if v == nil && edit == nil {
		return nil
	}
	var h []Attempt
	if v != nil {
		var err error
		if h, err = decodeHistory(after.Key, v, historyRef(before)); err != nil {
			w.move(bHist, rk, err)
			if edit == nil {
				return nil
			}
			h = nil
		}
	}
	if edit != nil {
		h = edit(h)
	}
	return hb.Put(rk, encodeHistory(after.Key, capHistory(h), historyRef(after)))
}

// capHistory keeps the first historyFirst and the last historyLast
// attempts of h.
func capHistory(h []Attempt) []Attempt {
	if len(h) > historyFirst+historyLast {
		h = append(h[:historyFirst:historyFirst], h[len(h)-historyLast:]...)
	}
	return h
}

// storeRcpt is putRcpt without the history.
func (w *wtx) storeRcpt(before, after *Recipient) error {
	due := w.b(bDue)
	if before != nil {
		w.delta.rcpt(before, -1)
		if k := expectedDueKey(before); k != nil {
			if err := due.Delete(k); err != nil {
				return err
			}
		}
	}
	if err := w.b(bRcpts).Put(rcptKey(after.Key), encodeRecipient(after)); err != nil {
		return err
	}
	w.delta.rcpt(after, +1)
	if k := expectedDueKey(after); k != nil {
		if after.Status != Active {
			w.wake = true
			w.noteDue(k)
		}
		return due.Put(k, dueValue(after))
	}
	return nil
}

// deleteRcpt removes a recipient, its due entry and its history.
func (w *wtx) deleteRcpt(r *Recipient) error {
	w.delta.rcpt(r, -1)
	if k := expectedDueKey(r); k != nil {
		if err := w.b(bDue).Delete(k); err != nil {
			return err
		}
	}
	k := rcptKey(r.Key)
	if err := w.b(bHist).Delete(k); err != nil {
		return err
	}
	if b := w.b(bSalvaged); b != nil {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return w.b(bRcpts).Delete(k)
}

// rcptsOf returns the keys and raw values of all recipients of id.
// Values are copied: the caller may modify the bucket afterwards.
func (w *wtx) rcptsOf(id ID) (keys []Key, vals [][]byte) {
	var malformed []problem // reported by the scans that read recipients
	for rec := range rcptRecords(w.tx, idKey(id), &malformed) {
		keys = append(keys, rec.key)
		vals = append(vals, bytes.Clone(rec.v))
	}
	return keys, vals
}

// finishIfDone deletes message id (record, body, recipients, histories) when
// none of its recipients is live any more, keeping its finished record
// (finished.go). Bodies are never rewritten; this is the only place besides
// Delete that removes one.
func (w *wtx) finishIfDone(id ID) error {
	if h := w.held[id]; h != nil {
		return w.finishHeld(id, h)
	}
	keys, vals := w.rcptsOf(id)
	var rs []Recipient
	var raws [][]byte
	for i, k := range keys {
		r, err := decodeRecipient(k, vals[i])
		if err != nil {
			w.quarantineRcpt(k, err)
			continue
		}
		if !r.Status.Final() {
			return nil
		}
		rs, raws = append(rs, r), append(raws, vals[i])
	}
	if err := w.keepFinished(id, rs, raws); err != nil {
		return err
	}
	return w.deleteMessage(id, rs)
}

// deleteMessage removes message id with the already decoded recipients rs.
func (w *wtx) deleteMessage(id ID, rs []Recipient) error {
	for i := range rs {
		if err := w.deleteRcpt(&rs[i]); err != nil {
			return err
		}
	}
	w.uncountMessage(id)
	if err := w.b(bBodies).Delete(idKey(id)); err != nil {
		return err
	}
	if name := w.b(bSpool).Get(idKey(id)); name != nil {
		w.unlink = append(w.unlink, string(name))
		if err := w.b(bSpool).Delete(idKey(id)); err != nil {
			return err
		}
	}
	return w.b(bMsgs).Delete(idKey(id))
}

// move copies bucket[key] into the quarantine bucket and deletes it.
func (w *wtx) move(bucket []byte, key []byte, err error) {
	src := w.b(bucket)
	v := src.Get(key)
	if v == nil {
		return
	}
	qb, qerr := w.b(bQuarantine).CreateBucketIfNotExists(bucket)
	if qerr == nil {
		qerr = qb.Put(bytes.Clone(key), bytes.Clone(v))
	}
	if qerr == nil {
		qerr = src.Delete(key)
	}
	if qerr != nil {
		err = fmt.Errorf("%w (and quarantine failed: %v)", err, qerr)
	}
	w.quar = append(w.quar, quarantined{string(bucket), bytes.Clone(key), err})
}

// uncountMessage takes message id out of the counters before its record is
// deleted or quarantined. A record that no longer decodes may or may not
// have been counted (it was if it decoded when Open counted; bit rot comes
// later), so the transaction counts again.
func (w *wtx) uncountMessage(id ID) {
	v := w.b(bMsgs).Get(idKey(id))
	switch {
	case v == nil:
	case validate(bMsgs, idKey(id), v) == nil:
		w.delta.msgs--
	default:
		w.recount = true
	}
}

// quarantineRcpt moves one recipient (and its history) to quarantine. If
// the record still decodes (an orphan), its due entry and counts go too;
// if it does not, the transaction counts again (see uncountMessage).
func (w *wtx) quarantineRcpt(k Key, err error) {
	if v := w.b(bRcpts).Get(rcptKey(k)); v != nil {
		r, derr := decodeRecipient(k, v)
		if derr != nil {
			w.recount = true
		} else {
			w.delta.rcpt(&r, -1)
			if dk := expectedDueKey(&r); dk != nil {
				_ = w.b(bDue).Delete(dk) // a failed delete leaves a stale entry; readers drop it
			}
		}
	}
	w.move(bRcpts, rcptKey(k), err)
	w.move(bHist, rcptKey(k), err)
}

// quarantineMessage moves a whole message (record, body, recipients) to
// quarantine: without a readable envelope or body it cannot be delivered.
func (w *wtx) quarantineMessage(id ID, err error) {
	w.uncountMessage(id)
	keys, _ := w.rcptsOf(id)
	for _, k := range keys {
		w.quarantineRcpt(k, fmt.Errorf("message %s quarantined: %w", id, err))
	}
	w.move(bMsgs, idKey(id), err)
	w.move(bBodies, idKey(id), err)
	w.move(bSpool, idKey(id), err) // the file stays: Open keeps files quarantine names
}

// problem is something a reader found but could not fix in its read-only
// transaction; Queue.fixup repairs it in a write transaction afterwards.
type problem struct {
	kind   problemKind
	bucket []byte
	key    []byte
	err    error
}

type problemKind int

const (
	corruptRecord problemKind = iota // value fails to decode
	staleDue                         // due entry that does not match its recipient
	orphanRcpt                       // recipient whose message record is gone
	missingBody                      // message record without a body
	badBody                          // a body that fails its checksum
)

// fix re-checks p inside the write transaction (another writer may have
// repaired it meanwhile) and repairs it.
func (w *wtx) fix(p problem) error {
	v := w.b(p.bucket).Get(p.key)
	if v == nil {
		return nil
	}
	switch p.kind {
	case staleDue:
		_, k, ok := parseDueKey(p.key)
		if ok {
			if rv := w.b(bRcpts).Get(rcptKey(k)); rv != nil {
				r, err := decodeRecipient(k, rv)
				if err == nil && bytes.Equal(expectedDueKey(&r), p.key) {
					w.noteDue(p.key)
					return w.b(bDue).Put(p.key, dueValue(&r)) // right key, maybe wrong value
				}
			}
		}
		return w.b(bDue).Delete(p.key)
	case orphanRcpt:
		if k, ok := parseRcptKey(p.key); ok && w.b(bMsgs).Get(idKey(k.ID)) == nil {
			w.quarantineRcpt(k, p.err)
			w.recount = true // the message record left without us: was it counted?
		}
	case missingBody:
		if !hasBody(w.tx, p.key) {
			w.quarantineMessage(ID(binary.BigEndian.Uint64(p.key)), p.err)
		}
	case badBody:
		w.fixBadBody(p)
	case corruptRecord:
		w.fixCorrupt(p, v)
	}
	return nil
}

// fixBadBody quarantines the message whose body in the database still
// fails its checksum.
func (w *wtx) fixBadBody(p problem) {
	id := ID(binary.BigEndian.Uint64(p.key))
	m, err := decodeMessageRec(id, w.b(bMsgs).Get(p.key))
	if body := w.b(bBodies).Get(p.key); err == nil && body != nil && checkBody(&m, body) != nil {
		w.quarantineMessage(id, p.err)
	}
}

func (w *wtx) fixCorrupt(p problem, v []byte) {
	if validate(p.bucket, p.key, v) == nil {
		return
	}
	switch {
	case bytes.Equal(p.bucket, bMsgs) && len(p.key) == 8:
		w.quarantineMessage(ID(binary.BigEndian.Uint64(p.key)), p.err)
	case bytes.Equal(p.bucket, bRcpts):
		if k, ok := parseRcptKey(p.key); ok {
			w.quarantineRcpt(k, p.err)
			return
		}
		w.move(p.bucket, p.key, p.err)
	default:
		w.move(p.bucket, p.key, p.err)
	}
}

// validate decodes v as a record of bucket.
func validate(bucket, key, v []byte) error {
	var err error
	switch {
	case bytes.Equal(bucket, bMsgs):
		if len(key) != 8 {
			return fmt.Errorf("%w: bad message key", errCorrupt)
		}
		_, err = decodeMessage(ID(binary.BigEndian.Uint64(key)), v)
	case bytes.Equal(bucket, bRcpts):
		if _, ok := parseRcptKey(key); !ok {
			return fmt.Errorf("%w: bad recipient key", errCorrupt)
		}
		k, _ := parseRcptKey(key)
		_, err = decodeRecipient(k, v)
	case bytes.Equal(bucket, bHist):
		k, ok := parseRcptKey(key)
		if !ok {
			return fmt.Errorf("%w: bad history key", errCorrupt)
		}
		_, err = decodeHistory(k, v, Attempt{}) // the structure; the reference only fills in fields
	case bytes.Equal(bucket, bDests):
		_, err = decodeDestination(v)
	}
	return err
}

// hasBody reports whether message key has a body, in the database or in
// the spool.
func hasBody(tx *bolt.Tx, key []byte) bool {
	return tx.Bucket(bBodies).Get(key) != nil || tx.Bucket(bSpool).Get(key) != nil
}
