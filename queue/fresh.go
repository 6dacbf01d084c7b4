package queue

// Fresh attempts: the path from a message's 250 to the next hop without a
// database commit in between.
//
// A message is durable once its journal record is synced (journaler.go);
// the writer inserts it into the database in a later commit, and a
// delivery attempt found by the scheduler then records itself with Begin,
// another commit, before anything is sent. Under load those two commits,
// each waiting for the writer's turn and two fdatasyncs, were most of the
// time between the 250 and the next hop. So the queue hands each freshly
// journaled message, with the copy of its body the journal keeps until
// the insert, to whoever asked (the delivery engine) at once. The engine
// sends it right away and stores the attempt's start with its outcome in
// one transaction (Update.Starts). The crash guarantee is Begin's: until
// that commit the recipient is Queued in the database (or in the journal,
// which Open replays), so a crash during the attempt makes it due again.
// A message may then be delivered twice, never lost.
//
// The hand-over never waits: when the receiver is behind, a fresh
// message is simply not offered and takes the ordinary path (the
// scheduler finds it due once it is inserted). Whoever receives a Fresh
// must make sure that the ordinary path does not attempt it at the same
// time. The engine claims its recipients before its scan can see them,
// which holds only if the offer reaches it before the insert commits. The
// insert request goes to the writer before the offer (so that the
// attempt's outcome commits after the insert), and the writer may commit
// it first when the journaler is descheduled in between; a scan may then
// take the message the ordinary way, Begin it and release its claim before
// the offer is read. So each offer carries its journal number (Seq), and
// Visible tells which numbers a scan may have seen: an offer at or below
// what was visible when a scan ended is left to the ordinary path.

// freshBuffer is how many fresh messages may wait for the receiver.
const freshBuffer = 1024

// Fresh is a message just made durable by the journal, offered for an
// immediate attempt (see Queue.Fresh).
type Fresh struct {
	Message Message // the envelope, without Recipients
	// Recipients are as inserted: Queued, due at the arrival, no history.
	Recipients []Recipient
	// Body is the journal's copy of the message, shared and read-only:
	// never modify it.
	Body []byte
	// Seq is the journal number of the record holding the message, to
	// compare with Visible.
	Seq uint64
}

// Visible returns the journal number of the newest journaled batch that a
// committed, or committing, transaction inserts: a read transaction that
// began before the call sees no message of a later batch, so a fresh offer
// with a greater Seq cannot have been found by a scan that ended before
// it.
func (q *Queue) Visible() uint64 { return q.visible.Load() }

// Fresh returns the channel on which the queue offers messages right after
// their Enqueue returned, and starts offering them: until the first call
// nothing is offered, so a queue nobody delivers from holds no copies.
// Only messages whose body is in memory (not spooled) and that are due at
// their arrival are offered, and only while the receiver keeps up.
func (q *Queue) Fresh() <-chan Fresh {
	q.freshOn.Store(true)
	return q.fresh
}

// offerFresh offers journaled messages (ms with their ids, journal record
// seq) to the receiver, dropping what does not fit.
func (q *Queue) offerFresh(ms []NewMessage, ids []ID, seq uint64) {
	if !q.freshOn.Load() {
		return
	}
	for i := range ms {
		m := &ms[i]
		if m.File != nil || (!m.NextAttempt.IsZero() && m.NextAttempt.After(m.Arrival)) {
			continue
		}
		f := Fresh{Message: m.envelope(ids[i], int64(len(m.Body))), Body: m.Body, Seq: seq}
		f.Recipients = make([]Recipient, len(m.To))
		for j, to := range m.To {
			f.Recipients[j] = Recipient{Key: Key{ids[i], j}, Addr: to.Addr, Domain: to.Domain, Notify: to.Notify,
				ORCPT: to.ORCPT, Status: Queued, NextAttempt: m.Arrival}
		}
		select {
		case q.fresh <- f:
		default:
			return // behind: the rest takes the ordinary path too
		}
	}
}
