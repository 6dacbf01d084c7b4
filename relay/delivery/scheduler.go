package delivery

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/address"
)

// Scheduler limits. A scan reads the due index incrementally (a
// queue.DueCursor): it continues after the last entry the previous scan
// examined, and the queue moves the cursor back for every due entry a
// write puts behind it, so a wake costs what is new, not the backlog.
// Recipients it already holds, and those of destinations at capacity, are
// passed over by the index entry alone without being decoded.
//
// Passed-over and dropped entries stay behind the cursor. When a
// destination that had recipients passed over for lack of capacity has
// drained to half of it (or is paused), the scan moves back to the
// earliest of them: whatever it passed over for that reason is at or after
// that due time. A full rescan (from the first key) runs at startup, after
// a queue error, when claimed recipients are dropped without being
// recorded (a failed Begin, a message that vanished, a failed push), and
// every fullRescanEvery as a safety net.
const (
	scanBatch = 1000 // new due recipients taken per scan
	// reuseShare is how many queued transactions one connection is expected
	// to carry before the scheduler opens another connection to the same
	// domain: two messages for one domain share a connection, a burst of
	// hundreds spreads over up to delivery.max_per_destination connections.
	reuseShare = 8
	// rampRun is how many accepted (or greylisted) messages add one
	// connection while a destination's run is shorter than rampSlow; past
	// it, each adds one, up to delivery.max_per_destination.
	rampRun  = 32
	rampSlow = 128
	// errorPause paces the loop after a queue error.
	errorPause = time.Second
	// fullRescanEvery bounds how long anything the incremental scan could
	// have missed waits (it never should; this is a safety net).
	fullRescanEvery = 30 * time.Second
)

// dest is the scheduler's view of one destination domain, and what was
// learned about it. Every field is the loop's (loop.go): read and written
// on its goroutine only. Workers reach them by asking the loop (call:
// their paced start, the dead hosts, the settling of their outcomes) or
// leave it a note (atLoop); the recorder leaves notes.
type dest struct {
	name     string
	pending  []*job           // claimed, waiting for a worker
	active   int              // running workers
	throttle backoff.Throttle // copy of rec's throttle (adopt)
	// idle are the reply channels of d's workers waiting with an open
	// connection for a job (answerAwait).
	idle []chan answer
	// passedAt is the earliest due time of recipients a scan left in the
	// queue because pending was full (zero: none); draining to half of it
	// moves the scan back there.
	passedAt time.Time
	// contended: the last worker to ask for a cluster-wide connection slot
	// found every one taken. Until one is granted, one worker at a time
	// asks, at slotWait or when a release is announced (shared.go), so
	// the domain's jobs wait here in order.
	contended bool
	slotWait  time.Time
	acquiring int // workers asking for a slot now
	// recording counts the outcomes carrying d's record whose commit is
	// not decided yet (record.go): d is not forgotten meanwhile, or its
	// record read again from the queue would be the one before them.
	recording int
	// paceHold is when d's learned pace next lets a transaction start:
	// lastStart plus the pace's gap (see notePace). d is not forgotten
	// before then: lastStart lives only here, and a destination read
	// again from the queue would start its next transaction at once.
	paceHold time.Time
	// ramp caps d's connections while it has shown little yet:
	// rampFor of answered, counting d's recipients accepted or
	// greylisted since it was read from the queue (see wantsWorker).
	ramp, answered int
	// runKept is when the run of accepted messages d's record counts in
	// memory only (backoff.Pace.Run, see sameDest) stops mattering: d is
	// not forgotten before then either, or a destination that
	// rate-limits the next message after an idle moment would start its
	// pace from a run of one.
	runKept time.Time

	rec    queue.Destination // what was learned, stored or not
	stored queue.Destination // what the queue holds (deep copy)
	// lastStart is when the last transaction was allowed to start
	// (paceWait), prevStart the one before (giveBackStart).
	lastStart, prevStart time.Time
	// pacedSince is when the destination's pace last began (its first
	// refusal after an unpaced time), lastRefused when a rate-limit
	// reply was last learned.
	pacedSince, lastRefused time.Time
	// refused counts the attempts that met a rate-limit reply (paceGate).
	refused int
	// othersRun is the other nodes' run of accepted messages before the
	// destination first refused, from the shared view (Shared.Load's
	// PaceRun): the node that ends the opening counts it with its own.
	othersRun int
	// paceWake is closed (by the loop) when the next paced start comes
	// sooner than the workers waiting for it were told (notePace).
	paceWake chan struct{}
	// sharedAt is when the other nodes' view was last read (loadShared).
	sharedAt time.Time
}

