package backoff

import (
	"math"
	"time"
)

// Window is what is known about one destination's greylisting delay, from
// the retries of earlier greylisting episodes (each measured from the
// episode's first greylisting reply): the delay is longer than Low (a
// retry that long after was refused again) and at most High (one that long
// after passed). A pass after a retry placed past High only confirms High,
// so the window narrows only by retries placed inside it (probes), and a
// first pass does not teach more than "at most this long".
//
// First retries of later episodes land at High itself, with no margin
// and no jitter: High was measured the same way a later retry is placed
// (from the episode's first greylisting reply to the retry), so a retry
// that long after passed before and passes again; a margin above it would
// only make every later message slower than the one that taught it.
// Margins belong to bounds derived from refusals, and there are none:
// a probe is placed inside the window and never decides the pass. The
// one doubt about High is a greylister's clock resolution: postgrey counts
// whole seconds, so a retry up to a second short of its delay may pass
// when the two replies fall on either side of a second's edge. A retry
// at High refused within Resolution past it is that case, not a longer
// delay: the window becomes that retry up to it plus Resolution, which
// always passes, and the recipient retries there (one attempt and at most
// a second, once: a refusal at the High so set means the delay grew).
//
// While the window is wider than the goal needs (Narrow), a retry at High
// can overshoot the true delay by up to its width, so the first retries of
// the next few episodes probe inside it: if a probe passes, High comes
// down to it; if it is refused, Low goes up, and the recipient's next
// retry still lands at High, so a probe costs one refused attempt, never
// time. Probes split the window in halves of the goal's own measure (the
// ratio of High+c to Low+c, see goalPivot), so that each answer, pass or
// refusal, halves what is left to narrow: four probes narrow the window of
// a factor of two that the quick retries of a first episode leave. A window
// without a lower bound (the first retry passed straight away) is first
// probed from the top (topDown). Once the window is narrow, first retries
// stop probing: every later message passes in two attempts.
//
// A receiver that lengthens its delay refuses the retry past High, and the
// window starts again from that refusal. A destination that stops
// greylisting (it whitelisted us) never opens an episode, so the window is
// simply not used. A receiver that shortens its delay is seen only by a
// retry below Low, which costs a refused attempt if the delay did not
// change; such a check is made at most once per CheckAfter, so that its
// cost stays one attempt an hour for a destination that greylists all day.
type Window struct {
	Low  time.Duration // longest wait known to be refused; 0: none
	High time.Duration // shortest wait known to pass; 0: unknown
	// Probes counts the probes since the window last started again.
	Probes int
	// ProbeUntil is when the probe under way is decided (its recipient's
	// retry past High); no other probe starts before, so that a burst of
	// messages does not probe the same point many times.
	ProbeUntil time.Time
	// Checked is when the window was last checked below Low (or started
	// again); the next check waits until CheckAfter later.
	Checked time.Time
}

// ProbeBudget bounds the probes of a window after it starts again, should
// a receiver's answers never let it narrow (a delay that varies from one
// triplet to the next): each probe may cost a refused attempt. Narrowing
// takes about four from a lower bound, up to ten from none.
const ProbeBudget = 12

// topDown is how many probes of a window without a lower bound come down
// from High in the goal's steps (narrowBelow) before they bisect from zero:
// a first retry that passed straight away most likely came just after the
// delay. A window that starts again after a check below Low (the delay
// shrank, perhaps by much) bisects at once.
const topDown = 4

// CheckAfter is how long a window stays unchecked below Low: a receiver
// that shortens its delay is noticed within this time (and a few messages).
const CheckAfter = time.Hour

// minProbe is the shortest wait worth probing: greylisters count in seconds.
const minProbe = time.Second

// Resolution is a greylister's clock resolution: postgrey and its kin
// count whole seconds, so a pass at some wait promises a pass at any wait
// from a second later on, and a refusal less than this past a wait that
// passed says nothing about a longer delay (Window.Refused).
const Resolution = time.Second

// goalPivot is c in the goal's measure: a retry at High is within 10% +
// 1.5 s of Low (2 s less the time an attempt takes) exactly when
// (High+c)/(Low+c) is at most goalRatio.
const (
	goalPivot = 15 * time.Second
	goalRatio = 1.1
)

// Known reports whether anything was learned.
func (w Window) Known() bool { return w.Low > 0 || w.High > 0 }

// Narrow reports whether a retry at High is as good as the goal needs:
// within 10% plus 2 s of any delay the window allows (less half a second
// for the attempt itself), or a window of one second (a greylister's
// resolution).
func (w Window) Narrow() bool {
	if w.High <= 0 || w.Low <= 0 {
		return false
	}
	return w.High <= w.Low+w.Low/10+1500*time.Millisecond || w.High-w.Low <= Resolution
}

