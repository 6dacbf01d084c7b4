package queue

// Messages finished in the transaction that inserts them.
//
// Under load most messages are delivered from the journal's copy (Fresh)
// before the writer's next commit, and the outcome of the attempt often
// reaches the writer in the same batch as the message's insert. The
// transaction would then write the message, its body, its recipients and
// their due entries, and delete all of them again a few lines later
// (perf, saturating 4 KiB load: the transactions' inserts and requests
// took 8% of the relay's CPU, 4% with this and apply's single write of a
// started recipient). So when every recipient of a journaled message in
// the commit's inserts is started and given a final outcome by one
// Update of the same batch, the transaction holds the message in memory
// (heldMessage) instead of the database: the outcome
// is applied to the held recipients exactly as to stored ones (apply),
// and finishing the message stores its finished record and deletes
// nothing. What the commit stores is what the long way leaves behind: the
// finished record, the outbox's events (accepted, then the outcome's),
// the message ID sequence and the journal's applied number; the counters
// go up and down by the same amounts.
//
// Durability is the long way's: the message is in the journal until the
// commit that holds its outcome marks its record applied, so a crash
// before that commit replays it (Queued, due again) and a crash after it
// finds it finished. The shortcut is taken only when the batch holds
// nothing but such outcomes (ApplyAsync): a Begin, an operator's action
// or a settle in the same batch may read the message, and then it is
// inserted as usual.

// heldMessage is a journaled message this transaction inserts and
// finishes, held in memory instead of the database.
type heldMessage struct {
	m     *NewMessage
	rec   Message // its message record, as insertMessage would store it
	rcpts []Recipient
	hists [][]Attempt // by recipient: the history rewriteHistory would store
}

// finishedInBatch returns the IDs of the journaled messages of pending
// that an Update of batch finishes (see finishes), or nil when the
// batch holds any other request.
func finishedInBatch(pending []*insertBatch, batch []request) map[ID]bool {
	if len(pending) == 0 || len(batch) == 0 {
		return nil
	}
	named := map[ID]int{}  // how many of the batch's Updates name each message
	by := map[ID]*Update{} // the last one
	for _, r := range batch {
		if r.upd == nil {
			return nil
		}
		ids := map[ID]bool{}
		for _, s := range r.upd.Starts {
			for _, k := range s.Keys {
				ids[k.ID] = true
			}
		}
		for _, res := range r.upd.Results {
			ids[res.Key.ID] = true
		}
		for id := range ids {
			named[id]++
			by[id] = r.upd
		}
	}
	var out map[ID]bool
	for _, b := range pending {
		for i := range b.ms {
			id := b.ids[i]
			if named[id] == 1 && finishes(by[id], id, &b.ms[i]) {
				if out == nil {
					out = map[ID]bool{}
				}
				out[id] = true
			}
		}
	}
	return out
}

// finishes reports whether u starts every recipient of message id (m,
// with its body in memory) and gives each a final outcome.
func finishes(u *Update, id ID, m *NewMessage) bool {
	if m.File != nil || len(m.To) == 0 {
		return false
	}
	started := make([]bool, len(m.To))
	final := make([]bool, len(m.To))
	for _, s := range u.Starts {
		for _, k := range s.Keys {
			if k.ID != id {
				continue
			}
			if k.Rcpt < 0 || k.Rcpt >= len(m.To) {
				return false
			}
			started[k.Rcpt] = true
		}
	}
	for _, res := range u.Results {
		if res.Key.ID != id {
			continue
		}
		if res.Key.Rcpt < 0 || res.Key.Rcpt >= len(m.To) {
			return false
		}
		final[res.Key.Rcpt] = final[res.Key.Rcpt] || res.Status.Final()
	}
	for i := range started {
		if !started[i] || !final[i] {
			return false
		}
	}
	return true
}

// hold takes journaled message m (id) into the transaction's memory
// instead of inserting it (insertJournaled, for the IDs in w.finish).
func (w *wtx) hold(m *NewMessage, id ID) error {
	if err := w.raiseSequence(id); err != nil {
		return err
	}
	if w.held == nil {
		w.held = map[ID]*heldMessage{}
	}
	rs := m.recipients(id)
	w.held[id] = &heldMessage{m: m, rec: m.record(id), rcpts: rs, hists: make([][]Attempt, len(rs))}
	w.delta.msgs++
	for i := range rs {
		w.delta.rcpt(&rs[i], +1)
	}
	return nil
}

// loadRcpt is getRcpt for a recipient that may be held.
func (w *wtx) loadRcpt(k Key) (Recipient, bool) {
	if h := w.held[k.ID]; h != nil {
		if k.Rcpt < 0 || k.Rcpt >= len(h.rcpts) {
			return Recipient{}, false
		}
		return h.rcpts[k.Rcpt], true
	}
	return w.getRcpt(k)
}

// storeOutcome is putRcptHistory for a recipient that may be held.
func (w *wtx) storeOutcome(before, after *Recipient, edit func([]Attempt) []Attempt) error {
	h := w.held[after.Key.ID]
	if h == nil {
		return w.putRcptHistory(before, after, edit)
	}
	w.delta.rcpt(before, -1)
	w.delta.rcpt(after, +1)
	i := after.Key.Rcpt
	h.rcpts[i] = *after
	h.hists[i] = capHistory(edit(h.hists[i]))
	return nil
}

// finishHeld is finishIfDone for a held message: it stores the finished
// record, and takes the message out of the counters, once every
// recipient is final.
func (w *wtx) finishHeld(id ID, h *heldMessage) error {
	for i := range h.rcpts {
		if !h.rcpts[i].Status.Final() {
			return nil
		}
	}
	for i := range h.rcpts {
		w.delta.rcpt(&h.rcpts[i], -1)
	}
	w.delta.msgs--
	delete(w.held, id)
	if !w.history.enabled() {
		return nil
	}
	raws := make([][]byte, len(h.rcpts))
	hs := make([][]byte, len(h.rcpts))
	for i := range h.rcpts {
		r := &h.rcpts[i]
		raws[i] = encodeRecipient(r)
		hs[i] = encodeHistory(r.Key, h.hists[i], historyRef(r))
	}
	return w.storeFinished(id, encodeMessage(&h.rec), h.rcpts, raws, hs)
}

// storeHeld inserts the messages still held when the transaction's
// requests have run, as they stand, so that none is lost if an outcome
// did not finish one after all (finishedInBatch makes sure it does).
func (w *wtx) storeHeld() error {
	for id, h := range w.held {
		delete(w.held, id)
		w.delta.msgs--
		for i := range h.rcpts {
			w.delta.rcpt(&h.rcpts[i], -1)
		}
		if _, err := w.insertMessage(h.m, id); err != nil {
			return err
		}
		for i := range h.rcpts {
			r, hist := h.rcpts[i], h.hists[i]
			if len(hist) == 0 {
				continue // as inserted
			}
			queued := h.m.recipients(id)[i]
			if err := w.putRcptHistory(&queued, &r, func([]Attempt) []Attempt { return hist }); err != nil {
				return err
			}
		}
	}
	return nil
}