// job is one SMTP transaction to be: due recipients of one message at one
// domain. want is the MX address that greylisted them ("" for any).
type job struct {
	id     queue.ID
	domain string
	want   string
	rcpts  []queue.Recipient
	fresh  *freshJob // started from a fresh message (fresh.go); nil: read from the queue
	// pol is what the message's own TLS policy asks of a connection
	// (REQUIRETLS, "TLS-Required: No"), taken when the job was built, so
	// that the loop decides whether the job may ride an open connection
	// without reading the message (reuse).
	pol msgPolicy
	// refused is d.refused when the job's start was taken (paceGate).
	refused int
}

func (j *job) keys() []queue.Key {
	ks := make([]queue.Key, len(j.rcpts))
	for i, r := range j.rcpts {
		ks[i] = r.Key
	}
	return ks
}

// Run is the scheduler loop. It recovers attempts interrupted by a crash,
// then starts deliveries as they fall due until ctx is cancelled. It returns
// once every worker has ended (cancelling ctx aborts their attempts, which
// stay recorded as in progress and are recovered at the next start) and
// every outcome handed to the queue has its commit decided (record.go).
func (e *Engine) Run(ctx context.Context) error {
	defer e.endLoop()
	e.cur = e.q.DueCursor()
	defer e.cur.Close()
	n, err := e.q.Recover(e.now())
	if err != nil {
		return fmt.Errorf("delivery: recover: %w", err)
	}
	if n > 0 {
		e.log.Info("recovered interrupted delivery attempts", zap.Int("recipients", n))
	}
	if err := e.loadSuspensions(); err != nil {
		return err
	}
	if e.opt.Suspensions != nil {
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go e.syncSuspensions(sctx)
	}
	defer e.record()() // runs after wg.Wait: no worker hands over an outcome any more
	var wg sync.WaitGroup
	defer wg.Wait()
	defer e.endLoop() // before wg.Wait: an operator's change no longer waits for the loop
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	fresh := e.fresh
	for {
		e.m.SchedulerWakeup.Inc()
		wait, ok := e.schedule(ctx, &wg)
		if ok {
			timer.Reset(wait) // Go >= 1.23: Reset discards a stale expiry
		} else {
			timer.Stop()
		}
		if !e.sleep(ctx, &wg, fresh, timer) {
			return nil
		}
	}
}

// endLoop marks the loop as ended (inLoop then runs an operator's change
// on its caller's goroutine). Run's goroutine alone calls it, at the end
// of the loop and on every return; the first call counts.
func (e *Engine) endLoop() {
	select {
	case <-e.ended:
	default:
		close(e.ended)
	}
}

