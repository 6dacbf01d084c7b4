package delivery

import (
	"time"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/queue"
)

// Shared is what several nodes share about destinations (relay/cluster
// implements it over Redis). The engine calls it when it loads a domain's
// state and when a worker opens a connection (Load, Acquire), before a
// transaction on a kept connection at most once per sharedRefresh (Load),
// and when its own record of a domain changed (Publish): never per message. Every
// method must return quickly and fail soft, granting and finding nothing
// while the shared store is away: local knowledge and local limits are the
// fallback.
type Shared interface {
	// Load returns another node's view of domain (only the shared fields).
	Load(domain string) (queue.Destination, bool)
	// Publish shares rec, which this node just changed and stored.
	Publish(rec queue.Destination)
	// Acquire takes one of limit connection slots to domain across the
	// nodes; false when all are taken. release gives it back. lost (nil
	// when it cannot happen) is closed when the slot is taken back: it was
	// granted while the shared store was away and, once the store answered
	// again, the other nodes' connections already used the limit. The
	// worker then closes its connection at the next message boundary.
	Acquire(domain string, limit int) (release func(), lost <-chan struct{}, ok bool)
	// Freed delivers the domain of each slot released by any node, so a
	// domain waiting for one asks again at once. It may miss some (the
	// engine also asks again after leaseRetry).
	Freed() <-chan string
	// Pace finds the next start of a transaction to domain under a pace
	// of one start per interval across the nodes, reserves it if it comes
	// within ahead, and says how long to wait for it (longer than ahead:
	// not reserved); false when the shared store is away (the node then
	// paces on its own).
	Pace(domain string, interval, ahead time.Duration) (wait time.Duration, ok bool)
}

// leaseRetry is how long a domain whose cluster-wide connection slots are
// all taken waits before it asks again without an announced release
// (another node died and its lease expires, or an announcement was lost).
const leaseRetry = time.Second

// adoptShared merges another node's view of a destination into rec: what
// it learned later than rec wins. The greylisting window comes from the
// record that learned it later (newerWindow), the learned pace from the
// one that knows the later refusal (newerPace), the throttle level, which
// the same rate-limit replies raise, likewise even when the pace has
// ended (learnedLater), dead hosts are the union (the later time for
// each), and per-node counters stay rec's own.
func adoptShared(rec *queue.Destination, sh queue.Destination, now time.Time) {
	if newerWindow(sh, *rec) {
		rec.LearnedDelay, rec.GreylistLow = sh.LearnedDelay, min(sh.GreylistLow, sh.LearnedDelay)
		rec.GreylistLearned = sh.GreylistLearned
	}
	if newerPace(sh, *rec) {
		// The refusals too: they double the gap (backoff.Pace).
		rec.PaceInterval, rec.PaceBase, rec.PaceRefusals = sh.PaceInterval, sh.PaceBase, sh.PaceRefusals
		rec.PaceRefused = sh.PaceRefused
	}
	if learnedLater(sh, *rec, sh.PaceRefused, rec.PaceRefused) {
		// A node that had not heard of a rate-limit reply elsewhere
		// relaxed the level it learned from it: not here.
		rec.ThrottleLevel = sh.ThrottleLevel
	}
	if sh.Updated.After(rec.Updated) {
		rec.Greylists = rec.Greylists || sh.Greylists
		if sh.LastGreylisted.After(rec.LastGreylisted) {
			rec.LastGreylisted = sh.LastGreylisted
		}
		if sh.LastReply.Code != 0 {
			rec.LastReply = sh.LastReply
		}
		if sh.GreyLike != "" && sh.GreyLikePassed+sh.GreyLikeRefused >= rec.GreyLikePassed+rec.GreyLikeRefused {
			// An MX host's evidence (host.go): the longer record wins.
			rec.GreyLike, rec.GreyLikePassed, rec.GreyLikeRefused = sh.GreyLike, sh.GreyLikePassed, sh.GreyLikeRefused
		}
	}
	if sh.ThrottledUntil.After(rec.ThrottledUntil) && sh.ThrottledUntil.After(now) {
		rec.ThrottledUntil = sh.ThrottledUntil
		rec.ThrottleLevel = max(rec.ThrottleLevel, sh.ThrottleLevel)
	}
	for addr, until := range sh.DeadHosts {
		if until.After(now) && until.After(rec.DeadHosts[addr]) {
			markDead(rec, addr, until)
		}
	}
}

// newerPace reports whether sh's pace should replace rec's: it knows a
// later refusal, or the same one and was updated later. By Updated alone,
// a node's acceptances, learned after another node's refusal but before
// it heard of it, undid the refusal's slowdown: in a cluster paced at the
// destination's rate, one node was refused every sixth message and kept
// the rate (TestPacing_ClusterUsesAllowedRate).
func newerPace(sh, rec queue.Destination) bool {
	return sh.PaceInterval > 0 && learnedLater(sh, rec, sh.PaceRefused, rec.PaceRefused)
}

// newerWindow reports whether sh's greylisting window should replace
// rec's: sh knows a pass, and learned its window later (by the record's
// Updated when both learned it at the same time, or neither says when).
// By Updated alone, a node greylisted again before it read another
// node's narrower window published its own older one later, and the
// other node adopted that, forgetting what it had learned.
func newerWindow(sh, rec queue.Destination) bool {
	return sh.LearnedDelay > 0 && learnedLater(sh, rec, sh.GreylistLearned, rec.GreylistLearned)
}

