package tlsrpt

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Store keeps the reporting state across restarts, as values this
// package alone reads. The queue's store of StoreName fits (*queue.Store).
type Store interface {
	Get(key string) ([]byte, error)
	Put(key string, v []byte) error // a nil v deletes
}

// StoreName is the name of the queue store that keeps the reporting
// state: the bucket the queue kept it in before it had stores, so that
// the day's counts and owed reports outlive an upgrade.
const StoreName = "tlsreport"

// Keys of the stored state.
const (
	keyCounts = "counts" // the Aggregator's days, as []Day
	keyOwed   = "owed"   // reports not yet delivered, as []Owed
)

// countsJSON is the stored form of Counts: a map keyed by a struct has no
// JSON form.
type countsJSON struct {
	Policy   Policy
	Success  int64
	Failures []failureCount `json:",omitempty"`
}

type failureCount struct {
	Failure
	Count int64
}

// MarshalJSON implements json.Marshaler.
func (c Counts) MarshalJSON() ([]byte, error) {
	j := countsJSON{Policy: c.Policy, Success: c.Success}
	for f, n := range c.Failures {
		j.Failures = append(j.Failures, failureCount{f, n})
	}
	slices.SortFunc(j.Failures, func(a, b failureCount) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	return json.Marshal(j)
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *Counts) UnmarshalJSON(b []byte) error {
	var j countsJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*c = Counts{Policy: j.Policy, Success: j.Success, Failures: map[Failure]int64{}}
	for _, f := range j.Failures {
		c.Failures[f.Failure] += f.Count
	}
	return nil
}

// Save writes the counts to s if they changed since the last Save. Counts
// are saved periodically and at shutdown rather than at each session, so
// delivery does not pay a database write per connection; a crash loses
// at most what was counted since the last Save.
func (a *Aggregator) Save(s Store) error {
	a.mu.Lock()
	if !a.changed {
		a.mu.Unlock()
		return nil
	}
	days := a.list()
	a.changed = false
	a.mu.Unlock()
	b, err := json.Marshal(days)
	if err == nil {
		err = s.Put(keyCounts, b)
	}
	if err != nil {
		a.mu.Lock()
		a.changed = true
		a.mu.Unlock()
		return fmt.Errorf("tls report: saving counts: %w", err)
	}
	return nil
}

// Load adds the counts stored in s to a (at start, before any session).
func (a *Aggregator) Load(s Store) error {
	b, err := s.Get(keyCounts)
	if err != nil || b == nil {
		return err
	}
	var days []Day
	if err := json.Unmarshal(b, &days); err != nil {
		return fmt.Errorf("tls report: stored counts: %w", err)
	}
	for _, d := range days {
		for _, c := range d.Counts {
			a.merge(dayOf(d.Start), c)
		}
	}
	return nil
}

// merge adds c to day's counts.
func (a *Aggregator) merge(day time.Time, c Counts) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.counts(day, c.Policy)
	if cur == nil {
		return
	}
	cur.Success += c.Success
	for f, n := range c.Failures {
		cur.Failures[f] += n
	}
}

// Owed is a report not yet delivered to every rua of its domain.
type Owed struct {
	Day   Day
	RUAs  []string  `json:",omitempty"` // the rua URIs still owed; none: look the record up again
	Tries int       // failed sends so far
	Next  time.Time // when to try again
}

// Retry timing: the first retry after retryFirst, each later one after
// twice the wait before, at most retryMax apart. RFC 8460 §4.1: a report
// covers one day, so one that is still not delivered retryFor after its
// period ended is dropped: its reader has moved on.
const (
	retryFirst = 5 * time.Minute
	retryMax   = 2 * time.Hour
	retryFor   = 24 * time.Hour
)

// retryAfter is the wait before try number tries+1.
func retryAfter(tries int) time.Duration {
	d := retryFirst
	for i := 1; i < tries && d < retryMax; i++ {
		d *= 2
	}
	return min(d, retryMax)
}

// LoadOwed reads the reports still owed from s.
func LoadOwed(s Store) ([]Owed, error) {
	b, err := s.Get(keyOwed)
	if err != nil || b == nil {
		return nil, err
	}
	var owed []Owed
	if err := json.Unmarshal(b, &owed); err != nil {
		return nil, fmt.Errorf("tls report: stored reports: %w", err)
	}
	return owed, nil
}

// SaveOwed stores the reports still owed in s.
func SaveOwed(s Store, owed []Owed) error {
	var b []byte
	if len(owed) > 0 {
		var err error
		if b, err = json.Marshal(owed); err != nil {
			return fmt.Errorf("tls report: %w", err)
		}
	}
	if err := s.Put(keyOwed, b); err != nil {
		return fmt.Errorf("tls report: saving the reports owed: %w", err)
	}
	return nil
}
