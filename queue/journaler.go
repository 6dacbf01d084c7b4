package queue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/greyrelay/greyrelay/queue/journal"
)

// This file connects the intake journal (queue/journal, whose package
// comment says why there is one) to the queue: the journaler goroutine
// that group-commits Enqueue calls into journal records (journalrec.go),
// the writer's side that inserts them into the database, and the replay at
// Open.
//
// Enqueue returns after the fdatasync of the record holding its messages.
// The writer inserts them into the database afterwards, in journal order,
// in its next transaction (whatever else that transaction carries), and
// stores in the same transaction the number of the last journal record it
// holds ("applied"). A message is durable once its record is synced, in
// the database once applied; a crash in between loses nothing, because
// Open replays every record numbered above applied before anything reads
// the queue (and before the spool sweep, which would remove the files they
// name).
//
// When the next batch does not fit in the file, the journaler waits until
// the database holds every record in it and starts again at the front. A
// batch too large for the file, and every Enqueue after a journal write
// failed, go to the database directly, as before the journal. The record
// whose write failed is marked applied without its messages (their clients
// were refused, and it may have reached the disk all the same), so that no
// later Open replays it.
//
// Reads: between its Enqueue and the writer's commit (about one commit) a
// message is durable but not yet in the database. The reads a caller may
// make right after Enqueue (Message, Show, Body, OpenBody, Due, List,
// Stats, Select and the operator actions) first wait for that commit
// (settle; for one message only if its ID may still be on its way, so the
// delivery workers never wait). The scheduler's reads (DueCursor, NextDue)
// do not: the commit that inserts a message wakes it. When that commit
// fails (a full disk), the pure reads answer from the database all the
// same and say what it lacks (unsettled, UnsettledError): the messages
// are safe in the journal, and the operator needs to look at the queue
// most when the disk is full. So do the operator's actions (they act on
// what the database holds), and the other writes commit without the
// waiting messages (commit): a full disk must not stop the deliveries
// that free it. The waiting messages go in once there is room.

// DefaultJournalSize is the size the journal file grows to by default.
const DefaultJournalSize = journal.DefaultSize

// intakeJournal is the journal file and the journaler's state. After Open
// only the journaler goroutine uses it.
type intakeJournal struct {
	*journal.File
	seq uint64 // number of the last record written
	bad error  // a write or sync failed: the journal is not used any more
}

// jrequest is one Enqueue call waiting for the journaler.
type jrequest struct {
	ms    []NewMessage
	size  int
	reply chan jresult // buffered 1: the journaler never blocks on it
}

type jresult struct {
	ids []ID
	err error
}

// insertBatch is journaled messages on their way into the database. The
// writer keeps it until a commit that inserts it succeeds.
type insertBatch struct {
	seq uint64       // the journal record holding them
	ms  []NewMessage // Body points into the record (the caller's buffer is not ours)
	ids []ID
}

var (
	bJournal   = []byte(BucketJournal)
	keyApplied = []byte("applied") // number of the last journal record in the database
	keySalt    = []byte("salt")    // the salt of this database's journal
)

// startJournal opens the journal, replays what the database lacks and
// sets the ID counter above every ID in use. Called by Open with the
// writer not yet running.
func (q *Queue) startJournal() error {
	var seq uint64
	err := q.view(func(tx *bolt.Tx) error {
		q.lastID.Store(tx.Bucket(bMsgs).Sequence())
		seq = appliedSeq(tx)
		return nil
	})
	if err != nil || q.opt.JournalSize < 0 {
		return err
	}
	path := q.path + ".journal"
	f, created, err := journal.Open(path, q.opt.JournalSize)
	if err != nil {
		return fmt.Errorf("queue: journal: %w", err)
	}
	if err := q.claimJournal(f, created); err != nil {
		f.Close()
		return fmt.Errorf("queue: journal: %w", err)
	}
	if seq, err = q.replay(f, seq); err != nil {
		f.Close()
		return fmt.Errorf("queue: journal: %w", err)
	}
	q.jrnl = &intakeJournal{File: f, seq: seq}
	q.acked.Store(seq)
	q.applied.Store(seq)
	return nil
}

