package delivery

import (
	"context"
	"maps"
	"time"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/queue"
)

// What the engine learns about a destination domain, stored in its
// queue.Destination record with the outcomes that taught it.
//
// Greylisting. A destination's greylisting delay lies between the longest
// wait (from an episode's first greylisting reply) after which a retry was
// refused again and the shortest after which one passed: the window of
// backoff.Window, kept in the record (GreylistLow, LearnedDelay). First
// retries of later episodes land at its upper bound itself or, while it
// is wide, probe inside it; each pass and each refusal narrows it, and
// once narrow it is checked below at most hourly. A pass is measured from
// the first greylisting reply to the passing attempt's start, the way a
// later retry's wait is placed, so a later retry at the bound repeats the
// pass exactly; and a pass past the bound does not raise it, so the bound
// never drifts upwards.
//
// The window only shapes the retries of greylisted recipients
// (backoff.Input.Window); it never delays other recipients: greylisting is
// per triplet and never slows the whole destination.
//
// Throttling. Every accepted message counts in the destination's run
// (backoff.Pace.Run), which sets the pace if it ever refuses. A
// destination that rate-limits us gets a learned pace
// (backoff.Pace, AIMD): transactions to it start at most one per
// PaceInterval, whichever worker makes them (paceWait), and a refused
// recipient comes back one interval later, instead of the destination
// pausing for the generic retry schedule. The MX host's record learns
// the same (host.go), for the domains behind it without a pace of their
// own; and a transaction that took its start before a refusal waits for
// the pace again before it sends (paceGate).

// window returns rec's greylisting window.
func window(rec *queue.Destination) backoff.Window {
	return backoff.Window{Low: rec.GreylistLow, High: rec.LearnedDelay, Probes: rec.GreylistProbes, ProbeUntil: rec.GreylistProbe, Checked: rec.GreylistChecked}
}

// setWindow stores w in rec, learned at now if its bounds changed.
func setWindow(rec *queue.Destination, w backoff.Window, now time.Time) {
	if w.Low != rec.GreylistLow || w.High != rec.LearnedDelay {
		rec.GreylistLearned = now
	}
	rec.GreylistLow, rec.LearnedDelay, rec.GreylistProbes = w.Low, w.High, w.Probes
	rec.GreylistProbe, rec.GreylistChecked = w.ProbeUntil, w.Checked
}

// learnGreylistPass records that a recipient first greylisted passed after
// passed (measured from its first greylisting reply), learned at now.
func learnGreylistPass(rec *queue.Destination, passed time.Duration, now time.Time) {
	if passed <= 0 {
		return
	}
	setWindow(rec, window(rec).Passed(passed), now)
	rec.Greylists = true
	rec.GreylistPassed++
}

// learnGreylisted records one greylisting reply at now, elapsed after the
// episode's first (0 for the first), and fills in what the backoff policy
// needs to place the retry: the window as it was, and a probe if this first
// retry is to be one. A server's hint places the retry itself, so no probe
// is spent on it.
func learnGreylisted(rec *queue.Destination, in *backoff.Input, elapsed time.Duration, now time.Time) {
	rec.Greylists = true
	rec.GreylistSeen++
	rec.LastGreylisted = now
	w := window(rec)
	in.Window, in.Elapsed = w, elapsed
	switch {
	case in.GreylistTries <= 1 && in.Hint <= 0:
		in.Probe, w = w.Probe(now)
	case in.GreylistTries > 1:
		w = w.Refused(elapsed)
	}
	setWindow(rec, w, now)
}

// greylistWait learns from a greylisting reply at now (in.GreylistTries
// counts it; the episode began at first) and returns how long the
// recipient waits before its next retry.
func greylistWait(p backoff.Policy, rec *queue.Destination, in backoff.Input, first, now time.Time, rnd float64) time.Duration {
	learnGreylisted(rec, &in, now.Sub(first), now)
	return p.Next(in, rnd)
}

// pace returns rec's learned pace.
func pace(rec *queue.Destination) backoff.Pace {
	return backoff.Pace{Interval: rec.PaceInterval, Base: rec.PaceBase, Refusals: rec.PaceRefusals, Run: rec.PaceRun, RunStart: rec.PaceRunStart}
}

