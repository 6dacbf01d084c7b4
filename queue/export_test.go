package queue

import (
	"bytes"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The tests' window on the due index; the scheduler reads it through a
// DueCursor (cursor.go).

// Due returns up to limit recipients (limit <= 0: no limit) whose
// NextAttempt is at or before now, in index order (earliest first). It seeks
// the due index and stops at now, so its cost is proportional to the work it
// returns, not to the queue size. Active leases are skipped; entries that do
// not match their recipient (held, final, missing) are skipped and repaired.
// History is not filled.
func (q *Queue) Due(now time.Time, limit int) ([]Recipient, error) {
	return q.DueSkip(now, limit, nil)
}

// DueSkip is Due with a filter applied before a recipient is decoded: skip
// gets the destination domain (lower case) and the key from the index
// entry, and a true result passes over the entry. The scheduler uses it to
// leave out recipients it already holds and destinations with no free
// capacity, so a large backlog for one domain costs little per scan.
func (q *Queue) DueSkip(now time.Time, limit int, skip func(domain string, k Key) bool) ([]Recipient, error) {
	if err := q.settle(); err != nil {
		return nil, err
	}
	var f func(string, Key, time.Time) bool
	if skip != nil {
		f = func(domain string, k Key, _ time.Time) bool { return skip(domain, k) }
	}
	out, _, err := q.dueFrom(nil, now, limit, f)
	return out, err
}

// The window of the salvage tests (salvage_test.go): they run
// queue/salvage, which imports queue, so they are in package queue_test
// and reach the queue's test helpers and raw buckets through these.

var (
	T0              = t0
	DBPath          = dbPath
	OpenAt          = openAt
	Msg             = msg
	MustEnqueue     = mustEnqueue
	FillDamageQueue = fillDamageQueue
	SmashBranch     = smashBranch
	ZeroMeta        = zeroMeta
	CheckSalvaged   = checkSalvaged
	BRcpts          = bRcpts
	BMsgs           = bMsgs
	BBodies         = bBodies
)

// Accepted is what FillDamageQueue gave the queue.
type Accepted = accepted

// IDs lists the messages accepted.
func (a accepted) IDs() []ID {
	var ids []ID
	for id := range a.bodies {
		ids = append(ids, id)
	}
	return ids
}

// Settle waits until every journaled message is in the database.
func (q *Queue) Settle() error { return q.settle() }

// Path is the queue file's path.
func (q *Queue) Path() string { return q.path }

// PutQuarantined stores v under key in the quarantine's nested bucket of
// bucket, as the queue does with a record that does not decode.
func (q *Queue) PutQuarantined(bucket, key, v []byte) error {
	return q.update(func(w *wtx) error {
		b, err := w.b(bQuarantine).CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		return b.Put(key, v)
	})
}

// Quarantined returns what the quarantine holds under key for bucket.
func (q *Queue) Quarantined(bucket, key []byte) (v []byte, err error) {
	err = q.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bQuarantine).Bucket(bucket); b != nil {
			v = bytes.Clone(b.Get(key))
		}
		return nil
	})
	return v, err
}

// SalvagedMarkOf returns the salvage mark of recipient k, or nil.
func (q *Queue) SalvagedMarkOf(k Key) (v []byte, err error) {
	err = q.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bSalvaged); b != nil {
			v = bytes.Clone(b.Get(rcptKey(k)))
		}
		return nil
	})
	return v, err
}