// sleep waits for the next reason to schedule: the timer, a queue change,
// a kick, a note asking for a scan. A fresh message is claimed and
// dispatched meanwhile without a scan (the timer stays as it was), and an
// operator's change is run. It reports false when ctx ends.
func (e *Engine) sleep(ctx context.Context, wg *sync.WaitGroup, fresh <-chan queue.Fresh, timer *time.Timer) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case f := <-fresh:
			if e.takeFresh(f) {
				e.dispatch(ctx, wg)
			}
			continue
		case domain := <-e.freed:
			if e.slotFreed(domain) {
				e.dispatch(ctx, wg)
			}
			continue
		case o := <-e.ops:
			if e.runOp(o); !e.rewake { // a settled outcome may ask for a schedule (grow)
				continue
			}
		case a := <-e.asks:
			if e.answerAsk(a); !e.rewake { // its notes may ask for a schedule
				continue
			}
		case <-e.notes.wake:
			if e.readNotes(); !e.rewake {
				continue
			}
		case <-timer.C:
		case <-e.q.Wake():
		case <-e.kick:
		}
		return true
	}
}

// schedule is one iteration of the loop: claim due work, start workers and
// say when to look again (ok false: only when woken).
func (e *Engine) schedule(ctx context.Context, wg *sync.WaitGroup) (time.Duration, bool) {
	if ctx.Err() != nil {
		return 0, false
	}
	e.readNotes()
	e.rewake = false // this is the schedule asked for
	e.takeWaitingFresh()
	if d, paused := e.pause.left(e.now()); paused {
		return d, true
	}
	if err := e.scan(e.now()); err != nil {
		e.log.Error("delivery scheduler: queue scan failed", zap.Error(err))
		return errorPause, true
	}
	e.dispatch(ctx, wg)
	return e.nextWake()
}

// nextWake returns how long to sleep: until the earliest due time, or
// without a timer when nothing is waiting. Work that is due but was not
// started waits for capacity, and a worker's progress wakes the loop.
func (e *Engine) nextWake() (time.Duration, bool) {
	t, ok, err := e.q.NextDue()
	if err != nil {
		e.log.Error("delivery scheduler: next due time", zap.Error(err))
		return errorPause, true
	}
	if !ok {
		return 0, false
	}
	if d := t.Sub(e.now()); d > 0 {
		return d, true
	}
	busy := e.workers > 0
	if busy {
		return 0, false
	}
	// Due, not started and nobody working: a push failed or the queue
	// changed under us. Look again soon rather than never.
	return errorPause, true
}

// scan claims due recipients into jobs of their destinations, and pushes
// the due recipients of paused (throttled) destinations to the end of the
// pause instead of looking at them again and again.
func (e *Engine) scan(now time.Time) error {
	switch {
	case e.rescan || now.Sub(e.lastFull) >= fullRescanEvery || now.Before(e.lastFull):
		e.rescan, e.rewind = false, time.Time{}
		e.lastFull = now
		e.cur.Reset()
	case !e.rewind.IsZero():
		e.cur.Rewind(e.rewind)
		e.rewind = time.Time{}
	}
	skip, full := e.scanFilter(now)
	active := 0
	for _, sp := range e.susp {
		if sp.Active(now) {
			active++
		}
	}
	e.m.Suspended.Set(float64(active)) // also when a suspension with an end has ended
	hit := map[string]time.Time{}      // earliest due time passed over, by full domain
	rs, err := e.cur.Next(now, scanBatch, func(domain string, k queue.Key, due time.Time) bool {
		s, isFull := skip(domain, k)
		if isFull {
			name := domainKey(domain)
			if t, ok := hit[name]; !ok || due.Before(t) {
				hit[name] = due
			}
		}
		return s
	})
	if err != nil {
		e.requestRescan()
		return err
	}
	// Read after the walk's read transaction began, so it covers every
	// message the walk could see (fresh.go).
	e.scanned = e.q.Visible()
	if err := e.loadDests(rs); err != nil {
		e.requestRescan()
		return err
	}
	if len(rs) == scanBatch {
		// The limit cut the walk short: more due work, perhaps for other
		// destinations, lies beyond it. Look again at once instead of at
		// the next change, which may never come (a quiet queue whose
		// backlog is stuck at one destination).
		e.Kick()
	}
	push := e.claim(rs, now)
	for name, at := range hit {
		e.passOver(full[name], at)
	}
	for _, p := range push {
		e.push(p.d, p.rcpts, p.until, now, p.why)
	}
	return nil
}

