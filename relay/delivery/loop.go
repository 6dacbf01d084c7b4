package delivery

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// What the scheduler loop owns, and how others reach it.
//
// Run's goroutine is the only one that reads or writes the scheduling
// state and what was learned: the destinations (dest: pending jobs, idle
// connections, running workers, ramp, cluster slots asked for, and the
// learned record with its pace, greylisting window and dead hosts), the
// MX hosts' records (host.go), the claimed set (the recipients held in
// jobs), the scan's position and the requests to rescan, the
// suspensions and the storage pause. Nothing guards that state: nobody
// else touches it. The scan's filter runs inside a queue read
// transaction on that same goroutine, so it reads the claimed set
// without any lock, and a writer's transaction can never wait on it.
//
// The others reach the loop in four ways, as mox's queue workers do:
//
//   - A worker asks (askLoop) whether there is a job for its connection
//     and for the job itself, and waits for the answer: the loop alone
//     decides which job goes to which open connection (reuse, from the
//     policy the job carries), and keeps a connection that waits for a
//     next message with its destination's idle ones.
//   - A worker has the loop run a step on what was learned and waits for
//     it (call): settling its attempt's outcomes (settle: the learning,
//     the results, DSNs and events, and the update handed to the queue's
//     writer, in the order learned), taking a paced start of its
//     destination or MX host (takeStart, hostStart; the worker sleeps
//     off the loop, on a channel the loop closes when the start comes
//     sooner), reading the dead hosts. What may wait on the network or
//     a disk stays on the worker's goroutine: the shared store's views
//     (loadShared, hostViews), which the loop then adopts, and the
//     suppression list.
//   - Workers and the recorder leave notes in the loop's mailbox (a claim
//     to release, a rescan, how a Begin went, a worker that ended, what
//     a connection taught: atLoop) and never wait for it: the loop takes
//     them before each scan, each dispatch, each answer and each call,
//     in the order they were put, so a released claim is gone before
//     the rescan that asks for it runs, and a worker's answer follows
//     what it told the loop before.
//   - The operator's changes (Retry, Requeue, Forget, Suspend, Resume and
//     the cluster's suspensions) run on the loop's goroutine (inLoop), so
//     a record the loop reads can never be adopted after the operator
//     changed it.
//
// Once the loop has ended (Run's context is done), the workers still
// finishing and the operator's changes take turns at that state instead
// (inLoop).

// note is what a worker or the recorder tells the loop.
type note struct {
	unclaim []queue.Key // recipients no longer held in a job
	rescan  bool        // the next scan starts from the first key
	// begun reports a Begin: failed (at failedAt) or not (storagePause).
	begun    bool
	failedAt time.Time
	ended    *dest // a worker of this destination ended
	// apply changes the loop's state (a worker or the recorder reports
	// what it learned); it runs on the loop's goroutine, with what it
	// captured when the note was put. wake: then schedule again.
	apply func()
	wake  bool
}

// wakes reports whether n makes the loop schedule again.
func (n note) wakes() bool { return n.rescan || n.ended != nil || n.wake }

// mailbox is the loop's unbounded inbox: put never blocks, so a worker or
// the recorder never waits for the loop, which may itself be waiting for
// the recorder (settle of an attempt that never was). A channel would
// need a capacity, and a full one would make the recorder wait for the
// loop while the loop waits for it; so the notes are a list, and its
// lock guards that list only, for the length of an append or a swap: it
// is the mailbox's own, never held with any other and never while
// anything else is waited for. wake is the channel the loop sleeps on.
type mailbox struct {
	mu    sync.Mutex
	notes []note
	wake  chan struct{} // capacity 1; nil in engines built without New (tests)
}