// claimJournal makes sure the journal belongs to this database: its salt
// is stored in the database when the journal is created. A journal whose
// salt the database does not hold (the database was deleted or replaced,
// or the journal copied from elsewhere) is started again rather than
// replayed: its records would bring back messages this database never had
// or has long delivered.
func (q *Queue) claimJournal(j *journal.File, created bool) error {
	var stored []byte
	if err := q.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bJournal); b != nil {
			stored = bytes.Clone(b.Get(keySalt))
		}
		return nil
	}); err != nil {
		return err
	}
	salt := j.Salt()
	if !created && bytes.Equal(stored, salt[:]) {
		return nil
	}
	if !created {
		if err := j.Reset(); err != nil {
			return err
		}
		salt = j.Salt()
	}
	if err := syncDir(filepath.Dir(j.Name())); err != nil {
		return err
	}
	return q.update(func(w *wtx) error { return w.b(bJournal).Put(keySalt, salt[:]) })
}

func appliedSeq(tx *bolt.Tx) uint64 {
	if b := tx.Bucket(bJournal); b != nil {
		if v := b.Get(keyApplied); len(v) == 8 {
			return binary.BigEndian.Uint64(v)
		}
	}
	return 0
}

// replay inserts the records numbered above applied, in order, and
// returns the number of the last record in the file (or applied).
func (q *Queue) replay(j *journal.File, applied uint64) (uint64, error) {
	return j.Scan(applied, func(seq uint64, payload []byte) error {
		ms, ids, err := decodeRecord(payload)
		if err != nil {
			// A record whose CRC matched but which does not decode was
			// written by something else: refuse to guess.
			return fmt.Errorf("record %d: %w", seq, err)
		}
		for _, id := range ids {
			if uint64(id) > q.lastID.Load() {
				q.lastID.Store(uint64(id))
			}
		}
		b := &insertBatch{seq: seq, ms: ms, ids: ids}
		if err := q.update(func(w *wtx) error { return w.insertJournaled([]*insertBatch{b}) }); err != nil {
			return err
		}
		q.replayed += len(ms)
		return nil
	})
}

// insertJournaled inserts journaled batches, oldest first, and records the
// last one's number as applied, in the same transaction.
func (w *wtx) insertJournaled(bs []*insertBatch) error {
	if len(bs) == 0 {
		return nil
	}
	for _, b := range bs {
		for i := range b.ms {
			if w.finish[b.ids[i]] {
				if err := w.hold(&b.ms[i], b.ids[i]); err != nil {
					return err
				}
			} else if _, err := w.insertMessage(&b.ms[i], b.ids[i]); err != nil {
				return err
			}
			if err := w.accepted(b.ids[i], &b.ms[i]); err != nil {
				return err
			}
		}
	}
	return w.b(bJournal).Put(keyApplied, binary.BigEndian.AppendUint64(nil, bs[len(bs)-1].seq))
}

// enqueueJournal hands ms to the journaler and waits for its answer.
func (q *Queue) enqueueJournal(ms []NewMessage, size int) ([]ID, error) {
	r := jrequest{ms: ms, size: size, reply: make(chan jresult, 1)}
	select {
	case q.jreqs <- r:
	case <-q.jdone:
		return nil, ErrClosed
	}
	select {
	case res := <-r.reply:
		return res.ids, res.err
	case <-q.jstopped:
		select {
		case res := <-r.reply:
			return res.ids, res.err
		default:
			return nil, ErrClosed
		}
	}
}

