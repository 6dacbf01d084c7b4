package backoff

import "time"

// Window is what is known about one destination's greylisting delay, from
// the retries of earlier greylisting episodes (each measured from the
// episode's first greylisting reply): the delay is longer than Low (a
// retry that long after was refused again) and at most High (one that long
// after passed). A pass after a retry placed past High only confirms High,
// so the window narrows only by retries placed inside it (probes), and a
// first pass does not teach more than "at most this long".
//
// First retries of later episodes land just past High (High plus 2% plus
// one second): the receiver's clock and rounding may differ a little from
// ours, and the 2% keeps the margin in proportion for long delays. While the
// window is wide, that placement can overshoot the true delay by up to its
// width, so every few episodes one first retry probes inside the window (its
// middle): if it passes, High comes down to it; if it is refused, Low goes
// up, and the recipient's next retry still lands just past High, so a probe
// costs one refused attempt, never time. A narrow window is checked below
// Low every CheckEvery passes, so that a receiver that shortened its delay
// is noticed; a receiver that lengthened it refuses the retry past High,
// and the window starts again from that refusal. A destination that stops
// greylisting (it whitelisted us) never opens an episode, so the window is
// simply not used.
type Window struct {
	Low   time.Duration // longest wait known to be refused; 0: none
	High  time.Duration // shortest wait known to pass; 0: unknown
	Quiet int           // passes since the last probe
	// ProbeUntil is when the probe under way is decided (its recipient's
	// retry past High); no other probe starts before, so that a burst of
	// messages does not probe the same point many times.
	ProbeUntil time.Time
}

// CheckEvery is how many passes of a narrow window go by before a first
// retry checks below Low whether the receiver shortened its delay.
const CheckEvery = 8

// minProbe is the shortest wait worth probing: greylisters count in seconds.
const minProbe = time.Second

// Known reports whether anything was learned.
func (w Window) Known() bool { return w.Low > 0 || w.High > 0 }

// Margin is how far past High a first retry lands: 2% plus one second.
func Margin(high time.Duration) time.Duration { return high/50 + time.Second }

// Narrow reports whether a retry past High is as good as the goal needs:
// within 10% plus 2 s of any delay the window allows, or a window of one
// second (a greylister's resolution).
func (w Window) Narrow() bool {
	if w.High <= 0 || w.Low <= 0 {
		return false
	}
	return w.High+Margin(w.High) <= w.Low+w.Low/10+2*time.Second || w.High-w.Low <= time.Second
}

// Probe decides whether the first retry of an episode starting at now
// probes, and at which wait (0: no probe). It returns the window with the
// probe noted.
func (w Window) Probe(now time.Time) (time.Duration, Window) {
	if w.High <= 0 || now.Before(w.ProbeUntil) {
		return 0, w
	}
	var at time.Duration
	switch {
	case w.Low <= 0:
		// Nothing refused lately (the delay shrank below what was
		// refused before): come down in bigger steps.
		at = w.High / 4
	case !w.Narrow():
		at = (w.Low + w.High) / 2
	case w.Quiet >= CheckEvery:
		at = w.Low / 2 // has the receiver shortened its delay?
	default:
		return 0, w
	}
	if at < minProbe || at >= w.High {
		return 0, w
	}
	w.ProbeUntil = now.Add(w.High + Margin(w.High))
	w.Quiet = 0
	return at, w
}

// Refused returns the window after a retry elapsed after the episode's
// first greylisting was refused again.
func (w Window) Refused(elapsed time.Duration) Window {
	if elapsed <= 0 {
		return w
	}
	w.Low = max(w.Low, elapsed)
	if w.High > 0 && elapsed < w.High {
		w.ProbeUntil = time.Time{} // the probe is decided: the next may start
	}
	if w.High > 0 && elapsed >= w.High {
		// The receiver lengthened its delay: what passed before no longer
		// does. Start again from this refusal.
		w.High, w.Quiet = 0, 0
	}
	return w
}

// Passed returns the window after a retry elapsed after the episode's
// first greylisting passed.
func (w Window) Passed(elapsed time.Duration) Window {
	if elapsed <= 0 {
		return w
	}
	if w.High <= 0 || elapsed < w.High {
		w.High, w.ProbeUntil = elapsed, time.Time{}
	} else {
		w.Quiet++
	}
	if w.Low >= w.High {
		w.Low = 0 // the receiver shortened its delay: the old refusals no longer tell
	}
	return w
}

// greylistedWindow places a greylisted recipient's next retry from what the
// destination's window (as it was before this refusal) says; ok is false
// when the window has nothing to say and the quick track applies.
func (p Policy) greylistedWindow(in Input, tries int, rnd float64) (time.Duration, bool) {
	w := in.Window
	if !w.Known() {
		return 0, false
	}
	if tries == 1 {
		switch {
		case in.Probe > 0:
			return in.Probe, true
		case w.High > 0:
			return w.High + Margin(w.High) + toDuration(float64(w.High)*rnd/50), true
		}
		return min(2*w.Low, p.HintMax), true // refused at Low lately, nothing passed since
	}
	if w.High > 0 && in.Elapsed < w.High {
		// A probe, or a retry that came early: the next one just past High.
		return max(w.High+Margin(w.High)-in.Elapsed, minProbe), true
	}
	if in.Elapsed > 0 {
		// Refused past what used to pass: the delay grew. Double the wait
		// so far (each wait at most retry.max_interval) rather than start
		// the quick track again.
		return min(max(in.Elapsed, minProbe), p.Max), true
	}
	return 0, false
}
