package backoff

import (
	"math"
	"time"
)

// Pace is the rate a throttling destination accepts, learned by additive
// increase and multiplicative decrease (AIMD, as TCP learns a path's
// capacity): each rate-limit reply multiplies the rate by paceDecrease,
// each accepted message adds a fixed share of the rate set at the last
// decrease, so that the rate climbs back to where it was refused in about
// paceCycle messages. Sending at the learned rate uses most of the
// allowance of a destination that accepts N messages per window with
// about one refusal per paceCycle messages (pace_test.go simulates such
// destinations), where pausing after each refusal leaves most of the
// allowance unused.
//
// Before the first paced refusal the rate grows by paceSlowStart per
// accepted message (slow start), from one message per paceStart, and a
// refusal in slow start halves the rate (slow start overshoots by up to its
// growth since the last acceptance, as TCP's does). Consecutive refusals
// (no accepted message in between) also double the gap before the next
// start (up to 64 intervals) until a message passes: a destination whose
// window is used up refuses everything until it turns, however slowly we
// send. Pace is independent of the generic retry schedule
// (retry.initial_interval): the refused recipient comes back one interval
// later, in line with the others.
type Pace struct {
	Interval time.Duration // between transaction starts; 0: not paced
	Base     time.Duration // interval set by the last decrease; 0: slow start
	Refusals int           // refusals since the last accepted message
}

const (
	paceStart     = time.Second
	paceDecrease  = 0.85
	paceCycle     = 24
	paceSlowStart = 1.1
	// paceMin ends pacing: a destination accepting more than 100
	// messages a second is not throttling us any more.
	paceMin = 10 * time.Millisecond
	// paceMax bounds the interval: a destination that refuses even one
	// message an hour is better served by the retry schedule.
	paceMax = time.Hour
)

// Paced reports whether transactions to the destination are spaced.
func (p Pace) Paced() bool { return p.Interval > 0 }

// OnRefused returns the pace after a rate-limit reply.
func (p Pace) OnRefused() Pace {
	switch {
	case p.Interval <= 0:
		return Pace{Interval: paceStart, Refusals: 1}
	}
	f := 1 / paceDecrease
	if p.Base <= 0 {
		f = 2 // leaving slow start
	}
	i := min(toDuration(float64(p.Interval)*f), paceMax)
	return Pace{Interval: i, Base: i, Refusals: p.Refusals + 1}
}

// OnAccepted returns the pace after an accepted message.
func (p Pace) OnAccepted() Pace {
	if p.Interval <= 0 {
		return Pace{}
	}
	rate := 1 / p.Interval.Seconds()
	if p.Base <= 0 {
		rate *= paceSlowStart
	} else {
		rate += (1 / p.Base.Seconds()) * (1/paceDecrease - 1) / paceCycle
	}
	i := time.Duration(math.Round(float64(time.Second) / rate))
	if i < paceMin {
		return Pace{}
	}
	return Pace{Interval: i, Base: p.Base}
}

// Start returns when the next transaction may start, given when the last
// one was allowed to (last) and now: an interval after last, doubled for
// each refusal after the first since the last accepted message.
func (p Pace) Start(last, now time.Time) time.Time {
	if p.Interval <= 0 || last.IsZero() {
		return now
	}
	gap := min(p.Interval<<min(max(p.Refusals-1, 0), 6), paceMax)
	if t := last.Add(gap); t.After(now) {
		return t
	}
	return now
}
