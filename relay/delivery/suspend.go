package delivery

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
)

// Suspended destinations.
//
// The operator's suspension stops delivery to a domain without touching
// its queue, as Postfix's defer_transports and KumoMTA's `kcli suspend`
// do: the scheduler treats the domain as paused, as it treats a throttled
// one, and moves its due recipients to the end of the suspension without
// an attempt (or, for one without an end, to suspendRecheck later), so
// that their attempts and backoff do not grow and their lifetime still
// runs (a message whose lifetime ends while suspended expires with its
// DSN, as it would in Postfix's deferred queue). New mail to the domain
// is queued and waits the same way. Resume makes the domain's waiting
// recipients due at once.
//
// A suspension is stored in the queue (it survives a restart) and, with
// a cluster, in the shared store (SuspensionStore): every node reads the
// shared set every suspendSync and takes it as its own, so a suspension
// or resume made on one node reaches the others within that time. While
// the shared store is away each node keeps the set it last knew.

// suspendSync is how often a node reads the suspensions its cluster
// shares.
const suspendSync = 2 * time.Second

// suspendRecheck is how far recipients of a domain suspended without an
// end are moved at a time: they are looked at again then, which costs one
// write per message, and resume makes them due at once anyway.
const suspendRecheck = time.Hour

// suspended is the postponement of a suspended destination's recipients.
var suspended = postponement{stage: "suspended", log: "delivery postponed: the operator suspended the destination"}

// SuspensionStore shares suspensions across the nodes of a cluster
// (relay/cluster implements it over Redis). Every method returns quickly
// and reports false while the store is away.
type SuspensionStore interface {
	// Suspensions returns every shared suspension.
	Suspensions() ([]queue.Suspension, bool)
	// PutSuspension shares s, replacing the domain's earlier one.
	PutSuspension(s queue.Suspension) bool
	// DeleteSuspension removes the domain's shared suspension.
	DeleteSuspension(domain string) bool
}

// paused reports whether d may not start attempts at now: it is throttled
// or suspended. The suspensions (e.susp, e.suspShared) are the loop's:
// the operator's and the cluster's changes to them run on its goroutine
// (inLoop).
func (e *Engine) paused(d *dest, now time.Time) bool {
	return d.throttle.Paused(now) || e.susp[d.name].Active(now)
}

// pauseEnd is when recipients of paused destination d are looked at
// again, and why they wait.
func (e *Engine) pauseEnd(d *dest, now time.Time) (time.Time, postponement) {
	s := e.susp[d.name]
	if !s.Active(now) {
		return d.throttle.Until, throttled
	}
	end := s.Until
	if end.IsZero() {
		end = now.Add(suspendRecheck)
	}
	if d.throttle.Until.After(end) {
		end = d.throttle.Until
	}
	return end, suspended
}

// loadSuspensions reads the stored suspensions into the engine (Run, at
// the start). With a cluster they count as shared: the shared set, once
// read, is the truth, so a resume another node made while this one was
// down is not undone.
func (e *Engine) loadSuspensions() error {
	ss, err := e.q.Suspensions()
	if err != nil {
		return fmt.Errorf("delivery: %w", err)
	}
	for _, s := range ss { // on the loop's goroutine, before the loop
		e.susp[s.Domain], e.suspShared[s.Domain] = s, e.opt.Suspensions != nil
	}
	e.m.Suspended.Set(float64(len(e.activeSuspensions(e.now()))))
	return nil
}

// Suspend stops delivery to domain (canonical) until until (zero: until
// Resume), storing the suspension in the queue and sharing it with the
// cluster. It replaces an earlier suspension of the domain.
func (e *Engine) Suspend(domain, reason string, until, now time.Time) (queue.Suspension, error) {
	s := queue.Suspension{Domain: domain, Reason: reason, Since: now, Until: until, Node: e.opt.Node}
	if err := e.q.Suspend(s); err != nil {
		return s, fmt.Errorf("delivery: %w", err)
	}
	shared := e.opt.Suspensions != nil && e.opt.Suspensions.PutSuspension(s)
	if e.opt.Suspensions != nil && !shared {
		e.log.Warn("suspension not shared with the other nodes yet: the shared store is away; it is shared once the store is back",
			zap.String("domain", domain))
	}
	e.inLoop(func() {
		e.susp[domain], e.suspShared[domain] = s, shared
		e.m.Suspended.Set(float64(len(e.activeSuspensions(now))))
	})
	e.log.Info("destination suspended by the operator", zap.String("domain", domain), zap.String("reason", reason),
		zap.Time("until", until))
	e.Kick() // jobs already claimed for it go back to wait
	return s, nil
}