// passOver notes that due recipients of d, the earliest due at at, were
// left in the queue because its job list was full. If it has meanwhile
// drained to half (nextJob did not see the note), the scan goes back for
// them now.
func (e *Engine) passOver(d *dest, at time.Time) {
	if d == nil {
		e.rescan = true
		return
	}
	if len(d.pending) <= e.pendingCap()/2 {
		e.rewindTo(at)
		e.Kick()
		return
	}
	if d.passedAt.IsZero() || at.Before(d.passedAt) {
		d.passedAt = at
	}
}

// rewindTo makes the next scan start no later than due time t.
func (e *Engine) rewindTo(t time.Time) {
	if e.rewind.IsZero() || t.Before(e.rewind) {
		e.rewind = t
	}
}

// pendingCap is how many jobs a destination may hold.
func (e *Engine) pendingCap() int { return e.cfg.Delivery.MaxPerDestination * reuseShare }

// scanFilter returns what the scan may pass over without decoding:
// recipients already claimed, and recipients of destinations whose job
// list is full (unless they belong to a message with a job there, which
// they join). The filter runs inside a queue read transaction, on the
// loop's goroutine: it reads the claimed set (the loop's own, loop.go)
// and a snapshot of the full destinations, which it also returns. The
// filter reports (skip, skipped because full).
func (e *Engine) scanFilter(now time.Time) (func(domain string, k queue.Key) (bool, bool), map[string]*dest) {
	fullIDs := map[string]map[queue.ID]bool{}
	full := map[string]*dest{}
	for name, d := range e.dests {
		if e.paused(d, now) || len(d.pending) < e.pendingCap() {
			continue
		}
		ids := map[queue.ID]bool{}
		for _, j := range d.pending {
			ids[j.id] = true
		}
		fullIDs[name], full[name] = ids, d
	}
	return func(domain string, k queue.Key) (bool, bool) {
		if e.claimed[k] {
			return true, false
		}
		if ids, ok := fullIDs[domainKey(domain)]; ok && !ids[k.ID] {
			return true, true
		}
		return false, false
	}, full
}

// loadDests creates the scheduler state of every domain in rs it does not
// know yet, reading what is stored about it; what the other nodes know
// about them is read off the loop (loadSharedViews).
func (e *Engine) loadDests(rs []queue.Recipient) error {
	missing := map[string]bool{}
	for _, r := range rs {
		if name := domainKey(r.Domain); e.dests[name] == nil {
			missing[name] = true
		}
	}
	var loaded []*dest
	for name := range missing {
		rec, ok, err := e.q.Destination(name)
		if err != nil {
			return err
		}
		stored := rec // zero if none: the first settle then writes one
		if !ok {
			rec = queue.Destination{Domain: name}
		}
		d := &dest{name: name, rec: rec, stored: cloneDest(stored), ramp: rampFor(e.cfg.Delivery.InitialPerDestination, 0, e.cfg.Delivery.MaxPerDestination),
			throttle: backoff.Throttle{Level: rec.ThrottleLevel, Until: rec.ThrottledUntil}}
		if e.dests[name] == nil {
			e.dests[name] = d
			e.order = append(e.order, name)
			loaded = append(loaded, d)
		}
	}
	e.loadSharedViews(loaded)
	return nil
}

// loadSharedViews reads what the other nodes know about the newly loaded
// destinations ds on a goroutine of its own, which hands it to the loop
// to adopt: the loop never waits on the shared store. Until then a
// destination goes by its own record; a worker reads the shared view
// again before it dials (takeSlot), so none sends before it is adopted.
func (e *Engine) loadSharedViews(ds []*dest) {
	if e.opt.Shared == nil || len(ds) == 0 {
		return
	}
	now := e.now()
	go func() {
		for _, d := range ds {
			sh, ok := e.opt.Shared.Load(d.name)
			if !ok {
				continue
			}
			e.atLoop(func() {
				adoptShared(&d.rec, sh, now)
				d.othersRun = sh.PaceRun
				e.adopt(d, d.rec)
			}, true)
		}
	}()
}

