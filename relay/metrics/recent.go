package metrics

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// RecentMinutes is how far back Recent remembers: the status page charts
// the last hours (Prometheus keeps the long history). The daemon stores
// Recent in the queue database (MarshalBinary), so a restart keeps them.
const RecentMinutes = 6 * 60

// Outcome classes charted by Recent.
const (
	RecentDelivered = iota // delivered or relayed
	RecentDeferred
	RecentBounced // failed: a bounce (DSN) goes to the sender, if it asked
	recentClasses
)

// Recent counts recipient outcomes per minute over the last RecentMinutes,
// in a fixed ring of minutes, for the admin status page. It keeps no
// goroutine and reads no clock: Add and Series take the time.
type Recent struct {
	mu   sync.Mutex
	ring [RecentMinutes]recentMinute
}

type recentMinute struct {
	minute int64 // Unix minute the counts belong to
	counts [recentClasses]int
}

// NewRecent returns an empty Recent.
func NewRecent() *Recent { return &Recent{} }

func unixMinute(t time.Time) int64 { return t.Unix() / 60 }

// Add counts one attempt outcome ("delivered", "relayed", "deferred" or
// "failed"; others are not charted) that ended at t. A nil Recent counts
// nothing.
func (r *Recent) Add(outcome string, t time.Time) {
	class := -1
	switch outcome {
	case "delivered", "relayed":
		class = RecentDelivered
	case "deferred":
		class = RecentDeferred
	case "failed":
		class = RecentBounced
	}
	if r == nil || class < 0 {
		return
	}
	m := unixMinute(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.ring[uint64(m)%RecentMinutes]
	if s.minute != m {
		if s.minute > m { // older than the ring remembers
			return
		}
		*s = recentMinute{minute: m}
	}
	s.counts[class]++
}

// Series returns the counts of one class per minute for the n minutes up
// to and including now's, oldest first (n is capped at RecentMinutes).
func (r *Recent) Series(class int, now time.Time, n int) []int {
	n = min(max(n, 0), RecentMinutes)
	out := make([]int, n)
	if r == nil || class < 0 || class >= recentClasses {
		return out
	}
	last := unixMinute(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range out {
		m := last - int64(n-1-i)
		if s := &r.ring[uint64(m)%RecentMinutes]; s.minute == m {
			out[i] = s.counts[class]
		}
	}
	return out
}

// First returns the start of the oldest minute within the last
// RecentMinutes up to now that has any outcome, or the zero time when
// there is none: the status page spans its charts from there, so that a
// new relay's first outcomes are not a line at the edge of six hours.
func (r *Recent) First(now time.Time) time.Time {
	if r == nil {
		return time.Time{}
	}
	last := unixMinute(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	first := int64(0)
	for i := range r.ring {
		s := &r.ring[i]
		if s.minute > last-RecentMinutes && s.minute <= last && s.counts != [recentClasses]int{} &&
			(first == 0 || s.minute < first) {
			first = s.minute
		}
	}
	if first == 0 {
		return time.Time{}
	}
	return time.Unix(first*60, 0)
}

// recentVersion is the first element of Recent's encoding: a later
// change of the format changes it, and Restore refuses what it does not
// know rather than misread it.
const recentVersion = 1

// MarshalBinary encodes the minutes that have outcomes, so that the
// charts survive a restart (the daemon stores the encoding in the queue
// database). The encoding is JSON: [version, [minute, delivered,
// deferred, bounced], ...].
func (r *Recent) MarshalBinary() ([]byte, error) {
	out := []any{recentVersion}
	r.mu.Lock()
	for i := range r.ring {
		if s := &r.ring[i]; s.counts != [recentClasses]int{} {
			out = append(out, [1 + recentClasses]int64{s.minute,
				int64(s.counts[RecentDelivered]), int64(s.counts[RecentDeferred]), int64(s.counts[RecentBounced])})
		}
	}
	r.mu.Unlock()
	return json.Marshal(out)
}

// UnmarshalBinary adds the minutes of an encoding made by MarshalBinary
// to r. A minute r already holds a newer minute for is dropped, as Add
// drops it; a malformed encoding is an error and changes nothing.
func (r *Recent) UnmarshalBinary(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("recent outcomes: %w", err)
	}
	var v int
	if len(raw) == 0 || json.Unmarshal(raw[0], &v) != nil || v != recentVersion {
		return errors.New("recent outcomes: not an encoding of this version")
	}
	minutes := make([][1 + recentClasses]int64, len(raw)-1)
	for i, x := range raw[1:] {
		var m []int64
		if err := json.Unmarshal(x, &m); err != nil {
			return fmt.Errorf("recent outcomes: minute %d: %w", i, err)
		}
		if len(m) != len(minutes[i]) {
			return fmt.Errorf("recent outcomes: minute %d has %d numbers, want %d", i, len(m), len(minutes[i]))
		}
		copy(minutes[i][:], m)
		for _, n := range minutes[i][1:] {
			if n < 0 || n > math.MaxInt32 {
				return fmt.Errorf("recent outcomes: minute %d: count %d out of range", i, n)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range minutes {
		s := &r.ring[uint64(x[0])%RecentMinutes]
		if s.minute > x[0] {
			continue
		}
		if s.minute < x[0] {
			*s = recentMinute{minute: x[0]}
		}
		for c := range recentClasses {
			s.counts[c] += int(x[1+c])
		}
	}
	return nil
}
