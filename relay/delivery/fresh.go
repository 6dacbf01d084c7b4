package delivery

import (
	"github.com/greyrelay/greyrelay/queue"
)

// Fresh attempts (queue.Fresh): a message the intake journal has just made
// durable is offered to the scheduler with its body, before the queue's
// writer has inserted it into the database. The scheduler claims its
// recipients into jobs at once, so neither the insert commit nor a Begin
// commit lies between its 250 and the next hop:
//
//   - no Begin: the attempt's start (route, time) travels with the
//     attempt and is stored with its outcome in one queue.Apply
//     (Update.Starts). Until that commit the recipients are Queued in the
//     queue (or only in its journal); after a crash they are due again, as
//     a Begun attempt would be after queue.Recover: perhaps a second
//     delivery, never none.
//   - the claim keeps the ordinary path away: the scan passes over
//     claimed recipients, and a fresh job's recipients stay claimed until
//     the commit of their outcome (a Begun job's are released by Begin,
//     since Active recipients are invisible to the scan). After that commit
//     the queue holds their result, so a later scan cannot find them due
//     by mistake.
//   - an offer may come late: the writer can commit the insert before
//     the journaler hands the offer over, and a scan may then have taken
//     the message the ordinary way and Begun it, which releases its claim.
//     So an offer whose journal number a scan may have seen
//     (queue.Visible when the scan ended) is left to the ordinary path.
//   - a fresh message the scheduler does not take at once (its
//     destination is paused or suspended, or has a full job list, or an attempt would
//     need a write without a transaction: postponement for dead hosts) is
//     dropped and takes the ordinary path once inserted.

// freshJob is what a job started from a fresh message carries instead of
// reading the queue: the envelope and the journal's copy of the body.
type freshJob struct {
	msg  queue.Message
	body []byte
}

// takeFresh claims f's recipients into jobs of their destinations, as a
// scan would, and reports whether it claimed any. Recipients of a
// destination that cannot take them now are left to the ordinary path.
func (e *Engine) takeFresh(f queue.Fresh) bool {
	if f.Seq <= e.scanned {
		return false // a scan may have found it inserted: it is the scan's
	}
	if err := e.loadDests(f.Recipients); err != nil {
		return false // the scan will find them
	}
	fj := &freshJob{msg: f.Message, body: f.Body}
	now := e.now()
	max := e.cfg.Delivery.MaxRecipientsPerTransaction
	jobs := map[*dest]*job{}
	took := false
	for _, r := range f.Recipients {
		d := e.dests[domainKey(r.Domain)]
		if d == nil || e.claimed[r.Key] || e.paused(d, now) {
			continue
		}
		j := jobs[d]
		if j == nil || len(j.rcpts) >= max {
			if len(d.pending) >= e.pendingCap() {
				continue
			}
			j = &job{id: f.Message.ID, domain: d.name, fresh: fj, pol: policyOf(f.Message)}
			d.pending = append(d.pending, j)
			jobs[d] = j
		}
		j.rcpts = append(j.rcpts, r)
		e.claimed[r.Key] = true
		took = true
	}
	return took
}

// takeWaitingFresh claims the fresh messages already offered, before a
// scan: the scan could otherwise find one of them due once inserted and
// send it the ordinary way.
func (e *Engine) takeWaitingFresh() {
	for {
		select {
		case f := <-e.fresh:
			e.takeFresh(f)
		default:
			return
		}
	}
}

// freshStart is the start to store with the outcomes outs of fresh
// attempt a (Update.Starts): a's start, for their recipients only (a
// recipient left for the next host is stored with a later outcome).
func freshStart(a *attempt, outs []outcome) []queue.Start {
	if a.begun == nil {
		return nil
	}
	s := *a.begun
	s.Keys = make([]queue.Key, len(outs))
	for i, o := range outs {
		s.Keys[i] = o.r.Key
	}
	return []queue.Start{s}
}

// stored tells the loop to release the claim on a fresh outcome's
// recipients once the queue holds it (or will never take it: the queue
// is closing).
func (e *Engine) stored(po *pendingOutcome) {
	for _, s := range po.u.Starts {
		e.tell(note{unclaim: s.Keys})
	}
}
