package backoff

import (
	"math"
	"time"
)

// Pace is the rate a throttling destination accepts, learned by additive
// increase and multiplicative decrease (AIMD, as TCP learns a path's
// capacity), and sending at that rate uses most of the allowance of a
// destination that accepts N messages per window, where pausing after
// each refusal leaves most of it unused (pace_test.go simulates such
// destinations).
//
// The start decides a short run. While a destination accepts everything,
// Pace counts the run of accepted messages (Run since RunStart; a run
// older than paceRunSpan starts again). The first rate-limit reply paces
// the destination at one message per paceStart, and refusals that follow
// with nothing accepted in between only double the gap before the next
// start (Start): the destination's window is used up, which says nothing
// of its rate. The first message accepted after them ends the opening:
// the window has turned, so the run before the refusal took at most the
// time from RunStart to the window's turn, some time during the last gap
// (taken an eighth of it before now: late, so that the estimate errs
// low), and the pace starts at that run's rate. With no run to go by (the
// very first message was refused), the rate grows by paceSlowStart per
// accepted message until the next refusal halves it.
//
// From then on, each refusal multiplies the rate by paceDecrease and
// doubles the gap (consecutive ones double it again), and each accepted
// message adds a share of the rate set at the last decrease (Base), so
// that the rate climbs back to where it was refused in paceCycle messages
// or the opening's run (Run, kept as the window's allowance), whichever is
// more; past that, no refusal having been seen there, it grows by
// paceBeyondWindow per window (paceBeyond per message when the allowance
// is unknown), so that a pace that started low reaches the allowance
// within a short run without overshooting a long window by much. Pace is independent of the generic retry schedule
// (retry.initial_interval): the refused recipient comes back one interval
// later, in line with the others.
type Pace struct {
	Interval time.Duration // between transaction starts; 0: not paced
	Base     time.Duration // interval set by the last decrease; 0: opening or slow start
	Refusals int           // refusals since the last accepted message
	Run      int           // messages accepted since RunStart before the opening refusal; after the opening, the window's allowance
	RunStart time.Time
}

const (
	// paceStart is the opening's first gap; its probes come 2, 6, 14,
	// 30 s … after the first refusal. A first gap of 1 s would spend one
	// more refused probe on every window longer than 2 s, to gain at most
	// a second on shorter ones.
	paceStart     = 2 * time.Second
	paceDecrease  = 0.85
	paceCycle     = 64
	paceSlowStart = 1.1
	paceBeyond    = 1.005
	// paceBeyondWindow is the growth per window past the last refused
	// rate when the window's allowance is known (Run, from the opening):
	// per message its Run-th root, at most paceBeyondMax. Growth per
	// message alone (paceBeyond) overshoots a window of 100 messages by
	// 65% before its end tells.
	paceBeyondWindow = 1.05
	paceBeyondMax    = 1.02
	// paceRunSpan bounds a run of accepted messages: an older one says
	// little about the burst that hit the limit.
	paceRunSpan = 10 * time.Minute
	// paceMin ends pacing: a destination accepting more than 100
	// messages a second is not throttling us any more.
	paceMin = 10 * time.Millisecond
	// paceMax bounds the interval: a destination that refuses even one
	// message an hour is better served by the retry schedule.
	paceMax = time.Hour
)

// RunEnds is when the run of accepted messages p counts is too old to set
// a pace (zero: no run).
func (p Pace) RunEnds() time.Time {
	if p.Run <= 0 || p.Interval > 0 {
		return time.Time{}
	}
	return p.RunStart.Add(paceRunSpan)
}

// Opening reports whether p is in its opening: refused after a run of
// accepted messages, with no message accepted since.
func (p Pace) Opening() bool { return p.Interval > 0 && p.Base <= 0 && p.Refusals > 0 && p.Run > 0 }

// Paced reports whether transactions to the destination are spaced.
func (p Pace) Paced() bool { return p.Interval > 0 }

// OnRefused returns the pace after a rate-limit reply.
func (p Pace) OnRefused() Pace {
	switch {
	case p.Interval <= 0:
		return Pace{Interval: paceStart, Refusals: 1, Run: p.Run, RunStart: p.RunStart}
	case p.Base <= 0 && p.Refusals > 0:
		p.Refusals++ // the opening's window is used up: only the gap grows
		return p
	}
	f := 1 / paceDecrease
	if p.Base <= 0 {
		f = 2 // leaving slow start, which overshoots by up to its growth
	}
	i := min(toDuration(float64(p.Interval)*f), paceMax)
	return Pace{Interval: i, Base: i, Refusals: p.Refusals + 1, Run: p.Run}
}

// OnAccepted returns the pace after a message accepted at now.
func (p Pace) OnAccepted(now time.Time) Pace {
	if p.Interval <= 0 {
		if p.Run == 0 || now.Sub(p.RunStart) > paceRunSpan || now.Before(p.RunStart) {
			return Pace{Run: 1, RunStart: now}
		}
		p.Run++
		return p
	}
	if p.Base <= 0 && p.Run > 0 && p.Refusals > 0 {
		// The opening ends: start at the rate of the run before it.
		i := min(max((now.Sub(p.RunStart)-p.Gap()/8)/time.Duration(p.Run), paceMin), paceMax)
		return Pace{Interval: i, Base: toDuration(float64(i) / paceDecrease), Run: p.Run}
	}
	rate := 1 / p.Interval.Seconds()
	switch base := 1 / p.Base.Seconds(); {
	case p.Base <= 0:
		rate *= paceSlowStart
	case rate < base/paceDecrease:
		rate += base * (1/paceDecrease - 1) / max(paceCycle, float64(p.Run))
	case p.Run > 0:
		rate *= min(math.Pow(paceBeyondWindow, 1/float64(p.Run)), paceBeyondMax)
	default:
		rate *= paceBeyond
	}
	i := time.Duration(math.Round(float64(time.Second) / rate))
	if i < paceMin {
		return Pace{}
	}
	return Pace{Interval: i, Base: p.Base, Run: p.Run}
}

// Start returns when the next transaction may start, given when the last
// one was allowed to (last) and now: an interval after last, doubled for
// each refusal after the first since the last accepted message.
func (p Pace) Start(last, now time.Time) time.Time {
	if p.Interval <= 0 || last.IsZero() {
		return now
	}
	if t := last.Add(p.Gap()); t.After(now) {
		return t
	}
	return now
}

// Gap is the time between transaction starts: the interval, doubled for
// each refusal after the first since the last accepted message, up to
// paceMax. The doubling is not capped below paceMax: a destination whose
// window is an hour long refuses everything until it turns, and a gap
// that stopped growing at a minute would spend a refusal a minute on it.
func (p Pace) Gap() time.Duration {
	if p.Interval <= 0 {
		return 0
	}
	g := p.Interval
	n := p.Refusals - 1
	if p.Base > 0 && p.Refusals > 0 {
		// Past the opening, a refusal means the rate crept past the
		// allowance near the window's end: the window turns about as
		// many intervals later as the rate overshot, and a retry one
		// interval later is mostly refused too.
		n++
	}
	for range max(n, 0) {
		if g >= paceMax {
			break
		}
		g *= 2
	}
	return min(g, paceMax)
}
