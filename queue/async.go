package queue

import (
	"fmt"
	"sync"
	"time"
)

// Pending is an Apply handed to the writer by ApplyAsync whose result has
// not been collected yet.
type Pending struct {
	q     *Queue
	reply chan error // answered by the writer; nil if the call never reached it
	ids   []ID       // set by the writer before it answers
	err   error      // the result, once decided
	once  sync.Once
}

// ApplyAsync is Apply without the wait for the commit, so a caller can
// overlap the commit with other work (a delivery worker with its next
// attempt). It validates u as Apply does, hands u to the writer and returns
// once the writer has taken it; that may take as long as the commit the
// writer is busy with, but not the commit of u. Wait returns what Apply
// would have returned.
//
// The writer commits the calls it takes in order, one transaction after
// the other. So the commit of u is decided before that of any Enqueue,
// EnqueueBatch, Begin, Apply or ApplyAsync that reaches the writer after
// ApplyAsync returned, from this goroutine or another: once such a call
// has returned (for ApplyAsync, its Wait), Wait does not block. Decided
// is not necessarily durable: u may have failed in an earlier transaction
// than the later call (a storage error fails a whole batch), so only Wait
// tells. Close commits every update the writer has taken before it
// returns.
func (q *Queue) ApplyAsync(u Update) *Pending {
	p := &Pending{q: q}
	if err := validateUpdate(&u); err != nil {
		p.err = err
		p.once.Do(func() {})
		return p
	}
	n, size := updateWeight(&u)
	r := request{n: n, size: size, needs: startsNeed(u.Starts), upd: &u, reply: make(chan error, 1), fn: func(w *wtx) error {
		var err error
		p.ids, err = w.applyUpdate(&u)
		return err
	}}
	p.reply = r.reply
	if q.closed.Load() {
		r.reply <- ErrClosed
		return p
	}
	select {
	case q.reqs <- r:
	case <-q.done:
		r.reply <- ErrClosed
	}
	return p
}

// Wait waits for the commit of the update and returns the IDs of the DSNs it
// enqueued, or the error Apply would have returned. Later calls return the
// same result. Wait is safe for concurrent use.
func (p *Pending) Wait() ([]ID, error) {
	p.once.Do(func() {
		if err := p.q.await(p.reply); err != nil {
			p.ids, p.err = nil, fmt.Errorf("queue: apply: %w", err)
		}
	})
	return p.ids, p.err
}

// freshStarts maps each key of ss to the first Start naming it.
func freshStarts(ss []Start) map[Key]*Start {
	if len(ss) == 0 {
		return nil
	}
	m := make(map[Key]*Start)
	for i := range ss {
		for _, k := range ss[i].Keys {
			if _, ok := m[k]; !ok {
				m[k] = &ss[i]
			}
		}
	}
	return m
}

// beginFresh begins the keys of starts that are still Queued or Deferred
// (see Update.Starts); the others were held, deleted or settled meanwhile.
func (w *wtx) beginFresh(starts map[Key]*Start) error {
	for k, s := range starts {
		r, ok := w.getRcpt(k)
		if !ok || (r.Status != Queued && r.Status != Deferred) {
			continue
		}
		if err := w.begin(k, s); err != nil {
			return err
		}
	}
	return nil
}

// startsNeed is the highest message ID that Starts name: the commit of an
// update with Starts must hold the insert of that message (see commit).
func startsNeed(ss []Start) ID {
	var id ID
	for _, s := range ss {
		for _, k := range s.Keys {
			id = max(id, k.ID)
		}
	}
	return id
}

// updateWeight weighs u against the writer's batch limits.
func updateWeight(u *Update) (n, size int) {
	n = len(u.Results) + len(u.Destinations)
	for i := range u.DSNs {
		n, size = n+1, size+len(u.DSNs[i].Body)
	}
	return n, size
}

// applyUpdate writes u (see Apply) and returns the IDs of its DSNs. Nothing
// here refuses: results for missing or final recipients are ignored, so
// after validateUpdate only a storage error can fail.
func (w *wtx) applyUpdate(u *Update) ([]ID, error) {
	var ids []ID
	touched := map[ID]bool{}
	w.finishedAt = time.Time{} // the time a message finished by u is kept under
	for i := range u.Results {
		if u.Results[i].End.After(w.finishedAt) {
			w.finishedAt = u.Results[i].End
		}
	}
	// A start is applied with its key's first result, in one write of
	// the recipient (apply); the writer commits most fresh attempts'
	// outcomes this way, often in the transaction that inserts their
	// message. A start without a result begins its key after the results,
	// as Begin would.
	starts := freshStarts(u.Starts)
	for i := range u.Results {
		k := u.Results[i].Key
		s, ok := starts[k]
		if ok {
			delete(starts, k)
		}
		done, err := w.apply(&u.Results[i], s)
		if err != nil {
			return nil, err
		}
		touched[k.ID] = touched[k.ID] || done
	}
	if err := w.beginFresh(starts); err != nil {
		return nil, err
	}
	for i := range u.DSNs {
		id, err := w.insertMessage(&u.DSNs[i], 0)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	for i := range u.Destinations {
		if err := w.putDestination(&u.Destinations[i]); err != nil {
			return nil, err
		}
	}
	for id, done := range touched {
		if done {
			if err := w.finishIfDone(id); err != nil {
				return nil, err
			}
		}
	}
	return ids, nil
}
