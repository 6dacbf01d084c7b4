package delivery

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
)

// What is learned about greylisting belongs to the greylister, and the
// greylister sits at the MX host: a hosting provider puts thousands of
// domains behind one postgrey. So every greylisting reply and pass at an
// MX address is learned twice, in the domain's record and in the host's,
// a queue.Destination named by the address in brackets ("[192.0.2.1]",
// an address literal as in RFC 5321 §4.1.3, which no domain can be). It
// is stored with the outcome that taught it, shared with the other nodes
// like a domain's (Shared), and listed by `destinations` beside them. A
// domain's own window, once it has one, places its retries (it refines
// the host's: a domain may be whitelisted or greylisted apart); until
// then, the host's window does, so the first message to a further domain
// behind a greylister that one domain taught passes as fast as that
// domain's next one.

// hostReload bounds how often a host's record is read again from the
// shared store: often enough that what another node learned reaches this
// one within a few messages, rarely enough to cost nothing per message.
const hostReload = time.Minute

// host is what the engine learned about one MX address. It is the
// loop's (loop.go), like the map that holds it (Engine.hosts): the
// workers of every domain behind the address learn about it through the
// loop, which settles their outcomes and takes their paced starts.
type host struct {
	rec     queue.Destination
	stored  queue.Destination // what the queue holds
	checked time.Time         // when the shared store was last read (hostViews)
	// reading is closed once the shared store's view being read now
	// (hostViews) is adopted; nil when none is being read.
	reading chan struct{}
	// lastStart is when the last transaction to the address started
	// (hostGate), pacedSince when its pace last began, lastRefused when
	// it last refused for rate; wake is closed (by the loop) when its
	// next paced start comes sooner than waiting workers were told.
	lastStart, pacedSince, lastRefused time.Time
	wake                               chan struct{}
	// sharedPace is when the pace last read from the shared store was
	// learned there (its record's Updated; hostPaceStale).
	sharedPace time.Time
	// used is when the loop last looked the address up (hostOf).
	used time.Time
}

// hostKey is the record name of the MX address addr.
func hostKey(addr string) string { return "[" + addr + "]" }

// hostFor returns the host record of addr that the settlement s learns
// about, on the loop's goroutine; nil if addr is empty.
func (e *Engine) hostFor(s *settlement, addr string, now time.Time) *host {
	if addr == "" {
		return nil
	}
	if h := s.hosts[addr]; h != nil {
		return h
	}
	h := e.hostOf(addr)
	if s.hosts == nil {
		s.hosts = map[string]*host{}
	}
	s.hosts[addr] = h
	return h
}

// hostOf returns the host record of addr, read from the queue the first
// time. The loop's goroutine only; what the shared store holds about the
// host is read off the loop and adopted with adoptHostViews.
func (e *Engine) hostOf(addr string) *host {
	h := e.hosts[addr]
	if h == nil {
		h = &host{}
		e.hosts[addr] = h
	}
	h.used = e.now()
	if h.rec.Domain == "" {
		h.rec.Domain = hostKey(addr)
		if rec, ok, err := e.q.Destination(h.rec.Domain); err == nil && ok {
			h.rec, h.stored = rec, cloneDest(rec)
		}
	}
	return h
}

// Every MX address a transaction goes to gets an entry in Engine.hosts
// (hostGate takes its start there), so a relay that mails many domains
// over weeks would keep one for every address it ever reached. An entry
// that holds nothing its stored record lacks is forgotten after hostIdle
// without use, as a destination is (evict): its record is read again
// from the queue the next time.

// hostIdle is how long an MX address's entry stays in memory unused.
// Longer than any transaction under way to it (a refusal it settles
// compares the attempt's start with the host's last refusal), and long
// enough that a busy address is read from the queue once, not per
// message.
const hostIdle = 15 * time.Minute

// hostSweepEvery bounds how often the loop walks every entry.
const hostSweepEvery = time.Minute

