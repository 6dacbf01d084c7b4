package delivery

import (
	"sync"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// What the scheduler loop owns, and how others reach it.
//
// Run's goroutine is the only one that reads or writes the claimed set
// (the recipients held in jobs), the scan's position and the requests to
// rescan, and the only one that loads a destination's record
// (loadDests) or changes one at the operator's request (relearn). Nothing
// guards them: nobody else touches them. The scan's filter runs inside a
// queue read transaction on that same goroutine, so it reads the claimed
// set without any lock, and a writer's transaction can never wait on it.
//
// Workers and the recorder tell the loop what changed with a note put in
// its mailbox (a claim to release, a rescan to make), and never wait for
// it: the loop takes the notes before each scan and whenever it wakes, in
// the order they were put, so a released claim is gone before the rescan
// that asks for it runs. The operator's changes to what the engine learned
// (Retry, Requeue, Forget) are run by the loop itself (inLoop), so a
// record the loop reads can never be adopted after the operator changed
// it.

// note is what a worker or the recorder tells the loop.
type note struct {
	unclaim []queue.Key // recipients no longer held in a job
	rescan  bool        // the next scan starts from the first key
	// begun reports a Begin: failed (at failedAt) or not (storagePause).
	begun    bool
	failedAt time.Time
}

// mailbox is the loop's unbounded inbox: put never blocks, so a worker or
// the recorder never waits for the loop, which may itself be waiting for
// the recorder (settle of an attempt that never was). Its lock guards the
// list of notes only, for the length of an append or a swap; it is the
// mailbox's own, never held with any other.
type mailbox struct {
	mu    sync.Mutex
	notes []note
	wake  chan struct{} // capacity 1; nil in engines built without New (tests)
}

// put adds n, and wakes the loop if n asks for a scan: the rest waits
// for the loop's next wake, as it precedes every scan. It never blocks.
func (m *mailbox) put(n note) {
	m.mu.Lock()
	m.notes = append(m.notes, n)
	m.mu.Unlock()
	if !n.rescan {
		return
	}
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// take returns the notes put since the last take, oldest first.
func (m *mailbox) take() []note {
	m.mu.Lock()
	defer m.mu.Unlock()
	ns := m.notes
	m.notes = nil
	return ns
}

// tell puts n in the loop's mailbox. Workers and the recorder call it.
func (e *Engine) tell(n note) { e.notes.put(n) }

// unclaim releases the claim on rs (a worker: Begin made them Active, or
// they were dropped without a write).
func (e *Engine) unclaim(rs []queue.Recipient) {
	ks := make([]queue.Key, len(rs))
	for i, r := range rs {
		ks[i] = r.Key
	}
	e.tell(note{unclaim: ks})
}

// dropped releases the claim on rs, which were dropped without a write and
// so lie behind the scan position: the next scan starts from the first
// key.
func (e *Engine) dropped(rs []queue.Recipient) {
	ks := make([]queue.Key, len(rs))
	for i, r := range rs {
		ks[i] = r.Key
	}
	e.tell(note{unclaim: ks, rescan: true})
}

// requestRescan asks the loop, from another goroutine, to start its next
// scan from the first key.
func (e *Engine) requestRescan() { e.tell(note{rescan: true}) }

// readNotes applies the notes put since the last call and reports
// whether one asked for a scan. Run's goroutine only.
func (e *Engine) readNotes() bool {
	rescan := false
	for _, n := range e.notes.take() {
		for _, k := range n.unclaim {
			delete(e.claimed, k)
		}
		switch {
		case n.begun && n.failedAt.IsZero():
			e.pause.ok()
		case n.begun:
			e.pause.failed(n.failedAt)
		}
		rescan = rescan || n.rescan
	}
	if rescan {
		e.rescan = true
	}
	return rescan
}

// op is an operator's change run by the loop (inLoop).
type op struct {
	fn   func()
	done chan struct{}
}

// inLoop runs fn on the loop's goroutine and returns when it has run.
// Before Run starts it waits for it; once the loop has ended, nothing else
// loads a destination's record, and fn runs on the caller's goroutine.
func (e *Engine) inLoop(fn func()) {
	o := op{fn: fn, done: make(chan struct{})}
	select {
	case e.ops <- o:
		<-o.done
	case <-e.ended:
		fn()
	}
}

// runOp runs o on the loop's goroutine.
func (e *Engine) runOp(o op) {
	defer close(o.done)
	o.fn()
}
