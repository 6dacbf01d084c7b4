package delivery

import (
	"slices"
	"sync"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// heldRetry is how often outcomes that could not be stored are tried again.
const heldRetry = time.Second

// held keeps the outcomes whose queue.Apply failed even after retry (a
// full or failing disk). Their recipients stay Active in the queue, where
// nothing else will try them, so giving up would leave them stuck until
// the next start (queue.Recover); instead the scheduler stores them again
// at each of its wakes, and at least every heldRetry, until the disk takes
// them. What was learned about the destination is not kept: a later
// outcome may have stored a newer record of it meanwhile. The DSNs are
// kept and enqueued with their results. At shutdown what is still held is
// lost from memory only: the recipients are Active in the queue and
// recovered at the next start, as after a crash.
type held struct {
	mu sync.Mutex
	us []queue.Update
}

// add holds u's results and DSNs.
func (h *held) add(u queue.Update) {
	h.mu.Lock()
	h.us = append(h.us, queue.Update{Results: u.Results, DSNs: u.DSNs})
	h.mu.Unlock()
}

// flush stores everything held in one update with store. It returns how
// many held updates it stored and how many are left (all of them if store
// failed), and store's error.
func (h *held) flush(store func(queue.Update) error) (stored, left int, err error) {
	h.mu.Lock()
	us := h.us
	h.us = nil
	h.mu.Unlock()
	if len(us) == 0 {
		return 0, 0, nil
	}
	var all queue.Update
	for _, u := range us {
		all.Results = append(all.Results, u.Results...)
		all.DSNs = append(all.DSNs, u.DSNs...)
	}
	if err := store(all); err != nil {
		h.mu.Lock()
		h.us = append(slices.Clip(us), h.us...) // older first, ahead of any added meanwhile
		left = len(h.us)
		h.mu.Unlock()
		return 0, left, err
	}
	return len(us), 0, nil
}