// learnedLater reports whether sh learned something later than rec did,
// shAt and recAt being when each learned it: by those times, then by
// when each record last changed.
func learnedLater(sh, rec queue.Destination, shAt, recAt time.Time) bool {
	if !shAt.Equal(recAt) {
		return shAt.After(recAt)
	}
	return sh.Updated.After(rec.Updated)
}

// laterRefusal returns when the last rate-limit reply was learned, last
// being this node's and at another node's (the nodes' clocks differ:
// never later than now).
func laterRefusal(last, at, now time.Time) time.Time {
	if at.After(now) {
		at = now
	}
	if at.After(last) {
		return at
	}
	return last
}

// loadShared merges the shared view of d's domain into d.rec, the
// scheduler's throttle copy and d.paceHold: a pace adopted from another
// node keeps d (and its lastStart) in memory until its next start may
// come, as one learned here does. The shared store is read on the
// caller's goroutine (a worker's), never on the loop's, and what it said
// is merged on the loop's.
func (e *Engine) loadShared(d *dest) {
	if e.opt.Shared == nil {
		return
	}
	now := e.now()
	e.atLoop(func() { d.sharedAt = now }, false)
	sh, ok := e.opt.Shared.Load(d.name)
	if !ok {
		return
	}
	e.call(func() {
		before, beforeAt := d.rec.PaceRefusals, d.rec.PaceRefused
		adoptShared(&d.rec, sh, now)
		d.othersRun = sh.PaceRun
		if d.rec.PaceRefusals > before || d.rec.PaceRefused.After(beforeAt) {
			// Another node met a rate-limit reply: to paceGate it is one
			// of this destination's, and a start taken before it waits
			// for the pace again instead of probing the same full window;
			// a transaction that started before it was under way when
			// the window filled, and its refusal teaches nothing more
			// (deferred). Not later than now: the nodes' clocks differ.
			d.refused++
			d.lastRefused = laterRefusal(d.lastRefused, d.rec.PaceRefused, now)
		}
		e.adopt(d, d.rec)
	})
}

// sharedRefresh is how old d's shared view may be when a transaction
// starts on a connection kept open (refreshShared). Read only when a
// worker opens a connection, the view missed a pace that another node
// learned for as long as the connection carried messages: this node,
// not paced, neither waited nor reserved its starts across the nodes,
// and its starts ran into theirs (three nodes were refused 4 and 5
// times where one refusal teaches all). Once a second per destination
// is no per-message load on the shared store.
const sharedRefresh = time.Second

// refreshShared reads d's shared view again (loadShared) when it is
// older than sharedRefresh.
func (e *Engine) refreshShared(d *dest) {
	if e.opt.Shared == nil {
		return
	}
	var stale bool
	e.call(func() { stale = e.now().Sub(d.sharedAt) >= sharedRefresh })
	if stale {
		e.loadShared(d)
	}
}

// takeSlot is a worker's first step with other nodes: it refreshes d's
// shared knowledge and takes a cluster-wide connection slot (one of
// delivery.max_per_destination, or 1 while the domain throttles us). When
// none is free the domain is contended: one worker at a time asks again,
// when a release is announced or after leaseRetry.
func (e *Engine) takeSlot(d *dest) (release func(), lost <-chan struct{}, ok bool) {
	if e.opt.Shared == nil {
		return func() {}, nil, true
	}
	e.loadShared(d)
	var limit int
	e.call(func() {
		limit = backoff.Throttle{Level: d.rec.ThrottleLevel, Until: d.rec.ThrottledUntil}.Concurrency(e.cfg.Delivery.MaxPerDestination)
	})
	release, lost, ok = e.opt.Shared.Acquire(d.name, limit)
	granted, wait := ok, e.now().Add(leaseRetry) // copies: the closure runs on the loop
	e.atLoop(func() { e.slotAnswered(d, granted, wait) }, granted)
	if ok {
		return release, lost, true
	}
	time.AfterFunc(leaseRetry, e.Kick)
	return nil, nil, false
}

// slotAnswered notes on the loop's goroutine that a worker of d was
// granted a cluster-wide slot or not (then d waits for one until wait).
// A grant after d was contended lets the domain's other waiting jobs ask
// too.
func (e *Engine) slotAnswered(d *dest, ok bool, wait time.Time) {
	d.acquiring--
	if !ok {
		d.contended, d.slotWait = true, wait
		return
	}
	if d.contended {
		d.contended = false
		e.rewake = true
	}
}

// slotFreed notes that a slot of domain was released somewhere: if the
// domain waits for one, its next worker may ask at once. It reports
// whether that is so.
func (e *Engine) slotFreed(domain string) bool {
	d := e.dests[domainKey(domain)]
	if d == nil || !d.contended {
		return false
	}
	d.slotWait = time.Time{}
	return true
}

// nodeLimit is how many connections this node opens to one destination:
// delivery.max_per_destination, capped by max_per_destination_local when
// that is set (with shared limits, max_per_destination holds for all the
// nodes together and this caps one node's share of it).
func (e *Engine) nodeLimit() int {
	d := e.cfg.Delivery
	if d.MaxPerDestinationLocal > 0 {
		return min(d.MaxPerDestination, d.MaxPerDestinationLocal)
	}
	return d.MaxPerDestination
}