// journaler is the journal's group-commit loop: take one Enqueue, add
// whatever else is waiting, write one record, sync once, answer everyone.
func (q *Queue) journaler() {
	defer q.jwg.Done()
	defer close(q.jstopped)
	for {
		select {
		case r := <-q.jreqs:
			q.journalBatch(q.jgather(r))
		case <-q.jdone:
			for {
				select {
				case r := <-q.jreqs:
					q.journalBatch(q.jgather(r))
				default:
					return
				}
			}
		}
	}
}

func (q *Queue) jgather(first jrequest) []jrequest {
	batch := []jrequest{first}
	n, size := len(first.ms), first.size
	for n < maxBatchMsgs && int64(size) < q.jrnl.Max()/4 {
		select {
		case r := <-q.jreqs:
			batch = append(batch, r)
			n, size = n+len(r.ms), size+r.size
		default:
			return batch
		}
	}
	return batch
}

// journalBatch writes one record for the batch and hands its messages to
// the writer before answering, so that a call made after Enqueue returned
// commits after the insert (ApplyAsync's ordering promise holds).
func (q *Queue) journalBatch(batch []jrequest) {
	j := q.jrnl
	var ms []NewMessage
	for _, r := range batch {
		ms = append(ms, r.ms...)
	}
	ids := make([]ID, len(ms))
	for i := range ids {
		ids[i] = q.newID()
	}
	if j.bad != nil {
		q.answer(batch, ids, q.insertDirectKeeping(ms, ids))
		return
	}
	rec, copies := encodeRecord(j.Salt(), j.seq+1, ms, ids)
	if j.TooLarge(len(rec)) {
		q.answer(batch, ids, q.insertDirectKeeping(ms, ids))
		return
	}
	if q.inflight.Load() > maxInflightRcpts {
		// Intake is far ahead of the database: wait for it rather than
		// hold ever more messages in memory.
		if err := q.settle(); err != nil {
			q.answer(batch, nil, err)
			return
		}
	}
	if !j.Fits(len(rec)) {
		// Start again at the front once the database holds every record
		// behind us; a failure there is the database's, and fails this
		// batch only.
		if err := q.settle(); err != nil {
			q.answer(batch, nil, err)
			return
		}
		j.Rewind()
	}
	if err := q.keepReserve(q.journalGrowth(len(rec)), ms); err != nil {
		q.answer(batch, nil, err)
		return
	}
	if err := q.appendRecord(rec); err != nil {
		if j.bad != nil {
			q.disown(ids)
		}
		q.answer(batch, nil, fmt.Errorf("journal: %w", err))
		return
	}
	j.seq++
	q.inflight.Add(int64(rcptsOf([]*insertBatch{{ms: copies}})))
	q.owed.Add(insertCost([]*insertBatch{{ms: copies}}))
	q.acked.Store(j.seq)
	q.reqs <- request{ins: &insertBatch{seq: j.seq, ms: copies, ids: ids}}
	q.offerFresh(copies, ids, j.seq) // after the insert request: an outcome commits after it
	q.answer(batch, ids, nil)
}

// disown makes sure the record whose write just failed (numbered j.seq+1,
// for the messages ids) is never replayed: a failed write or fdatasync
// says nothing of what reached the disk, and its clients are told the
// messages were not accepted, so a client that retries would otherwise
// get them delivered twice after the next Open. The writer stores the
// record's number as applied, with no message, in its next commit; settle
// waits for that commit like any other.
func (q *Queue) disown(ids []ID) {
	j := q.jrnl
	j.seq++
	q.acked.Store(j.seq)
	q.reqs <- request{ins: &insertBatch{seq: j.seq, ids: ids}}
}