// pushItem is a set of recipients of a paused destination, to move to
// until.
type pushItem struct {
	d     *dest
	rcpts []queue.Recipient
	until time.Time
	why   postponement
}

// claim turns due recipients into jobs.
func (e *Engine) claim(rs []queue.Recipient, now time.Time) []pushItem {
	paused := map[*dest][]queue.Recipient{}
	for _, r := range rs {
		if e.claimed[r.Key] {
			continue
		}
		d := e.dests[domainKey(r.Domain)]
		if d == nil {
			e.rescan = true // appeared between Due and loadDests' view; next scan
			continue
		}
		if e.paused(d, now) {
			paused[d] = append(paused[d], r)
			continue
		}
		if !e.addToJob(d, r) {
			e.passOver(d, r.NextAttempt)
			continue
		}
		e.claimed[r.Key] = true
	}
	var out []pushItem
	for d, rcpts := range paused {
		until, why := e.pauseEnd(d, now)
		out = append(out, pushItem{d, rcpts, until, why})
	}
	// Jobs claimed before the destination was throttled (or suspended) go
	// the same way.
	for _, d := range e.dests {
		if !e.paused(d, now) || len(d.pending) == 0 {
			continue
		}
		var rcpts []queue.Recipient
		for _, j := range d.pending {
			rcpts = append(rcpts, j.rcpts...)
			for _, r := range j.rcpts {
				delete(e.claimed, r.Key)
			}
		}
		d.pending = nil
		until, why := e.pauseEnd(d, now)
		out = append(out, pushItem{d, rcpts, until, why})
		if !d.passedAt.IsZero() { // push those too, at the next scan
			e.rewindTo(d.passedAt)
			d.passedAt = time.Time{}
		}
	}
	return out
}

// addToJob adds r to a pending job of the same message and sticky MX, or
// starts a new job if the destination has room.
func (e *Engine) addToJob(d *dest, r queue.Recipient) bool {
	want := stickyAddr(r)
	for _, j := range d.pending {
		if j.id == r.Key.ID && j.want == want && len(j.rcpts) < e.cfg.Delivery.MaxRecipientsPerTransaction {
			j.rcpts = append(j.rcpts, r)
			return true
		}
	}
	if len(d.pending) >= e.pendingCap() {
		return false
	}
	d.pending = append(d.pending, &job{id: r.Key.ID, domain: d.name, want: want, rcpts: []queue.Recipient{r},
		pol: msgPolicy{requireTLS: r.RequireTLS, tlsOptional: r.TLSOptional, known: r.MessageRead}})
	return true
}

// stickyAddr is the MX address a recipient must return to: the one that
// greylisted it, while the greylisting episode lasts (FirstGreylisted is
// cleared when the recipient is accepted).
func stickyAddr(r queue.Recipient) string {
	if r.FirstGreylisted.IsZero() {
		return ""
	}
	return r.MXAddr
}

// domainKey is the destination a recipient's domain belongs to: its
// canonical form, so that a message queued by an older version with a
// U-label domain joins the A-label destination of the same name.
func domainKey(domain string) string { return address.DomainKey(domain) }