// evictHosts forgets the entries that may be forgotten at now (idle),
// at most once per hostSweepEvery. The loop's goroutine only.
func (e *Engine) evictHosts(now time.Time) {
	if now.Sub(e.hostsSwept) < hostSweepEvery && !now.Before(e.hostsSwept) {
		return
	}
	e.hostsSwept = now
	for addr, h := range e.hosts {
		if h.idle(now) {
			delete(e.hosts, addr)
		}
	}
}

// idle reports whether h may be forgotten at now: unused for hostIdle,
// no shared store read of it under way, nothing learned that its stored
// record lacks (or nothing learned at all), and no paced start to wait
// for: a worker that waited for one asks again by address, and a fresh
// entry starts it at once, as h would have.
func (h *host) idle(now time.Time) bool {
	if now.Sub(h.used) < hostIdle || h.reading != nil {
		return false
	}
	if !sameDest(h.rec, h.stored) && !sameDest(h.rec, queue.Destination{Domain: h.rec.Domain}) {
		return false
	}
	p := pace(&h.rec)
	return !p.Paced() || !p.Start(h.lastStart, now).After(now)
}

// hostView is what the shared store said about an MX address: the other
// nodes' view of its record (ok false: none, or the store is away).
type hostView struct {
	addr string
	rec  queue.Destination
	ok   bool
	at   time.Time
}

// hostReads is what one worker read from the shared store about MX hosts
// (hostViews), for the loop to adopt (adoptHostViews). done is closed
// once it is adopted: other workers that need those hosts meanwhile wait
// for it, as they would have waited for the record while it was read.
type hostReads struct {
	views []hostView
	done  chan struct{}
}

// hostViews reads the shared store's view of those of addrs not read for
// hostReload, on the caller's goroutine (a worker's: a network round
// trip never holds up the loop), for the loop to adopt (adoptHostViews)
// before it learns about them; the caller must hand them to it. The loop
// marks them read when it names them, so workers of several domains do
// not read one host at once: a worker that needs a host another is
// reading waits for that read to be adopted, so it never learns from
// the record before it.
func (e *Engine) hostViews(addrs ...string) hostReads {
	if e.opt.Shared == nil {
		return hostReads{}
	}
	now := e.now()
	var stale []string
	var others []chan struct{}
	r := hostReads{done: make(chan struct{})}
	e.call(func() {
		for _, addr := range addrs {
			if addr == "" || slices.Contains(stale, addr) {
				continue
			}
			switch h := e.hostOf(addr); {
			case h.reading != nil:
				others = append(others, h.reading)
			case now.Sub(h.checked) >= hostReload:
				h.checked, h.reading = now, r.done
				stale = append(stale, addr)
			}
		}
	})
	for _, c := range others {
		<-c
	}
	for _, addr := range stale {
		rec, ok := e.opt.Shared.Load(hostKey(addr))
		r.views = append(r.views, hostView{addr: addr, rec: rec, ok: ok, at: now})
	}
	return r
}

// adoptHostViews merges what hostViews read into the host records, on
// the loop's goroutine.
func (e *Engine) adoptHostViews(r hostReads) {
	if r.done == nil {
		return
	}
	defer close(r.done)
	for _, v := range r.views {
		h := e.hostOf(v.addr)
		if h.reading == r.done {
			h.reading = nil
		}
		if !v.ok {
			continue
		}
		adoptShared(&h.rec, v.rec, v.at)
		// As for a domain (loadShared): a transaction under way when
		// another node was refused teaches nothing more.
		h.lastRefused = laterRefusal(h.lastRefused, h.rec.PaceRefused, v.at)
		if v.rec.PaceInterval > 0 && v.rec.Updated.After(h.sharedPace) {
			h.sharedPace = v.rec.Updated
		}
	}
}

// hostRecords returns the host records s changed, marked stored, for the
// settlement's update.
func hostRecords(s *settlement, now time.Time) []queue.Destination {
	var out []queue.Destination
	for _, h := range s.hosts {
		if sameDest(h.rec, h.stored) {
			continue
		}
		h.rec.Updated = now
		h.stored = cloneDest(h.rec)
		out = append(out, h.rec)
	}
	return out
}

