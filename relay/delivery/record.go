package delivery

import (
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
)

// One route for every outcome.
//
// settle hands each attempt's outcome to the queue with queue.ApplyAsync
// and to the recorder, and goes on: no worker waits for a commit, and
// none holds a lock while one is made or retried. The queue's writer
// commits the updates in the order it takes them, so ordering is its job:
// outcomes are settled and handed over on the loop's goroutine, one at a
// time, so an outcome that carries what was learned about a destination
// never reaches the writer before an older record of it.
//
// The recorder is one goroutine (collect) that waits for those commits in
// the order they were handed over (each is usually decided already when
// its turn comes) and then does what must follow one: it releases the
// claim on a fresh attempt's recipients (fresh.go), shares a stored
// destination record with the other nodes (Shared.Publish), or, when the
// commit failed, logs it and holds the outcome (held.go). Held outcomes are
// stored again by the same goroutine on a timer (heldBackoff), holding no
// lock while it stores, and meanwhile later outcomes are collected as
// usual: the held recipients are Active in the queue (or Queued and
// claimed, for a fresh attempt), where nothing else touches them.
//
// Outcomes that no attempt had and no destination learns from (the
// operator's bounce, the postponement of a paused destination's
// recipients) are decided, described and reported by the same functions
// (settleOne, conclude, report) in settleNow, which stores them with a
// synchronous Apply instead: its caller needs the answer, and nothing is
// held for it.
//
// Run stops the recorder only after every worker has ended, and the
// recorder ends only once every outcome handed to it has its commit
// decided: so when Run returns, every outcome is stored, or logged as not
// stored and recovered at the next start (queue.Recover), as after a
// crash.

// heldBackoff is how long the recorder waits before storing held outcomes
// again after its tries-th failed try: 50 ms, 100 ms, 200 ms… up to
// heldRetry. A failed write usually means a full or failing disk; the
// first tries catch a passing fault quickly, the later ones do not spin.
func heldBackoff(tries int) time.Duration {
	return min(time.Duration(50<<min(tries, 10))*time.Millisecond, heldRetry)
}

// recorder is the collecting side of the outcome route (see above).
type recorder struct {
	// store stores held outcomes again (the queue's Apply).
	store func(queue.Update) error

	// mu guards handed, the recorder's inbox: settle appends (on the
	// loop's goroutine, or a worker's once the loop has ended), the
	// recorder swaps it out (take). Held for that only, with no other.
	// Not a channel: a full one would hold up the loop while the
	// recorder waits for a commit or the shared store (Publish).
	mu     sync.Mutex
	handed []*pendingOutcome // handed to the queue, not collected yet, oldest first

	wake  chan struct{} // something was handed over; capacity 1
	stop  chan struct{} // closed by finish
	ended chan struct{} // closed when collect returns

	held held
}

// newRecorder returns a recorder that stores held outcomes with store.
func newRecorder(store func(queue.Update) error) *recorder {
	return &recorder{store: store, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), ended: make(chan struct{})}
}

// hand gives po, already handed to the queue, to the collector. It never
// blocks.
func (r *recorder) hand(po *pendingOutcome) {
	r.mu.Lock()
	r.handed = append(r.handed, po)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// take returns what was handed over since the last take.
func (r *recorder) take() []*pendingOutcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	pos := r.handed
	r.handed = nil
	return pos
}

// record starts the recorder's goroutine and returns what stops it: a
// call that returns once every outcome handed over before it has its
// commit decided. Call it only when nothing can hand over any more.
func (e *Engine) record() (stop func()) {
	go e.collect()
	return func() {
		close(e.out.stop)
		<-e.out.ended
	}
}

// collect is the recorder's goroutine (see the top of this file).
func (e *Engine) collect() {
	defer close(e.out.ended)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	armed, tries := false, 0
	for {
		for _, po := range e.out.take() {
			e.collected(po)
		}
		if !armed && e.out.held.len() > 0 {
			timer.Reset(heldBackoff(tries))
			armed = true
		}
		select {
		case <-e.out.wake:
		case <-timer.C:
			armed = false
			if e.storeHeld() {
				tries++
			} else {
				tries = 0
			}
		case <-e.out.stop:
			for _, po := range e.out.take() { // handed over before stop
				e.collected(po)
			}
			if n := e.out.held.len(); n > 0 {
				e.log.Warn("delivery: held outcomes not stored at shutdown; their recipients are recovered at the next start",
					zap.Int("outcomes", n))
			}
			return
		}
	}
}

// collected waits for the commit of po and does what follows it.
func (e *Engine) collected(po *pendingOutcome) {
	defer close(po.decided)
	err := po.wait()
	if po.own {
		defer e.recorded(po.d)
	}
	switch {
	case err == nil:
		if e.opt.Shared != nil {
			for _, rec := range po.u.Destinations { // d's, then MX hosts' (host.go)
				e.opt.Shared.Publish(rec)
			}
		}
		e.stored(po)
	case errors.Is(err, queue.ErrInvalid) || errors.Is(err, queue.ErrClosed):
		e.log.Error("delivery: recording outcome failed; the attempt is recovered at the next start",
			zap.String("queue_id", po.a.msg.ID.String()), zap.String("domain", po.d.name), zap.Error(err))
		e.stored(po) // never will be: a fresh attempt's recipients go back to the scan
	default:
		e.hold(po, err)
	}
}

// recorded notes that the commit of an outcome carrying d's record is
// decided: d may be forgotten again (evict).
func (e *Engine) recorded(d *dest) {
	e.atLoop(func() { d.recording-- }, false)
}

// hold keeps po, whose commit failed, to be stored again (held.go). The
// destination record it carried is not kept (a later outcome may carry a
// newer one); instead the next outcome of its destination carries the
// record then current: the loop, which owns the records, is told so.
func (e *Engine) hold(po *pendingOutcome, err error) {
	d, own, recs := po.d, po.own, po.u.Destinations
	e.atLoop(func() {
		if own {
			d.stored = queue.Destination{}
		}
		e.unstoreHosts(recs)
	}, false)
	e.out.held.add(po)
	e.log.Error("delivery: recording outcome failed; held, and stored again once the queue takes it",
		zap.String("queue_id", po.a.msg.ID.String()), zap.String("domain", po.d.name), zap.Error(err))
}

// storeHeld stores the outcomes held since their commit failed. It
// reports whether some are still held.
func (e *Engine) storeHeld() bool {
	stored, left, err := e.out.held.flush(e.out.store)
	if len(stored) > 0 {
		e.log.Info("delivery: held outcomes stored", zap.Int("outcomes", len(stored)))
	}
	for _, po := range stored {
		e.stored(po)
	}
	if left > 0 {
		e.log.Warn("delivery: held outcomes still cannot be stored", zap.Int("outcomes", left), zap.Error(err))
	}
	return left > 0
}
