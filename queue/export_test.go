package queue

import "time"

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
