package metrics

import (
	"sync"
	"time"
)

// RecentMinutes is how far back Recent remembers: the status page charts
// the last hours, and a restart starts the charts afresh (Prometheus keeps
// the long history).
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