// setPace stores p in rec.
func setPace(rec *queue.Destination, p backoff.Pace) {
	rec.PaceInterval, rec.PaceBase, rec.PaceRefusals = p.Interval, p.Base, p.Refusals
	rec.PaceRun, rec.PaceRunStart = p.Run, p.RunStart
}

// learnThrottle updates the destination-wide throttle after an attempt: a
// rate-limit reply throttles the destination (concurrency 1, paused only
// for a server's hint; backoff.Policy.OnRateLimited; its pace was slowed
// down when the reply was settled), accepted messages relax it one level
// and speed up its pace. A rate limit wins over a success in the same
// attempt.
func (e *Engine) learnThrottle(rec *queue.Destination, s *settlement, now time.Time) {
	t := backoff.Throttle{Level: rec.ThrottleLevel, Until: rec.ThrottledUntil}
	switch {
	case s.limited:
		t = e.policy.OnRateLimited(t, now, s.rated.Hint, e.opt.Rand())
		rec.LastReply = queue.Reply{Code: s.rated.Code, Enhanced: s.rated.Enhanced, Text: s.rated.Text}
	case s.success:
		t = t.OnSuccess()
		p := pace(rec)
		if p.Opening() {
			// The window the opening probes was filled by every node
			// together: its end takes the rate from all their runs.
			p.Run += s.othersRun
		}
		setPace(rec, learnAccepted(p, s.accepted, s.started, s.pacedSince, now))
	default:
		return
	}
	rec.ThrottleLevel, rec.ThrottledUntil = t.Level, t.Until
}

// learnAccepted returns p after n messages of a transaction started at
// started were accepted at now, the pace having begun at pacedSince.
func learnAccepted(p backoff.Pace, n int, started, pacedSince, now time.Time) backoff.Pace {
	for range n {
		if p.Opening() && !started.After(pacedSince) {
			// Under way when the first refusal came: one more of the run
			// that filled the window, not a sign that the window has
			// turned.
			p.Run++
			continue
		}
		p = p.OnAccepted(now)
	}
	return p
}

// paceGate holds an attempt just before it dials the MX address addr
// (or sends on a connection already open to it), after its recipients
// were Begun, for what was learned since it took its start in paceWait:
//
//   - another transaction to the destination met a rate-limit reply
//     (d.refused moved): the window has just filled, and this
//     transaction would only spend a refused RCPT on it. It waits for
//     the pace again instead. Most of a burst's transactions under way
//     when the first refusal comes are here, between their start and
//     their RCPT (Begin's commit, the dial, the greeting): held here,
//     they are not refused, and the opening costs the probes of its
//     doubling gap alone (backoff.Pace).
//   - the MX host's learned pace, for a domain without one of its own
//     (hostGate).
//
// release closes the connection open to addr, if any, before a wait
// longer than paceIdle. It returns false if ctx ended first.
func (e *Engine) paceGate(ctx context.Context, d *dest, a *attempt, addr string, release func()) bool {
	e.refreshShared(d) // another node's refusal since the start was taken counts too
	var again bool
	e.call(func() { again = d.refused != a.refused && pace(&d.rec).Paced() })
	if again {
		_, refused, ok := e.paceWait(ctx, d, release)
		if !ok {
			return false
		}
		a.start, a.refused = e.now(), refused // a transaction of the pace now, not of the run before it
	}
	return e.hostGate(ctx, d, a, addr, release)
}

// paceIdle is the longest wait for a paced start that keeps the worker's
// connection open: longer, and release closes it first (servers drop idle
// clients after a while, and an open connection is a slot others could
// use).
const paceIdle = 5 * time.Second

