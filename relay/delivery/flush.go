package delivery

import (
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/mx"
)

// Dead destinations and the operator's flush.
//
// When every address of a destination is on the dead-host list, no
// connection can be made, so no attempt is made either: the recipients are
// moved to when the first address may be dialed again, as a paused
// destination's are (push), their attempt count does not grow and their
// backoff does not advance. RFC 5321 §4.5.4.1: "A client SHOULD keep a
// list of hosts it cannot reach and corresponding connection timeouts,
// rather than just retrying queued mail items." Postfix defers such mail
// without a connection too ("delivery temporarily suspended").
//
// An operator's `queue retry` is a flush, as `postqueue -f` is for
// Postfix, whose queue manager then forgets its dead destinations: the
// operator says the next hop is back. Retry forgets the dead hosts and the
// throttle pause of the destinations of the selected recipients, then makes
// the recipients due, so the scheduler connects now instead of postponing
// them again. The throttle level (one connection at a time until
// successes relax it) and what was learned about greylisting stay: they
// say how to send, not whether. Forget (`greyrelay destinations forget`)
// drops everything learned about a destination.
//
// The records are changed where they live: a loaded destination in the
// loop's memory and the queue, one that is not loaded in the queue alone.
// The loop makes the change (inLoop), as it is the one that loads
// records (loadDests) and settles outcomes: a record read before the
// change is never adopted after it.

// deadHost is the postponement of recipients whose destination has every
// address on the dead-host list.
var deadHost = postponement{stage: "dead-host", label: true,
	log: "delivery postponed: every address of the destination failed recently"}

// deadWake is when the first dead address of rt may be dialed again (zero
// if none of its addresses is dead at now).
func (e *Engine) deadWake(d *dest, rt mx.Route, now time.Time) time.Time {
	dead := e.deadHosts(d)
	var wake time.Time
	for _, h := range rt.Hops {
		for _, addr := range h.Addrs {
			if t := deadUntil(&dead, addr.String(), now); !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
				wake = t
			}
		}
	}
	return wake
}

// postpone moves j's recipients to wake without an attempt (see above);
// v says why (every address is dead). Recipients past their lifetime
// expire.
func (e *Engine) postpone(d *dest, j *job, v classifier.Verdict, wake, now time.Time) {
	why := deadHost
	why.v = v
	// The claim is released after the write: until then they are due.
	err := e.pushMessage(d, j.id, j.rcpts, wake, now, why, e.settleAttempt)
	if err == nil {
		e.unclaim(j.rcpts)
		return
	}
	e.dropped(j.rcpts) // not moved: still behind the scan position
	e.log.Error("delivery: postponing recipients of an unreachable destination failed",
		zap.String("queue_id", j.id.String()), zap.String("domain", d.name), zap.Error(err))
}

// Retry is the operator's flush: it forgets the dead hosts and the
// throttle pause of the destinations of the recipients sel selects, then
// makes the Queued and Deferred ones due at now (queue.Retry). It returns
// how many recipients it made due. The caller kicks the scheduler.
func (e *Engine) Retry(sel queue.Selector, now time.Time) (int, error) {
	if err := e.flush(sel, now); err != nil {
		return 0, fmt.Errorf("delivery: retry: %w", err)
	}
	return e.q.Retry(sel, now)
}

// Requeue is the operator's `postsuper -r`: it flushes the destinations
// of the recipients sel selects, as Retry does, then routes them again
// (queue.Requeue): due now, where the last attempt went forgotten, the
// domain recomputed in its canonical form, the attempts kept. The message
// is not signed again: DKIM signing happens once, at intake (the stored
// message carries its signature, which stays valid as long as the
// message is unchanged). It returns how many recipients it requeued; the
// caller kicks the scheduler.
func (e *Engine) Requeue(sel queue.Selector, now time.Time) (int, error) {
	if err := e.flush(sel, now); err != nil {
		return 0, fmt.Errorf("delivery: requeue: %w", err)
	}
	decide, report := e.decider(now) // a held recipient is released: an outcome
	n, err := e.q.Requeue(sel, now, recipientDomain, decide)
	report(sel, err)
	if err != nil {
		return n, fmt.Errorf("delivery: requeue: %w", err)
	}
	return n, nil
}

// recipientDomain is the canonical domain of a recipient address.
func recipientDomain(addr string) string {
	i := strings.LastIndexByte(addr, '@')
	if i < 0 {
		return ""
	}
	return address.DomainKey(addr[i+1:])
}