// dispatch starts workers, one per destination per round-robin pass, until
// every destination has the workers it wants or the global cap is reached.
// The pass starts where the previous one stopped, so under the global cap
// every domain gets its turn.
func (e *Engine) dispatch(ctx context.Context, wg *sync.WaitGroup) {
	e.readNotes() // evict must see every record on its way (recording)
	now := e.now()
	e.waiting = false
	for _, name := range e.order {
		wakeIdle(e.dests[name], false)
	}
	for started := true; started; {
		started = false
		n := len(e.order)
		for i := 0; i < n; i++ {
			idx := (e.next + i) % n
			d := e.dests[e.order[idx]]
			if !e.wantsWorker(d, now) {
				continue
			}
			if e.workers >= e.cfg.Delivery.MaxConnections {
				e.waiting = true
				e.next = idx
				for _, name := range e.order {
					wakeIdle(e.dests[name], true) // to give up their slots
				}
				e.evict(now)
				return
			}
			e.startWorker(ctx, wg, d)
			started = true
		}
	}
	e.evict(now)
}

// rampFor returns how many connections a destination gets after
// accepted messages (greylisted ones count as accepted: grow), from start
// (delivery.initial_per_destination, as Postfix's
// initial_destination_concurrency) up to max. A destination that
// rate-limits us refuses every RCPT already sent when its window fills, and nothing learned can
// recall them: the first rampSlow messages thus go over few connections
// (one per rampRun accepted), so that a window of up to about a hundred
// messages fills with at most three other transactions under way (one
// for 30 per minute, where the opening's probes alone spend 4.5% of the
// RCPTs). Past rampSlow, each accepted message adds one, as TCP's slow
// start doubles its window per round trip: a destination that does not
// throttle reaches its full concurrency 15 messages later.
func rampFor(start, accepted, max int) int {
	r := start + min(accepted, rampSlow)/rampRun
	if accepted > rampSlow {
		r += accepted - rampSlow
	}
	return min(r, max)
}

// wantsWorker reports whether d should get another connection now: it has
// jobs, is not paused, is under its concurrency (1 while throttled) and has
// more queued transactions than its connections are expected to carry.
func (e *Engine) wantsWorker(d *dest, now time.Time) bool {
	if len(d.pending) == 0 || e.paused(d, now) {
		return false
	}
	if d.contended && (now.Before(d.slotWait) || d.acquiring > 0) {
		return false
	}
	if d.active >= min(d.throttle.Concurrency(e.nodeLimit()), d.ramp) {
		return false
	}
	share := min(reuseShare, e.cfg.Delivery.MaxMessagesPerConnection)
	return d.active*share < len(d.pending)+d.active
}

// wakeIdle wakes as many of d's idle workers as it has jobs, or all of
// them.
func wakeIdle(d *dest, all bool) {
	n := len(d.idle)
	if !all {
		n = min(n, len(d.pending))
	}
	for _, c := range d.idle[len(d.idle)-n:] {
		reply(c, answer{recheck: true})
	}
	clear(d.idle[len(d.idle)-n:])
	d.idle = d.idle[:len(d.idle)-n]
}

// startWorker runs a worker for d.
func (e *Engine) startWorker(ctx context.Context, wg *sync.WaitGroup, d *dest) {
	e.workers++
	d.active++
	if e.opt.Shared != nil {
		d.acquiring++ // until slotAnswered
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.work(ctx, d)
		e.tell(note{ended: d})
	}()
}

// evict forgets destinations with no jobs, no workers, no record on its
// way into the queue and no paced start still to wait for at now; their
// state is in the queue and is read again when they have work. The MX
// addresses' entries are forgotten the same way (evictHosts).
func (e *Engine) evict(now time.Time) {
	e.evictHosts(now)
	keep := e.order[:0]
	for i, name := range e.order {
		d := e.dests[name]
		if d.active == 0 && len(d.pending) == 0 && d.recording == 0 && !d.paceHold.After(now) && !d.runKept.After(now) {
			delete(e.dests, name)
			if i < e.next {
				e.next--
			}
			continue
		}
		keep = append(keep, name)
	}
	clear(e.order[len(keep):])
	e.order = keep
	if e.next >= len(e.order) || e.next < 0 {
		e.next = 0
	}
}