// paceWait waits until d's next transaction may start under its learned
// pace (across the nodes when they share it, see sharedStart), and takes
// that start for the caller; before a wait longer than paceIdle it calls
// release. It returns the start taken and the destination's refusal count
// then (d.refused, for paceGate), and false if ctx ended first.
//
// A start is taken only when it is due, never reserved ahead: a worker
// that waits holds no start, so workers waiting at once (those of the
// opening burst, before the destination throttled us) never push the next
// start further out one gap each, and a pace that changes during the wait
// applies to it (a refusal doubles the gap, an acceptance shortens it and
// wakes the waiting workers through d.paceWake). A pace that says N
// seconds thus starts a due transaction within N seconds. The start is
// given back (giveBackStart) when the worker then finds no job. Across
// the nodes a start is reserved at most sharedAhead ahead, for the same
// reason.
func (e *Engine) paceWait(ctx context.Context, d *dest, release func()) (time.Time, int, bool) {
	released := false
	for {
		// A pace another node learned applies on an open connection too,
		// and to a worker already waiting: one waiting out a long gap of
		// an opening wakes once a second to see whether another node's
		// probe has been accepted (the opening's end shortens the gap).
		e.refreshShared(d)
		var st paceStep
		e.call(func() { st = e.takeStart(d) })
		var wait time.Duration
		if st.took {
			at, reserved := e.sharedStart(d, st.p, st.now)
			if reserved {
				return st.now, st.refused, e.sharedWait(ctx, d, at, st.now, release, released)
			}
			// The nodes' next start is further away than sharedAhead:
			// nothing was reserved. Give the local start back and wait
			// for the pace again, reading the shared view anew, so that
			// no start is held far ahead with a gap that has since
			// become shorter (an opening ended by another node's probe).
			e.giveBackStart(d, st.now)
			wait = at.Sub(st.now)
		} else {
			wait = st.at.Sub(st.now)
		}
		if wait > paceIdle && !released {
			release()
			released = true
		}
		if e.opt.Shared != nil {
			wait = min(wait, sharedRefresh)
		}
		if !sleepCtx(ctx, wait, st.wake) {
			return time.Time{}, 0, false
		}
	}
}

// takeStart takes d's next start if its pace lets it start now, on the
// loop's goroutine; else it says when the next may come.
func (e *Engine) takeStart(d *dest) paceStep {
	p := pace(&d.rec)
	now := e.now()
	at := p.Start(d.lastStart, now)
	if !at.After(now) {
		d.prevStart, d.lastStart = d.lastStart, now // also unpaced: a refusal paces from the start before it
		e.notePace(d, d.rec)
		return paceStep{took: true, p: p, now: now, refused: d.refused}
	}
	if d.paceWake == nil {
		d.paceWake = make(chan struct{})
	}
	return paceStep{now: now, at: at, wake: d.paceWake}
}

// sharedWait waits for at, the start the nodes' pace reserved for the
// start taken at now (sharedStart).
func (e *Engine) sharedWait(ctx context.Context, d *dest, at, now time.Time, release func(), released bool) bool {
	if !at.After(now) {
		return true
	}
	e.atLoop(func() {
		if at.After(d.lastStart) {
			d.lastStart = at // the nodes' common pace rules; the local start is the fallback
			e.notePace(d, d.rec)
		}
	}, false)
	if wait := at.Sub(now); wait > paceIdle && !released {
		release()
	}
	return sleepCtx(ctx, at.Sub(now), nil)
}

// sleepCtx waits for d, ctx or wake (nil: none); false if ctx ended.
func sleepCtx(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	}
	return true
}

// giveBackStart returns the start paceWait took for a worker that then
// found no job, unless a later one was taken meanwhile.
func (e *Engine) giveBackStart(d *dest, taken time.Time) {
	e.atLoop(func() {
		if d.lastStart.Equal(taken) {
			d.lastStart = d.prevStart
			e.notePace(d, d.rec)
		}
	}, false)
}

// notePace sets d.paceHold from d.lastStart and rec's pace, which a
// refusal lengthens and an acceptance shortens: until then, evict keeps d
// with its lastStart, or the next message after an idle moment (no job,
// no worker) would find d read again from the queue and start at once,
// breaking the pace. The loop's goroutine only.
//
// A pace whose next start comes sooner than before wakes the workers
// waiting for it (paceWait), so that none sleeps through a gap that an
// acceptance has just shortened.
func (e *Engine) notePace(d *dest, rec queue.Destination) {
	hold := pace(&rec).Start(d.lastStart, d.lastStart) // lastStart plus the gap; zero if never started
	sooner := hold.Before(d.paceHold)
	d.paceHold = hold
	if sooner && d.paceWake != nil {
		close(d.paceWake)
		d.paceWake = nil
	}
}

