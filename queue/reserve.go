package queue

import (
	"fmt"
	"path/filepath"
	"syscall"

	"github.com/greyrelay/greyrelay/queue/journal"
)

// The disk reserve (Options.Reserve). A full disk must stop intake, never
// delivery: delivering is what frees space, and recording a delivery, a
// DSN or an operator's action takes a little space first (bbolt copies
// the pages it changes). A free-space check in front of intake (Postfix's
// queue_minfree) measures the disk before the queue has written what it
// owes for the messages already accepted: each accepted message is
// written to the journal, then again into the database by the writer a
// commit later, and the journal grows a step at a time. So the check
// that keeps the reserve is here, in the journaler, where every Enqueue
// passes one batch at a time: it counts the journal's growth for this
// batch, this batch's copy in the database and the copies the database
// still owes for earlier ones, and refuses the batch, before writing
// anything, if the reserve would not be left. Spooled bodies are already
// on disk when they get here (the caller wrote them while reading), so
// they count only in the measurement.

// keepReserve fails with an error matching syscall.ENOSPC when enqueueing
// ms, whose journal record grows the journal by growth octets, would
// leave less than Options.Reserve free.
func (q *Queue) keepReserve(growth int64, ms []NewMessage) error {
	if q.opt.Reserve <= 0 {
		return nil
	}
	measure := q.opt.DiskFree
	if measure == nil {
		measure = func() (uint64, error) { return statfsFree(filepath.Dir(q.path)) }
	}
	free, err := measure()
	if err != nil {
		return fmt.Errorf("queue: measuring free space: %w", err)
	}
	need := q.opt.Reserve + growth + q.owed.Load() + insertCost([]*insertBatch{{ms: ms}})
	if free > uint64(need) {
		return nil
	}
	return fmt.Errorf("queue: %d octets free, %d needed to keep the reserve of %d: %w",
		free, need, q.opt.Reserve, syscall.ENOSPC)
}

// journalGrowth is how much the journal file grows to take a record of n
// octets at its write position (it grows a step at a time, up to its
// size, and never shrinks).
func (q *Queue) journalGrowth(n int) int64 {
	j := q.jrnl
	end := j.Offset() + int64(n)
	if !j.Fits(n) {
		end = int64(n) // it starts again at the front
	}
	if end <= j.Size() {
		return 0
	}
	return min(j.Max(), (end+journal.Step-1)/journal.Step*journal.Step) - j.Size()
}

// insertCost estimates what inserting the batches' messages writes to
// the database: their bodies held in memory (a spooled body is a file
// already written) and a page's worth per message and recipient for the
// records, the due index and the pages a commit copies.
func insertCost(bs []*insertBatch) int64 {
	var n int64
	for _, b := range bs {
		for i := range b.ms {
			m := &b.ms[i]
			if m.File == nil {
				n += int64(len(m.Body))
			}
			n += 4096 * int64(1+len(m.To))
		}
	}
	return n
}

// insertDirectKeeping is insertDirect after the reserve check.
func (q *Queue) insertDirectKeeping(ms []NewMessage, ids []ID) error {
	if err := q.keepReserve(0, ms); err != nil {
		return err
	}
	return q.insertDirect(ms, ids)
}