// appendRecord writes rec at the write position. When the file cannot
// grow (the disk is full), the journal goes on within the size it has: it
// starts again at the front if rec fits there, or fails this record only.
// Any other failure (a write or fdatasync of the record itself) leaves the
// file's contents unknown, so the journal is not used again (bad) and
// later Enqueues go to the database directly.
func (q *Queue) appendRecord(rec []byte) error {
	j := q.jrnl
	err := j.Append(rec)
	var ge *journal.GrowError
	if !errors.As(err, &ge) {
		if err != nil {
			j.bad = err
		}
		return err
	}
	if j.AtFront() || !j.FitsAtFront(len(rec)) {
		return err
	}
	if err := q.settle(); err != nil { // the database's failure, not the journal's
		return err
	}
	j.Rewind()
	if err := j.Append(rec); err != nil { // fits: no growth needed
		j.bad = err
		return err
	}
	return nil
}

// insertDirect stores ms with their IDs in a transaction of their own,
// without the journal.
func (q *Queue) insertDirect(ms []NewMessage, ids []ID) error {
	size := 0
	for i := range ms {
		size += len(ms[i].Body)
	}
	return q.submit(len(ms), size, func(w *wtx) error {
		for i := range ms {
			if _, err := w.insertMessage(&ms[i], ids[i]); err != nil {
				return err
			}
			if err := w.accepted(ids[i], &ms[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// answer replies to each request of the batch with its share of ids.
func (q *Queue) answer(batch []jrequest, ids []ID, err error) {
	for _, r := range batch {
		if err != nil {
			r.reply <- jresult{err: err}
			continue
		}
		r.reply <- jresult{ids: ids[:len(r.ms):len(r.ms)]}
		ids = ids[len(r.ms):]
	}
}

// maxInflightRcpts bounds the recipients acknowledged by the journal and
// not yet in the database (they are held in memory until then).
const maxInflightRcpts = 100000

// rcptsOf counts the recipients of journaled batches.
func rcptsOf(bs []*insertBatch) int {
	n := 0
	for _, b := range bs {
		for i := range b.ms {
			n += len(b.ms[i].To)
		}
	}
	return n
}

// settle waits until the database holds every message an Enqueue has
// acknowledged, so that a read sees what an Enqueue that returned before
// it stored. It costs nothing when nothing is on its way.
func (q *Queue) settle() error {
	for target := q.acked.Load(); q.applied.Load() < target; {
		select {
		case q.hurry <- struct{}{}: // no linger: intake may be waiting
		default:
		}
		// Each commit inserts some of what is pending (insertBudget).
		if err := q.submitRequest(request{fn: func(*wtx) error { return nil }, insert: true}); err != nil {
			return err
		}
	}
	return nil
}

// unsettled turns the failure of a settle (or settleID) before a read
// that can answer from the database alone into the *UnsettledError the
// read returns with its answer: nil when the settle succeeded, or when no
// acknowledged recipient is missing (a record whose write failed is
// marked applied without messages, and holds none). The count is read
// before the read's transaction: a recipient inserted in between is in
// the answer and counted, so it is never missed, only overcounted.
func (q *Queue) unsettled(err error) error {
	if err == nil {
		return nil
	}
	n := q.inflight.Load()
	if n <= 0 {
		return nil
	}
	return &UnsettledError{Recipients: int(n), Err: err}
}

// readOne is the error of a read of one message after q.unsettled(q.settleID(id))
// returned unsettled: the database holds a message whole or not at all,
// so only an answer that it does not exist is in doubt.
func readOne(err, unsettled error) error {
	if unsettled != nil && errors.Is(err, ErrNotFound) {
		return unsettled
	}
	return err
}

// closeJournal closes the journal file (after the journaler has stopped).
func (q *Queue) closeJournal() {
	if q.jrnl != nil {
		q.jrnl.Close()
	}
}

// settleID is settle for a read of message id: it waits only when id may
// be journaled and not yet in the database, so the delivery workers, who
// read messages the database already holds, do not wait.
func (q *Queue) settleID(id ID) error {
	if uint64(id) <= q.insertedID.Load() {
		return nil
	}
	return q.settle()
}

// Replayed is the number of messages Open found only in the journal (their
// 250 had gone out, a crash came before the database held them) and
// inserted. Zero after a clean stop.
func (q *Queue) Replayed() int { return q.replayed }
