package delivery

import (
	"maps"
	"time"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/queue"
)

// What the engine learns about a destination domain, stored in its
// queue.Destination record with the outcomes that taught it.
//
// Greylisting. A pass observed after a greylisting episode is an upper
// bound of the receiver's delay (it let us in after that long), biased
// upwards by our own retry schedule. Taking the average or the maximum of
// such observations would drift upwards: each first retry lands a margin
// after the learned delay and would teach a slightly longer one. So:
//
//   - nothing learned yet: the observed time becomes the learned delay;
//   - passed at the first retry: the learned delay is good; keep the
//     smaller of the two (a shorter pass proves a shorter delay suffices);
//   - passed only after two or more greylisting replies: the learned delay
//     was too short (the receiver changed or differs per MX); take the
//     larger of the two.
//
// The learned delay only shapes the first retry of later greylisting
// episodes (backoff.Input.LearnedDelay); it never delays other recipients:
// greylisting is per triplet and never slows the whole destination.

// learnGreylistPass records that a recipient first greylisted passed after
// passed, having been greylisted tries times.
func learnGreylistPass(rec *queue.Destination, passed time.Duration, tries int) {
	if passed <= 0 {
		return
	}
	switch {
	case rec.LearnedDelay <= 0:
		rec.LearnedDelay = passed
	case tries <= 1:
		rec.LearnedDelay = min(rec.LearnedDelay, passed)
	default:
		rec.LearnedDelay = max(rec.LearnedDelay, passed)
	}
	rec.Greylists = true
	rec.GreylistPassed++
}

// learnGreylisted records one greylisting reply.
func learnGreylisted(rec *queue.Destination, now time.Time) {
	rec.Greylists = true
	rec.GreylistSeen++
	rec.LastGreylisted = now
}

// learnThrottle updates the destination-wide throttle after an attempt: a
// rate-limit reply throttles the destination (concurrency 1, paused for a
// while; backoff.Policy.OnRateLimited), an accepted message relaxes it one
// level. A rate limit wins over a success in the same attempt.
func (e *Engine) learnThrottle(rec *queue.Destination, s *settlement, now time.Time) {
	t := backoff.Throttle{Level: rec.ThrottleLevel, Until: rec.ThrottledUntil}
	switch {
	case s.limited:
		t = e.policy.OnRateLimited(t, now, s.rated.Hint, e.opt.Rand())
		rec.LastReply = queue.Reply{Code: s.rated.Code, Enhanced: s.rated.Enhanced, Text: s.rated.Text}
	case s.success:
		t = t.OnSuccess()
	default:
		return
	}
	rec.ThrottleLevel, rec.ThrottledUntil = t.Level, t.Until
}

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
}

// markDead remembers that addr refused or ignored a connection, so that no
// attempt dials it again before until (RFC 5321 §4.5.4.1: "A client SHOULD
// keep a list of hosts it cannot reach and corresponding connection
// timeouts, rather than just retrying queued mail items"). Called with d.mu
// held; stored with the attempt's outcome.
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