// greylistWaitAt learns from a greylisting reply at the MX address addr
// (see greylistWait) in both the domain's record and the host's, and
// places the retry by the domain's window, or by the host's while the
// domain has none.
func (e *Engine) greylistWaitAt(s *settlement, rec *queue.Destination, addr string, in backoff.Input, first, now time.Time) time.Duration {
	h := e.hostFor(s, addr, now)
	if h == nil {
		return greylistWait(e.policy, rec, in, first, now, e.opt.Rand())
	}
	place, other := rec, &h.rec
	if !window(rec).Known() && window(&h.rec).Known() {
		place, other = &h.rec, rec
	}
	elapsed := now.Sub(first)
	observeGreylisted(other, in.GreylistTries, elapsed, now)
	return greylistWait(e.policy, place, in, first, now, e.opt.Rand())
}

// learnPassAt records a greylisting pass at addr in the domain's record
// and the host's. passed runs to now, the settlement; what is learned runs
// to the attempt's start instead (s.started), the way a later retry is
// placed (its wait runs from its greylisting reply to its start): measured
// to the settlement, the learned bound would include the passing
// transaction itself, and a later message placed at it would come that
// much later than the one that taught it.
func (e *Engine) learnPassAt(s *settlement, rec *queue.Destination, addr string, passed time.Duration, now time.Time) {
	passed = toStart(passed, s.started, now)
	learnGreylistPass(rec, passed, now)
	if h := e.hostFor(s, addr, now); h != nil {
		learnGreylistPass(&h.rec, passed, now)
	}
}

// toStart returns a wait that ran until now, less the time since the
// attempt started at started (unchanged if started is unknown or not
// within the wait).
func toStart(wait time.Duration, started, now time.Time) time.Duration {
	if started.IsZero() || !started.Before(now) || now.Sub(started) >= wait {
		return wait
	}
	return wait - now.Sub(started)
}

// observeGreylisted records a greylisting reply (the tries-th of its
// episode, elapsed after the first) in rec without placing a retry by it:
// no probe is spent.
func observeGreylisted(rec *queue.Destination, tries int, elapsed time.Duration, now time.Time) {
	rec.Greylists = true
	rec.GreylistSeen++
	rec.LastGreylisted = now
	if tries > 1 {
		setWindow(rec, window(rec).Refused(elapsed), now)
	}
}

// unstoreHosts notes that the host records among recs were not stored
// (their commit failed and the held outcome is stored without them): the
// next outcome that teaches about such a host carries its record then
// current.
func (e *Engine) unstoreHosts(recs []queue.Destination) {
	for _, rec := range recs {
		addr, ok := strings.CutPrefix(rec.Domain, "[")
		if !ok {
			continue
		}
		if h := e.hosts[strings.TrimSuffix(addr, "]")]; h != nil {
			h.stored = queue.Destination{}
		}
	}
}

// Greylisting learned from behaviour. Many greylisting setups answer with
// no greylisting text at all: Exim's default for an ACL "defer" is "451
// Temporary local problem - please try later", which the classifier can
// only call a server error. Such a reply at RCPT from one MX host is
// greylisting for that host when it behaves like it: recipients it
// deferred passed at their first retry to the same address from the same
// source (the same triplet, RFC 6647 §4.4), at least greyLikeMin of them
// and more than twice as many as were refused again there. Until then,
// and for a reply that keeps being refused at the first retry, the
// ordinary schedule stands. The evidence (the reply, the passes and the
// refusals) is kept in the host's record, which `destinations` lists.
const greyLikeMin = 2

// greyLike reports whether v, a deferral at the MX address addr, is to be
// treated as greylisting from what the host's behaviour taught.
func (e *Engine) greyLike(s *settlement, addr string, v classifier.Verdict, now time.Time) bool {
	if v.Reason != classifier.ServerError || v.Stage != smtpvocab.StageRCPT || v.Hint > 0 {
		return false
	}
	h := e.hostFor(s, addr, now)
	if h == nil {
		return false
	}
	r := &h.rec
	return r.GreyLike == v.Text && r.GreyLikePassed >= greyLikeMin && r.GreyLikePassed > 2*r.GreyLikeRefused
}

