package delivery

import (
	"slices"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// heldRetry is the longest wait between two tries to store held outcomes
// (see heldBackoff).
const heldRetry = time.Second

// held keeps the outcomes whose commit failed (a full or failing disk).
// Their recipients stay Active in the queue, where nothing else will try
// them (those of a fresh attempt stay Queued and claimed, which keeps the
// scan away just the same), so giving up would leave them stuck until the
// next start (queue.Recover); instead the recorder stores them again on a
// timer (record.go) until the disk takes them. What was learned about the
// destination is not kept: a later outcome may have stored a newer record
// of it meanwhile. The DSNs are kept and enqueued with their results. At
// shutdown what is still held is lost from memory only: the recipients are
// Active in the queue and recovered at the next start, as after a crash.
// Every held outcome was logged and counted before it was handed to the
// queue (settle). Only the recorder's goroutine uses it, so no lock
// guards it.
type held struct {
	pos []*pendingOutcome
}

// add holds po.
func (h *held) add(po *pendingOutcome) {
	h.pos = append(h.pos, po)
}

// len is how many outcomes are held.
func (h *held) len() int {
	return len(h.pos)
}

// flush stores everything held in one update with store (the results and
// DSNs, oldest first, without destination records). It returns what it
// stored, how many are left (all of them if store failed), and store's
// error.
func (h *held) flush(store func(queue.Update) error) (stored []*pendingOutcome, left int, err error) {
	hs := h.pos
	h.pos = nil
	if len(hs) == 0 {
		return nil, 0, nil
	}
	var all queue.Update
	for _, po := range hs {
		all.Starts = append(all.Starts, po.u.Starts...)
		all.Results = append(all.Results, po.u.Results...)
		all.DSNs = append(all.DSNs, po.u.DSNs...)
	}
	if err := store(all); err != nil {
		h.pos = slices.Clip(hs) // nothing was added meanwhile: only the recorder adds
		return nil, len(h.pos), err
	}
	return hs, 0, nil
}