// Resume ends the suspension of domain (canonical) and makes its queued
// and deferred recipients due now. It reports whether the domain was
// suspended and how many recipients it made due.
func (e *Engine) Resume(domain string, now time.Time) (bool, int, error) {
	found, err := e.q.Resume(domain)
	if err != nil {
		return false, 0, fmt.Errorf("delivery: %w", err)
	}
	if e.opt.Suspensions != nil && !e.opt.Suspensions.DeleteSuspension(domain) {
		e.log.Warn("resume not shared with the other nodes: the shared store is away", zap.String("domain", domain))
	}
	var had bool
	e.inLoop(func() {
		_, had = e.susp[domain]
		delete(e.susp, domain)
		delete(e.suspShared, domain)
	})
	n, err := e.release(domain, now)
	if err != nil {
		return found || had, 0, err
	}
	e.log.Info("destination resumed by the operator", zap.String("domain", domain), zap.Int("recipients", n))
	return found || had, n, nil
}

// release makes the waiting recipients of a domain that is no longer
// suspended due now.
func (e *Engine) release(domain string, now time.Time) (int, error) {
	e.m.Suspended.Set(float64(len(e.Suspensions(now))))
	n, err := e.q.Retry(queue.Selector{Domain: domain}, now)
	if err != nil {
		return 0, fmt.Errorf("delivery: resume %s: %w", domain, err)
	}
	e.Kick()
	return n, nil
}

// Suspensions returns the suspensions in force at now, by domain.
func (e *Engine) Suspensions(now time.Time) (out []queue.Suspension) {
	e.inLoop(func() { out = e.activeSuspensions(now) })
	return out
}

// activeSuspensions is Suspensions on the loop's goroutine.
func (e *Engine) activeSuspensions(now time.Time) []queue.Suspension {
	var out []queue.Suspension
	for _, name := range slices.Sorted(maps.Keys(e.susp)) {
		if s := e.susp[name]; s.Active(now) {
			out = append(out, s)
		}
	}
	return out
}

// syncSuspensions takes the cluster's shared suspensions as this node's
// every suspendSync until ctx ends.
func (e *Engine) syncSuspensions(ctx context.Context) {
	t := time.NewTicker(suspendSync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.syncSuspensionsOnce()
		}
	}
}

// syncSuspensionsOnce stores and applies the shared suspensions that
// differ from this node's: new or changed ones are stored, ones that were
// shared and are no longer are resumed, and this node's own that the
// store never took (it was away) are shared now.
func (e *Engine) syncSuspensionsOnce() {
	shared, ok := e.opt.Suspensions.Suspensions()
	if !ok {
		return // the store is away: keep what this node knows
	}
	now := e.now()
	want := map[string]queue.Suspension{}
	for _, s := range shared {
		want[s.Domain] = s
	}
	var have map[string]queue.Suspension
	var wasShared map[string]bool
	e.inLoop(func() { have, wasShared = maps.Clone(e.susp), maps.Clone(e.suspShared) })
	for name, s := range want {
		if h, ok := have[name]; ok && sameSuspension(h, s) {
			e.markShared(name, true)
			continue
		}
		if err := e.q.Suspend(s); err != nil {
			e.log.Error("delivery: storing a shared suspension failed", zap.String("domain", name), zap.Error(err))
			continue
		}
		e.inLoop(func() { e.susp[name], e.suspShared[name] = s, true })
		e.log.Info("destination suspended on another node", zap.String("domain", name), zap.String("node", s.Node))
		e.Kick()
	}
	for name, s := range have {
		if _, ok := want[name]; ok {
			continue
		}
		if !wasShared[name] { // made while the store was away
			e.markShared(name, e.opt.Suspensions.PutSuspension(s))
			continue
		}
		if _, err := e.q.Resume(name); err != nil {
			e.log.Error("delivery: removing a resumed suspension failed", zap.String("domain", name), zap.Error(err))
			continue
		}
		e.inLoop(func() {
			delete(e.susp, name)
			delete(e.suspShared, name)
		})
		e.log.Info("destination resumed on another node", zap.String("domain", name))
		if _, err := e.release(name, now); err != nil {
			e.log.Error("delivery: resuming a destination failed", zap.String("domain", name), zap.Error(err))
		}
	}
	e.m.Suspended.Set(float64(len(e.Suspensions(now))))
}

// markShared notes whether the shared store holds name's suspension.
func (e *Engine) markShared(name string, shared bool) {
	e.inLoop(func() {
		if _, ok := e.susp[name]; ok {
			e.suspShared[name] = shared
		}
	})
}

// sameSuspension compares suspensions field by field (times by instant:
// one read back from the shared store has another location).
func sameSuspension(a, b queue.Suspension) bool {
	return a.Domain == b.Domain && a.Reason == b.Reason && a.Node == b.Node &&
		a.Since.Equal(b.Since) && a.Until.Equal(b.Until)
}