// noteFirstRetry learns from the first retry of a recipient whose first
// attempt was deferred with a 4xx server error (o.r), made to the same
// address from the same source (res): passed, or refused again with the
// same reply (v; nil when it passed).
func (e *Engine) noteFirstRetry(s *settlement, o outcome, res *queue.Result, v *classifier.Verdict, now time.Time) {
	r := o.r
	if r.Attempts != 1 || r.Reason != string(classifier.ServerError) || r.Reply.Code/100 != 4 ||
		r.MXAddr == "" || r.MXAddr != res.MXAddr || r.SourceIP != res.SourceIP {
		return
	}
	if v != nil && (v.Reason != classifier.ServerError || v.Text != r.Reply.Text) {
		return // another answer: tells nothing about this reply
	}
	h := e.hostFor(s, r.MXAddr, now)
	if h == nil {
		return
	}
	rec := &h.rec
	if rec.GreyLike != r.Reply.Text {
		if rec.GreyLikePassed >= greyLikeMin {
			return // keep what a reply already taught
		}
		rec.GreyLike, rec.GreyLikePassed, rec.GreyLikeRefused = r.Reply.Text, 0, 0
	}
	if v == nil {
		rec.GreyLikePassed++
	} else {
		rec.GreyLikeRefused++
	}
}

// forgetHosts drops what is held in memory about the MX hosts among names
// ("[address]"), which the operator asked to forget: the next settlement
// that learns about one reads its record again (gone by then).
func (e *Engine) forgetHosts(names map[string]bool) {
	for name := range names {
		addr, ok := strings.CutPrefix(name, "[")
		if !ok {
			continue
		}
		if h := e.hosts[strings.TrimSuffix(addr, "]")]; h != nil {
			h.rec, h.stored, h.checked = queue.Destination{}, queue.Destination{}, time.Time{}
		}
	}
}

// Throttling learned per MX host. A rate limit, like a greylister, sits
// at the MX host, and every domain behind it shares its allowance: each
// rate-limit reply and each message accepted while it is paced teaches
// the host's pace (backoff.Pace) as well as the domain's (learnHostPace;
// the messages of a host never paced are not counted there, so that a
// busy MX costs no host record per message: its opening starts from the run of
// the domain that met its first refusal). A
// domain with a pace of its own keeps it (it refines the host's: the
// limit may be per recipient domain); until it has one, its transactions
// to a paced host start one host gap apart, counted from the last start
// there by any domain (hostGate), so the first burst to a further domain
// behind a host that one domain taught is paced from its first message
// instead of spending the host's window and an opening of its own. The
// host's pace is shared with the other nodes with its record and, like a
// domain's, spaces the starts across them (Shared.Pace).

// hostPaceStale is how long after its last change a host's pace stops
// pacing the domains without one of their own: a domain's pace ends when
// its mail is gone (decayThrottle), a host's serves many domains and has
// no such end, and a limit met a day ago says little about today.
const hostPaceStale = time.Hour

// learnHostPace teaches the pace of the MX address addr from the
// settlement s: its rate-limit reply, or the messages it had accepted;
// rec is the domain's record, as s left it.
func (e *Engine) learnHostPace(s *settlement, rec *queue.Destination, addr string, now time.Time) {
	if addr == "" || (!s.limited && !s.success) || (!s.limited && !e.hostPaced(s, addr)) {
		return // an unpaced host learns from refusals only: no host record per delivered message
	}
	h := e.hostFor(s, addr, now)
	p := pace(&h.rec)
	was := p.Paced()
	before := p.Start(h.lastStart, h.lastStart)
	if s.limited {
		if s.started.After(h.lastRefused) {
			p = p.OnRefused() // as for a domain: one under way says nothing new
			h.rec.PaceRefused = now
		}
		if !was && p.Run == 0 {
			// The host counted no run: the domain's, which met the
			// refusal, sets the opening's rate.
			p.Run, p.RunStart = rec.PaceRun, rec.PaceRunStart
		}
		h.lastRefused = now
	} else {
		p = learnAccepted(p, s.accepted, s.started, h.pacedSince, now)
	}
	if !was && p.Paced() {
		h.pacedSince = now
	}
	setPace(&h.rec, p)
	if p.Start(h.lastStart, h.lastStart).Before(before) && h.wake != nil {
		close(h.wake) // the next start comes sooner: wake the waiting workers
		h.wake = nil
	}
}