// Probe decides whether the first retry of an episode starting at now
// probes, and at which wait (0: no probe). It returns the window with the
// probe noted.
func (w Window) Probe(now time.Time) (time.Duration, Window) {
	if w.High <= 0 || now.Before(w.ProbeUntil) {
		return 0, w
	}
	if w.Checked.IsZero() {
		w.Checked = now // a window stored before checks were timed
	}
	var at time.Duration
	switch {
	case w.Probes >= ProbeBudget || w.Narrow():
		if now.Sub(w.Checked) < CheckAfter {
			return 0, w
		}
		// Has the receiver shortened its delay? A check that passes
		// starts the window again.
		at, w.Checked = w.Low/2, now
	case w.Low <= 0 && w.Probes < topDown:
		// The first retry passed straight away: most likely it came
		// just after the delay, so try just low enough that a refusal
		// leaves a narrow window.
		at = narrowBelow(w.High)
	default:
		at = split(w.Low, w.High)
	}
	if at < minProbe || at >= w.High {
		return 0, w
	}
	w.ProbeUntil = now.Add(w.High + Resolution)
	w.Probes++
	return at, w
}

// narrowBelow is the shortest lower bound that makes a window up to high
// narrow, rounded up to a millisecond so that rounding never leaves it
// just short.
func narrowBelow(high time.Duration) time.Duration {
	return toDuration(math.Ceil(float64(high+goalPivot)/goalRatio/float64(time.Millisecond))*float64(time.Millisecond)) - goalPivot
}

// split is the probe inside (low, high): the middle in the goal's measure
// (the geometric mean of low+c and high+c, less c), so that either answer
// halves what is left to narrow.
func split(low, high time.Duration) time.Duration {
	l, h := (low + goalPivot).Seconds(), (high + goalPivot).Seconds()
	return toDuration(math.Sqrt(l*h)*float64(time.Second)) - goalPivot
}

// Refused returns the window after a retry elapsed after the episode's
// first greylisting was refused again.
func (w Window) Refused(elapsed time.Duration) Window {
	if elapsed <= 0 {
		return w
	}
	if w.edge(elapsed) {
		// Refused at High itself: High passed by a second's edge
		// (Resolution). A second later always passes.
		w.Low, w.High = elapsed, elapsed+Resolution
		return w
	}
	w.Low = max(w.Low, elapsed)
	if w.High > 0 && elapsed < w.High {
		w.ProbeUntil = time.Time{} // the probe is decided: the next may start
	}
	if w.High > 0 && elapsed >= w.High {
		// The receiver lengthened its delay: what passed before no longer
		// does. Start again from this refusal.
		w.High, w.Probes, w.Checked = 0, 0, time.Time{}
	}
	return w
}

// edge reports whether a refusal elapsed after the episode's first
// greylisting is one at High by a second's edge: at High, less than
// Resolution past it, and not already at the High an edge set (a window
// exactly Resolution wide: a second refusal there means the delay grew).
func (w Window) edge(elapsed time.Duration) bool {
	return w.High > 0 && elapsed >= w.High && elapsed < w.High+Resolution && w.High-w.Low != Resolution
}

// Passed returns the window after a retry elapsed after the episode's
// first greylisting passed.
func (w Window) Passed(elapsed time.Duration) Window {
	if elapsed <= 0 {
		return w
	}
	if w.High <= 0 || elapsed < w.High {
		w.High, w.ProbeUntil = elapsed, time.Time{}
	}
	if w.Low >= w.High {
		// The receiver shortened its delay: the old refusals no longer
		// tell. Start again from this pass; the probe that found it
		// counts, so the next ones bisect from nothing (the new delay
		// may be far shorter).
		w.Low, w.Probes = 0, topDown
	}
	return w
}

// greylistedWindow places a greylisted recipient's next retry from what the
// destination's window (as it was before this refusal) says; ok is false
// when the window has nothing to say and the quick track applies.
func (p Policy) greylistedWindow(in Input, tries int) (time.Duration, bool) {
	w := in.Window
	if !w.Known() {
		return 0, false
	}
	if tries == 1 {
		switch {
		case in.Probe > 0:
			return in.Probe, true
		case w.High > 0:
			return w.High, true // where a retry passed: see Window
		}
		return min(2*w.Low, p.HintMax), true // refused at Low lately, nothing passed since
	}
	if w.High > 0 && in.Elapsed < w.High {
		// A probe, or a retry that came early: the next one at High.
		return max(w.High-in.Elapsed, minProbe), true
	}
	if w.edge(in.Elapsed) {
		// Refused at High by a second's edge (Window.Refused): a
		// second later passes.
		return max(w.High+Resolution-in.Elapsed, minProbe), true
	}
	if w.High > 0 && in.Elapsed > 0 {
		// Refused past what used to pass: the delay grew. Double the wait
		// so far (each wait at most retry.max_interval) rather than start
		// the quick track again.
		return min(max(in.Elapsed, minProbe), p.Max), true
	}
	return 0, false // nothing passed yet: the quick track goes on
}
