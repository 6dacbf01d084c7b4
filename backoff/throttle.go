package backoff

import (
	"math"
	"time"
)

// Throttle is the destination-wide state while a destination rate-limits us.
// Per-recipient delays (Next with RateLimited) say when each recipient is
// due; Throttle says how hard the whole destination may be pushed. RFC 5321
// §4.5.4.1: "A client SHOULD keep a list of hosts it cannot reach ... rather
// than just retrying queued mail items." The zero value is healthy.
type Throttle struct {
	Level int       // 0 = not throttled; grows with each rate-limit deferral
	Until time.Time // no new connections to the destination before this
}

// maxLevel bounds Level so that repeated deferrals cannot overflow it; the
// general schedule has long reached Max by then.
const maxLevel = math.MaxInt32

// OnRateLimited returns the new state after a rate-limit deferral at now,
// honouring hint (0 = none). Concurrency drops to 1 and Level grows. The
// destination pauses only when the server said how long to wait (the
// clamped, upward-jittered hint; an existing longer pause is kept): without
// a hint, the learned Pace spaces the next transactions instead, which
// keeps using the rate the destination allows rather than pausing for a
// schedule made for failures.
func (p Policy) OnRateLimited(t Throttle, now time.Time, hint time.Duration, rnd float64) Throttle {
	level := min(max(t.Level, 0), maxLevel-1) + 1
	until := t.Until
	if hint > 0 {
		if u := now.Add(p.Next(Input{Kind: Generic, Attempt: level, Hint: hint}, rnd)); u.After(until) {
			until = u
		}
	}
	return Throttle{Level: level, Until: until}
}

// OnSuccess returns the state after a successful delivery: Level drops by
// one, so a destination that throttled us N times needs N successes before
// it gets full concurrency back.
func (t Throttle) OnSuccess() Throttle {
	t.Level = max(t.Level-1, 0)
	return t
}

// Concurrency returns the allowed concurrent connections given the
// configured maximum limit: 1 while throttled (Level > 0), else limit.
func (t Throttle) Concurrency(limit int) int {
	if t.Level > 0 {
		return min(limit, 1)
	}
	return limit
}

// Paused reports whether no connection may be opened at now (now < Until).
func (t Throttle) Paused(now time.Time) bool {
	return now.Before(t.Until)
}