// hostPaced reports whether the host record of addr in memory is paced.
// Unlike hostFor it does not read the record.
func (e *Engine) hostPaced(s *settlement, addr string) bool {
	if h := s.hosts[addr]; h != nil {
		return h.rec.PaceInterval > 0
	}
	h := e.hosts[addr]
	return h != nil && h.rec.PaceInterval > 0
}

// hostGate waits, for a domain without a pace of its own, until the
// learned pace of the MX address addr lets the next transaction to it
// start, and takes that start (across the nodes too, as paceWait does);
// a domain with a pace of its own, or an address not paced, only notes
// its start. An attempt takes one start per address (a.hostStart).
// release is called before a wait longer than paceIdle. It returns
// false if ctx ended first.
func (e *Engine) hostGate(ctx context.Context, d *dest, a *attempt, addr string, release func()) bool {
	if addr == "" || a.hostStart == addr {
		return true
	}
	a.hostStart = addr
	released, own, first := false, false, true
	for {
		views := e.hostViews(addr)
		var st paceStep
		e.call(func() {
			if first { // whether d has a pace of its own when the wait began
				own, first = pace(&d.rec).Paced(), false
			}
			e.adoptHostViews(views)
			st = e.hostStart(addr, own)
		})
		if st.took {
			if !st.paced {
				return true
			}
			return e.sharedHostWait(ctx, addr, st.p, st.now, release, released)
		}
		wait := st.at.Sub(st.now)
		if wait > paceIdle && !released {
			release()
			released = true
		}
		if !sleepCtx(ctx, wait, st.wake) {
			return false
		}
	}
}

// paceStep is the loop's answer to a worker waiting for a start at an MX
// address (hostStart) or at its destination (takeStart): the start was
// taken at now, or the next may come at at, sooner if wake is closed.
type paceStep struct {
	took    bool
	paced   bool // hostStart: the start is one of the host's pace, p
	p       backoff.Pace
	now     time.Time
	at      time.Time
	wake    <-chan struct{}
	refused int // takeStart: d.refused when the start was taken
}

// hostStart takes the next start at the MX address addr, on the loop's
// goroutine: at once for a domain with a pace of its own (own) or an
// address not paced (the start is only noted), else when the host's
// pace lets it.
func (e *Engine) hostStart(addr string, own bool) paceStep {
	now := e.now()
	h := e.hostOf(addr)
	p := pace(&h.rec)
	if now.Sub(h.rec.Updated) > hostPaceStale && now.Sub(h.sharedPace) > hostPaceStale {
		p = backoff.Pace{} // learned long ago: the domain learns afresh if refused
	}
	at := p.Start(h.lastStart, now)
	if own || !p.Paced() || !at.After(now) {
		h.lastStart = now
		return paceStep{took: true, paced: !own && p.Paced(), p: p, now: now}
	}
	if h.wake == nil {
		h.wake = make(chan struct{})
	}
	return paceStep{now: now, at: at, wake: h.wake}
}

// paceHostAhead is how far ahead a host's paced start is reserved across
// the nodes: whatever the wait (unlike a domain's, sharedAhead), since
// hostGate takes the host's local start before it asks.
const paceHostAhead = time.Hour

// sharedHostWait reserves the start at now under the host's pace p
// across the nodes (Shared.Pace, keyed by the host's record name) and
// waits for it; without a shared store, or with it away, the local start
// stands.
func (e *Engine) sharedHostWait(ctx context.Context, addr string, p backoff.Pace, now time.Time, release func(), released bool) bool {
	if e.opt.Shared == nil {
		return true
	}
	gap := p.Start(now, now).Sub(now)
	wait, ok := e.opt.Shared.Pace(hostKey(addr), gap, paceHostAhead)
	if !ok || wait <= 0 {
		return true
	}
	if wait > paceIdle && !released {
		release()
	}
	return sleepCtx(ctx, wait, nil)
}