// put adds n, and wakes the loop if n asks it to schedule again: the rest
// waits for the loop's next wake (it reads its notes before every scan,
// dispatch and answer). It never blocks.
func (m *mailbox) put(n note) {
	m.mu.Lock()
	m.notes = append(m.notes, n)
	m.mu.Unlock()
	if !n.wakes() {
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

// atLoop has the loop run fn with its next notes, without waiting for
// it; wake makes it schedule again afterwards. fn must capture values,
// not state another goroutine guards.
func (e *Engine) atLoop(fn func(), wake bool) { e.tell(note{apply: fn, wake: wake}) }

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

// requestRescan asks the loop to start its next scan from the first key
// (from any goroutine: the loop reads it with its notes).
func (e *Engine) requestRescan() { e.tell(note{rescan: true}) }

// readNotes applies the notes put since the last call; one that asks
// the loop to schedule again sets e.rewake. Run's goroutine only.
func (e *Engine) readNotes() {
	rescan := false
	for _, n := range e.notes.take() {
		if n.ended != nil {
			e.workers--
			n.ended.active--
		}
		if n.apply != nil {
			n.apply()
		}
		e.rewake = e.rewake || n.wakes()
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
}

// op is an operator's change run by the loop (inLoop).
type op struct {
	fn   func()
	done chan struct{}
}

// inLoop runs fn on the loop's goroutine and returns when it has run.
// Before Run starts it waits for it; once the loop has ended, fn runs on
// the caller's goroutine, taking turns with the others that come after
// the loop. Never call it from the loop's goroutine.
func (e *Engine) inLoop(fn func()) {
	o := op{fn: fn, done: make(chan struct{})}
	select {
	case e.ops <- o:
		<-o.done
	case <-e.ended:
		// The loop's state is no one's now; those who come after it (the
		// workers still finishing, the operator) take turns: afterLoop
		// guards nothing while the loop runs.
		e.afterLoop.Lock()
		defer e.afterLoop.Unlock()
		fn()
	}
}

// call is inLoop for a worker: it has the loop run fn on what was
// learned (see the top of this file) and waits for it.
func (e *Engine) call(fn func()) { e.inLoop(fn) }

// runOp runs o on the loop's goroutine, after the notes put before it
// (a worker's own among them: a dead host it found before it settles).
func (e *Engine) runOp(o op) {
	defer close(o.done)
	e.readNotes()
	o.fn()
}

// A worker asks the loop for its next job (askLoop) and waits for the
// answer: the loop alone decides which job goes to which connection, and
// keeps the idle connections of each destination (dest.idle) until it has
// a job for one or wants its slot for another domain.

// askKind says what a worker asks.
type askKind int

const (
	askAwait    askKind = iota // is there a job for me (answerAwait)
	askTake                    // give me the next job (answerTake)
	askWithdraw                // I stop waiting as an idle connection
)

// ask is a worker's question to the loop. reply is the worker's own
// channel, with room for every answer the loop may have outstanding on
// it (two: parked, then woken), so the loop never blocks on it.
type ask struct {
	kind   askKind
	d      *dest
	s      *session // askTake: the open connection, nil if none
	open   bool     // askAwait: the connection may wait for another job
	served int      // transactions the worker has served
	reply  chan answer
}

// answer is the loop's answer to an ask.
type answer struct {
	ok      bool // askAwait: there is a job; askWithdraw: always false
	parked  bool // askAwait: wait on reply for the next answer
	recheck bool // woken while parked: ask again
	job     *job // askTake: the job, nil if none
	ride    ride // askTake: whether job may go over the open connection
}

// ride is the loop's decision whether a job's message may go over the
// worker's open connection (reuse).
type ride struct {
	ok bool   // it may
	t  target // the target the message has on that connection (session.rides)
}

// askLoop sends a to the loop and returns its first answer; false when
// the loop has ended or ctx did.
func (e *Engine) askLoop(ctx context.Context, a ask) (answer, bool) {
	select {
	case e.asks <- a:
	case <-e.ended:
		return answer{}, false
	}
	select {
	case ans := <-a.reply:
		return ans, true
	case <-e.ended:
		return answer{}, false
	}
}

// reply sends ans on c without blocking (c has room: see ask).
func reply(c chan answer, ans answer) {
	select {
	case c <- ans:
	default:
	}
}

// answerAsk answers a on the loop's goroutine, once it has read the
// notes put before it (the worker's own among them: what its last
// outcome taught, such as a throttle that pauses its destination).
func (e *Engine) answerAsk(a ask) {
	e.readNotes()
	switch a.kind {
	case askAwait:
		e.answerAwait(a)
	case askTake:
		j := e.answerTake(a)
		reply(a.reply, answer{job: j, ride: e.reuse(a.s, j)})
	case askWithdraw:
		if i := slices.Index(a.d.idle, a.reply); i >= 0 {
			a.d.idle = slices.Delete(a.d.idle, i, i+1)
			reply(a.reply, answer{})
		} // else woken already: that answer is on its way
	}
}

// answerAwait tells a's worker whether its destination has a job for it,
// or parks it with the destination's idle connections.
func (e *Engine) answerAwait(a ask) {
	d := a.d
	switch {
	case e.paused(d, e.now()) || (a.served > 0 && e.waiting):
		reply(a.reply, answer{})
	case len(d.pending) > 0:
		reply(a.reply, answer{ok: true})
	case !a.open:
		reply(a.reply, answer{})
	default:
		d.idle = append(d.idle, a.reply)
		reply(a.reply, answer{parked: true})
	}
}

// answerTake takes d's next job, preferring one the open connection can
// carry (its recipients are not bound to another MX by greylisting).
func (e *Engine) answerTake(a ask) *job {
	d := a.d
	if len(d.pending) == 0 || e.paused(d, e.now()) {
		return nil
	}
	if a.served > 0 && e.waiting {
		return nil // fairness: give the connection slot to a waiting domain
	}
	i := 0
	if s := a.s; s != nil {
		if k := slices.IndexFunc(d.pending, func(j *job) bool { return s.carries(j) }); k >= 0 {
			i = k
		}
	}
	j := d.pending[i]
	d.pending = slices.Delete(d.pending, i, i+1)
	if !d.passedAt.IsZero() && len(d.pending) <= e.pendingCap()/2 {
		// Room for due work a scan left behind: go back for it.
		e.rewindTo(d.passedAt)
		d.passedAt = time.Time{}
		e.Kick()
	}
	return j
}

// reuse decides, with the message's policy in hand, whether j may go over
// the open connection s: s is to the MX address j's recipients are bound
// to (carries), has room for another transaction, and gives j's message
// every TLS guarantee its own policy demands (session.rides). A
// connection opened in plaintext for a "TLS-Required: No" message thus
// never carries one held to MTA-STS, DANE or REQUIRETLS. The policy is
// the one j carries (msgPolicy), so the loop reads no storage here; a job
// whose message's flags could not be read when it was built opens a
// connection of its own, under its own policy. The worker is waiting for
// this answer, so reading s here is safe.
func (e *Engine) reuse(s *session, j *job) ride {
	if s == nil || j == nil || !j.pol.known {
		return ride{}
	}
	t, ok := s.rides(j.pol.message())
	ok = ok && s.carries(j) && s.count < e.cfg.Delivery.MaxMessagesPerConnection
	return ride{ok: ok, t: t}
}

// msgPolicy is what a message's own TLS policy asks of any connection
// that carries it: REQUIRETLS (RFC 8689 §4.2.1) and "TLS-Required: No"
// (RFC 8689 §5). known is false when the flags could not be read with
// the job (queue.Recipient.MessageRead).
type msgPolicy struct {
	requireTLS, tlsOptional, known bool
}

// policyOf is msg's policy.
func policyOf(msg queue.Message) msgPolicy {
	return msgPolicy{requireTLS: msg.RequireTLS, tlsOptional: msg.TLSOptional, known: true}
}

// message is p as the envelope shape and session.rides read it.
func (p msgPolicy) message() queue.Message {
	return queue.Message{RequireTLS: p.requireTLS, TLSOptional: p.tlsOptional}
}