// flush forgets the dead hosts and throttle pause of the destinations of
// the recipients sel selects (every destination with sel.All).
func (e *Engine) flush(sel queue.Selector, now time.Time) error {
	var domains []string
	if sel.Domain != "" {
		domains = []string{sel.Domain}
	} else if !sel.All {
		rs, err := e.q.Select(sel)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, r := range rs {
			if name := domainKey(r.Domain); !seen[name] {
				seen[name] = true
				domains = append(domains, r.Domain)
			}
		}
	}
	_, err := e.relearn(domains, sel.All, false, now)
	return err
}

// Forget drops everything learned about domain, or about every
// destination when all is set (greylisting, throttling, dead hosts), in
// memory and in the queue. It returns how many destinations it changed.
func (e *Engine) Forget(domain string, all bool, now time.Time) (int, error) {
	var domains []string
	if !all {
		domains = []string{domain}
	}
	n, err := e.relearn(domains, all, true, now)
	if err != nil {
		return n, fmt.Errorf("delivery: forget: %w", err)
	}
	e.Kick() // a pause or a dead host may have held due work back
	return n, nil
}

// relearn unpauses (or, with forget, forgets) the named destinations, or
// every stored and loaded one with all, on the loop's goroutine. It
// returns how many it changed.
func (e *Engine) relearn(domains []string, all, forget bool, now time.Time) (n int, err error) {
	e.inLoop(func() { n, err = e.relearnNow(domains, all, forget, now) })
	return n, err
}

// relearnNow is relearn on the loop's goroutine.
func (e *Engine) relearnNow(domains []string, all, forget bool, now time.Time) (int, error) {
	names := map[string]bool{}
	for _, name := range domains {
		names[domainKey(name)] = true
	}
	if all {
		stored, err := e.q.Destinations()
		if err != nil {
			return 0, err
		}
		for _, rec := range stored {
			names[domainKey(rec.Domain)] = true
		}
	}
	loaded := map[string]*dest{}
	for name, d := range e.dests {
		if all || names[name] {
			loaded[name] = d
			names[name] = true
		}
	}
	n := 0
	var unpaused []queue.Destination
	var gone []string
	for name := range names {
		if d := loaded[name]; d != nil {
			changed, err := e.relearnLoaded(d, forget, now)
			if err != nil {
				return n, err
			}
			if changed {
				n++
			}
			continue
		}
		rec, ok, err := e.q.Destination(name)
		switch {
		case err != nil:
			return n, err
		case !ok:
		case forget:
			gone = append(gone, name)
		case unpause(&rec):
			rec.Updated = now
			unpaused = append(unpaused, rec)
		}
	}
	if len(unpaused) > 0 {
		if _, err := e.q.Apply(queue.Update{Destinations: unpaused}); err != nil {
			return n, err
		}
		n += len(unpaused)
	}
	if len(gone) > 0 {
		k, err := e.q.ForgetDestinations(gone, false)
		n += k
		if err != nil {
			return n, err
		}
	}
	if forget {
		e.forgetHosts(names) // after the records are gone, or they would be read again
	}
	if n > 0 {
		e.log.Info("delivery: learned destination state changed by the operator",
			zap.Bool("forget", forget), zap.Bool("all", all), zap.Int("destinations", n))
	}
	return n, nil
}

// relearnLoaded unpauses or forgets a destination the scheduler holds, in
// memory and in the queue, on the loop's goroutine, which also settles
// every outcome that changes it.
func (e *Engine) relearnLoaded(d *dest, forget bool, now time.Time) (bool, error) {
	if forget {
		had := d.stored.Domain != "" || !sameDest(d.rec, queue.Destination{Domain: d.name})
		if _, err := e.q.ForgetDestinations([]string{d.name}, false); err != nil {
			return false, err
		}
		d.stored = queue.Destination{}
		e.adopt(d, queue.Destination{Domain: d.name})
		return had, nil
	}
	rec := cloneDest(d.rec)
	if !unpause(&rec) {
		return false, nil
	}
	rec.Updated = now
	if _, err := e.q.Apply(queue.Update{Destinations: []queue.Destination{rec}}); err != nil {
		return false, err
	}
	d.stored = cloneDest(rec)
	e.adopt(d, rec)
	return true, nil
}