// sharedStart reserves a paced start across the nodes: the pace's gap
// (the interval, longer after refusals) holds between any two starts to
// the domain by any node. It returns the start and whether it is
// reserved: the local start at now stands (reserved, at now) when d is
// not paced or the shared store is away, and a start further than
// sharedAhead away is not reserved (the caller asks again).
func (e *Engine) sharedStart(d *dest, p backoff.Pace, now time.Time) (time.Time, bool) {
	if e.opt.Shared == nil || !p.Paced() {
		return now, true
	}
	gap := p.Start(now, now).Sub(now)
	if gap <= 0 {
		return now, true
	}
	wait, ok := e.opt.Shared.Pace(d.name, gap, sharedAhead)
	if !ok {
		return now, true
	}
	return now.Add(wait), wait <= sharedAhead
}

// sharedAhead is how far ahead a paced start is reserved across the
// nodes. Reserved further ahead, a start waited out the gap it was
// reserved with: during an opening, whose gap doubles with each refused
// probe, the nodes' starts were chained a long gap apart each, and went on
// waiting those gaps after another node's probe was accepted and the
// pace had become a few seconds (32 s holes in a 30-per-minute window).
const sharedAhead = time.Second

// decayThrottle ends a destination's throttling when recipients of it
// expired (results holds this settlement's) and no other recipient of it
// is waiting: the relay gave up on what the throttle was pacing, and a
// level kept from that episode would slow the next message, perhaps days
// later, for a congestion long gone (and `destinations` would show it
// for ever). While other mail waits, the level stays: their next real
// attempt decides. A queue error keeps the level too.
func (e *Engine) decayThrottle(rec *queue.Destination, results []queue.Result) {
	if rec.ThrottleLevel == 0 && rec.ThrottledUntil.IsZero() {
		return
	}
	var done []queue.Key
	for _, r := range results {
		if r.Status.Final() {
			done = append(done, r.Key)
		}
	}
	if waiting, err := e.q.Waiting(rec.Domain, done); err != nil || waiting {
		return
	}
	rec.ThrottleLevel, rec.ThrottledUntil = 0, time.Time{}
	setPace(rec, backoff.Pace{})
}

// markDead remembers that addr refused or ignored a connection, so that no
// attempt dials it again before until (RFC 5321 §4.5.4.1: "A client SHOULD
// keep a list of hosts it cannot reach and corresponding connection
// timeouts, rather than just retrying queued mail items"). Stored with
// the attempt's outcome.
func markDead(rec *queue.Destination, addr string, until time.Time) {
	if rec.DeadHosts == nil {
		rec.DeadHosts = map[string]time.Time{}
	}
	rec.DeadHosts[addr] = until
}

// markAlive forgets that addr was dead: it just answered.
func markAlive(rec *queue.Destination, addr string) {
	delete(rec.DeadHosts, addr)
}

// deadUntil reports until when addr is to be skipped (zero: not dead).
func deadUntil(rec *queue.Destination, addr string, now time.Time) time.Time {
	if t, ok := rec.DeadHosts[addr]; ok && t.After(now) {
		return t
	}
	return time.Time{}
}

// pruneDead drops dead-host entries that have run out.
func pruneDead(rec *queue.Destination, now time.Time) {
	for a, t := range rec.DeadHosts {
		if !t.After(now) {
			delete(rec.DeadHosts, a)
		}
	}
}

// unpause forgets rec's dead hosts and throttle pause (the operator says
// the destination is back; see flush.go) and reports whether it had any.
func unpause(rec *queue.Destination) bool {
	had := len(rec.DeadHosts) > 0 || !rec.ThrottledUntil.IsZero()
	rec.DeadHosts, rec.ThrottledUntil = nil, time.Time{}
	return had
}

// cloneDest copies rec deeply enough to change it without touching rec.
func cloneDest(rec queue.Destination) queue.Destination {
	rec.DeadHosts = maps.Clone(rec.DeadHosts)
	return rec
}
