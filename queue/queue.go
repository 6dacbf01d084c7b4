package queue

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/greyrelay/greyrelay/queue/journal"
)

// DefaultLockTimeout is used when Options.LockTimeout is zero.
const DefaultLockTimeout = 2 * time.Second

// Group commit limits: one transaction takes at most this many messages or
// body bytes, so a burst cannot build an unbounded transaction.
const (
	maxBatchMsgs  = 512
	maxBatchBytes = 64 << 20
	maxBatchRcpts = 20000 // journaled recipients inserted by one transaction
)

// Queue is the durable store. All methods are safe for concurrent use.
//
// Writers: Enqueue, EnqueueBatch, Begin and Apply (the hot path: intake and
// every delivery attempt) go through one writer goroutine that group-commits
// whatever is waiting into one transaction (one fsync for many calls; a busy
// writer may also wait Options.CommitDelay for more). Each call still
// returns only after the commit holding its writes. A call that is refused
// (ErrState, ErrNotFound) decides so before it writes anything, so it leaves
// nothing in the shared transaction and fails alone; a storage error fails
// the whole batch. Recover, the operator actions and repairs call db.Update
// directly; bbolt serialises them with the writer. db.Batch is never used: it
// may run a function twice, and our functions allocate IDs and report to
// callers.
type Queue struct {
	db   *bolt.DB
	path string
	opt  Options
	// reqs is buffered so that a caller who does not wait for the commit
	// (ApplyAsync) is not held up by the one in progress; the order of
	// the channel is the order of the commits.
	reqs chan request
	// hurry ends the writer's linger early: a caller that waits for the
	// database to hold what the journal acknowledged (settle) holds up
	// intake, or a read, for as long as the writer lingers.
	hurry   chan struct{}
	done    chan struct{}
	stopped chan struct{} // closed by the writer when it has answered its last request
	wg      sync.WaitGroup
	wake    chan struct{}
	closed  atomic.Bool
	once    sync.Once

	// damaged is set, and damagedCh closed, when a transaction finds the
	// file damaged (guard.go); every call fails with it from then on.
	damaged   atomic.Pointer[DamagedError]
	damagedCh chan struct{}

	mu      sync.Mutex
	counts  counts
	cursors []*DueCursor

	// The intake journal (queue/journal, journaler.go); jrnl is nil when
	// Options.JournalSize is negative.
	jrnl       *intakeJournal
	jreqs      chan jrequest
	jdone      chan struct{}
	jstopped   chan struct{} // closed by the journaler when it has answered its last request
	jwg        sync.WaitGroup
	lastID     atomic.Uint64  // the last message ID handed out
	acked      atomic.Uint64  // the last journal record handed to the writer
	applied    atomic.Uint64  // the last journal record in the database
	inflight   atomic.Int64   // recipients acknowledged by the journal, not yet in the database
	owed       atomic.Int64   // octets the database will still write for them (reserve.go)
	insertedID atomic.Uint64  // the highest message ID inserted from the journal
	pending    []*insertBatch // writer only: journaled batches not inserted yet
	stuck      bool           // writer only: the last commit holding pending batches failed
	stuckWait  time.Duration  // writer only: the wait before the next try of the pending batches while stuck
	replayed   int            // messages Open inserted from the journal

	fresh   chan Fresh  // fresh.go
	freshOn atomic.Bool // Fresh was called
	// visible is the journal number of the newest batch a committed or
	// committing transaction inserts (Visible).
	visible atomic.Uint64
}

// request is one call waiting for the writer. fn runs inside the shared
// transaction; n and size weigh it against the batch limits.
type request struct {
	fn      func(w *wtx) error
	n, size int
	reply   chan error   // buffered 1: the writer never blocks on it
	ins     *insertBatch // instead of fn: journaled messages to insert; no reply
	needs   ID           // fn reads message needs: its journaled insert must be in the same transaction or before
	insert  bool         // a settle: the transaction must try the pending journaled inserts, even while stuck
	waited  bool         // its caller waits for the commit (submit), as opposed to ApplyAsync's
	upd     *Update      // fn applies this update (ApplyAsync), and nothing else
}

// refused wraps an error that fails one call of a batch and no other. An
// operation returns it only before its first write, so the shared
// transaction holds nothing of the refused call.
type refused struct{ err error }

func (r *refused) Error() string { return r.err.Error() }
func (r *refused) Unwrap() error { return r.err }

// Open opens the queue database at path, creating the parent directory
// (0700) and the file (0600) if needed. It fails with an error matching
// ErrLocked when another process holds the file longer than LockTimeout.
//
// Open reads the Stats counters stored with the records. It decodes every
// record only when they cannot be trusted (a database written by an older
// greyrelay, or by anything else since), or when Options.FullScan asks: it
// then counts again, quarantines the records that do not decode (reported
// through Options.OnQuarantine) and stores the counters. Without the full
// scan, a damaged record is quarantined when it is first read (see the
// package comment). Call Recover afterwards.
func Open(path string, opt Options) (*Queue, error) {
	if opt.LockTimeout <= 0 {
		opt.LockTimeout = DefaultLockTimeout
	}
	if opt.JournalSize == 0 {
		opt.JournalSize = DefaultJournalSize
	}
	if opt.JournalSize > 0 && opt.JournalSize < journal.MinSize {
		opt.JournalSize = journal.MinSize
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, fs.ErrNotExist)
	// Never NoSync (bbolt calls it unsafe): every commit is fsync'd before it
	// returns.
	// NoFreelistSync (etcd's default) is another matter: the freelist is
	// not written at each commit but rebuilt at Open by walking the
	// pages. bbolt sorts and writes the whole freelist at every commit
	// otherwise, and a queue that holds a backlog of 4 KiB bodies (two
	// pages each) keeps thousands of free single pages, which cost a
	// healthy stream a noticeable share of its throughput during a
	// deferral storm (BENCHMARKS.md, "Tuning"). The walk costs a fraction
	// of a second at Open even with a million recipients.
	db, err := openBolt(path, &bolt.Options{
		Timeout:        opt.LockTimeout,
		FreelistType:   bolt.FreelistMapType,
		NoFreelistSync: true,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s (waited %v)", ErrLocked, path, opt.LockTimeout)
	}
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) && pe.Path == path {
		err = pe.Err // named once, below
	}
	if err != nil {
		return nil, fmt.Errorf("queue: open %s: %w", path, err)
	}
	q := &Queue{db: db, path: path, opt: opt, reqs: make(chan request, reqBuffer), hurry: make(chan struct{}, 1),
		done: make(chan struct{}), stopped: make(chan struct{}), wake: make(chan struct{}, 1),
		counts: newCounts(), damagedCh: make(chan struct{}), fresh: make(chan Fresh, freshBuffer),
		jreqs: make(chan jrequest, reqBuffer), jdone: make(chan struct{}), jstopped: make(chan struct{})}
	if err := q.init(created, dir); err != nil {
		db.Close()
		return nil, err
	}
	// The journal before the sweep: records not yet in the database name
	// spool files too.
	if err := q.startJournal(); err != nil {
		db.Close()
		return nil, err
	}
	if err := q.sweepSpool(); err != nil {
		q.closeJournal()
		db.Close()
		return nil, err
	}
	q.wg.Add(1)
	go q.writer()
	if q.jrnl != nil {
		q.jwg.Add(1)
		go q.journaler()
	}
	return q, nil
}

func (q *Queue) init(created bool, dir string) error {
	format, err := q.checkFormat()
	if err != nil {
		return err
	}
	if err := q.createBuckets(); err != nil {
		return fmt.Errorf("queue: init %s: %w", q.path, err)
	}
	if created {
		// The new file's directory entry must be durable too (a crash
		// right after first initialisation must not lose the file).
		if err := syncDir(dir); err != nil {
			return fmt.Errorf("queue: %w", err)
		}
	}
	var stored bool
	err = q.view(func(tx *bolt.Tx) error {
		q.counts, stored = loadCounts(tx.Bucket(bCounts), tx.ID())
		return nil
	})
	if err != nil {
		return fmt.Errorf("queue: init %s: %w", q.path, err)
	}
	if !stored || q.opt.FullScan {
		if err := q.scan(); err != nil {
			return fmt.Errorf("queue: scan %s: %w", q.path, err)
		}
	}
	if err := q.stampFormat(format); err != nil {
		return fmt.Errorf("queue: init %s: %w", q.path, err)
	}
	return nil
}

// createBuckets creates the buckets that do not exist yet. It writes only
// if one is missing: every other write goes through update, which keeps
// the stored counters (a write here makes Open count again).
func (q *Queue) createBuckets() error {
	missing := false
	err := q.view(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			missing = missing || tx.Bucket(b) == nil
		}
		return nil
	})
	if err != nil || !missing {
		return err
	}
	return q.guard(func() error {
		return q.db.Update(func(tx *bolt.Tx) error {
			for _, b := range allBuckets {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// syncFreelist writes the freelist in one last commit, so that the next
// Open reads it instead of walking every page of the file (which takes
// time and brings the whole file into the process's resident memory).
// The writer has stopped; the field is set inside bbolt's write lock, the
// only place Commit reads it. A failure only means the walk.
func (q *Queue) syncFreelist() {
	_ = q.update(func(*wtx) error {
		q.db.NoFreelistSync = false
		return nil
	})
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Close stops the writer goroutine and closes the database. Enqueue calls
// still waiting fail with ErrClosed; a batch already being committed finishes
// first and its callers get its real result.
func (q *Queue) Close() error {
	err := ErrClosed
	q.once.Do(func() {
		q.closed.Store(true)
		// The journaler first: what it has acknowledged reaches the
		// writer, which commits it before it stops.
		close(q.jdone)
		q.jwg.Wait()
		close(q.done)
		q.wg.Wait()
		q.syncFreelist()
		q.closeJournal()
		err = q.db.Close()
	})
	return err
}

// Wake returns a channel that receives (coalesced, capacity 1) after a
// change that may have created earlier due work: Enqueue, Apply with deferred
// recipients or DSNs, Recover, Retry and Release.
func (q *Queue) Wake() <-chan struct{} { return q.wake }

func (q *Queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// DBSize returns the size of the database file in bytes (0 if unknown).
// bbolt files never shrink; freed pages are reused.
func (q *Queue) DBSize() int64 {
	fi, err := os.Stat(q.path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// Enqueue stores m and returns its ID only once m is durable: after the
// fdatasync of the intake journal record holding it (journaler.go; the writer
// inserts it into the database later), or, with the journal turned off
// (Options.JournalSize < 0), after the database commit holding it.
// Concurrent callers share one record or one commit.
func (q *Queue) Enqueue(m NewMessage) (ID, error) {
	ids, err := q.EnqueueBatch([]NewMessage{m})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// EnqueueBatch stores all of ms in one transaction, all or nothing.
func (q *Queue) EnqueueBatch(ms []NewMessage) ([]ID, error) {
	if len(ms) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrInvalid)
	}
	if err := q.Err(); err != nil {
		return nil, err // the journal must not take what the database may never hold
	}
	size := 0
	for i := range ms {
		if err := validateNew(&ms[i]); err != nil {
			return nil, err
		}
		size += len(ms[i].Body)
	}
	if err := q.finishFiles(ms); err != nil {
		return nil, err
	}
	if q.jrnl != nil {
		ids, err := q.enqueueJournal(ms, size)
		if err != nil {
			return nil, fmt.Errorf("queue: enqueue: %w", err)
		}
		return ids, nil
	}
	var ids []ID
	err := q.submit(len(ms), size, func(w *wtx) error {
		ids = ids[:0]
		for i := range ms {
			id, err := w.insertMessage(&ms[i], 0)
			if err != nil {
				return err
			}
			if err := w.accepted(id, &ms[i]); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("queue: enqueue: %w", err)
	}
	return ids, nil
}

// submit hands fn to the writer and waits until the transaction holding it
// has been committed (or has failed).
func (q *Queue) submit(n, size int, fn func(w *wtx) error) error {
	return q.submitRequest(request{fn: fn, n: n, size: size})
}

// submitRequest is submit for a request built by the caller.
func (q *Queue) submitRequest(r request) error {
	if q.closed.Load() {
		return ErrClosed
	}
	r.reply, r.waited = make(chan error, 1), true
	select {
	case q.reqs <- r:
	case <-q.done:
		return ErrClosed
	}
	return q.await(r.reply)
}

// reqBuffer is how many requests may wait for the writer: more than the
// sessions and workers that ever wait at once, so a send rarely blocks.
const reqBuffer = 1024

// await waits for the writer's answer to a request. One that reached the
// buffer after the writer's last look at it gets no answer: it never ran.
func (q *Queue) await(reply chan error) error {
	select {
	case err := <-reply:
		return err
	case <-q.stopped:
		select {
		case err := <-reply:
			return err
		default:
			return ErrClosed
		}
	}
}

func validateNew(m *NewMessage) error {
	if m.File != nil && m.Body != nil {
		return fmt.Errorf("%w: both Body and File set", ErrInvalid)
	}
	if len(m.To) == 0 {
		return fmt.Errorf("%w: message without recipients", ErrInvalid)
	}
	if len(m.To) > 1<<20 {
		return fmt.Errorf("%w: too many recipients", ErrInvalid)
	}
	for _, r := range m.To {
		if r.Addr == "" || r.Domain == "" {
			return fmt.Errorf("%w: recipient without address or domain", ErrInvalid)
		}
	}
	return nil
}

// writer is the group-commit loop: take one request, drain whatever else is
// already waiting, commit once, answer everyone.
func (q *Queue) writer() {
	defer q.wg.Done()
	defer close(q.stopped)
	busy := false         // requests were waiting when the last commit ended
	var retry *time.Timer // while stuck: when to try the journaled inserts again
	for {
		if len(q.pending) > 0 && !q.stuck {
			// Journaled messages left over by a commit's budget go on
			// with whatever else is waiting.
			q.commit(q.gatherMore(nil))
			continue
		}
		retry = q.retryTimer(retry)
		var retryC <-chan time.Time
		if retry != nil {
			retryC = retry.C
		}
		select {
		case <-retryC:
			retry = nil
			q.commit([]request{{fn: func(*wtx) error { return nil }, insert: true, reply: make(chan error, 1)}})
		case r := <-q.reqs:
			batch := []request{r}
			if busy {
				batch = q.linger(batch)
			}
			busy = q.commit(q.gatherMore(batch))
		case <-q.done:
			q.drain()
			return
		}
	}
}

// stuckRetry is how soon the writer tries again to insert journaled
// messages after a commit holding them failed (a full disk); each failure
// doubles the wait, up to stuckRetryMax. Meanwhile the other requests
// commit without them (commit), so the deliveries that free space go on.
const (
	stuckRetry    = time.Second
	stuckRetryMax = 4 * time.Second
)

// retryTimer returns the timer of the writer's next try while a failed
// commit left journaled messages out of the database (q.stuck), creating
// it if t is nil, and nil (t stopped) otherwise. Every request tries them
// again too, but an idle relay sends none: without the timer, messages
// accepted as the disk filled would stay out of the database, where the
// scheduler and the operator's actions cannot see them, until the next
// message or read of the queue came, however long after the disk had room.
func (q *Queue) retryTimer(t *time.Timer) *time.Timer {
	switch {
	case q.stuck && len(q.pending) > 0 && t == nil:
		return time.NewTimer(max(q.stuckWait, stuckRetry))
	case q.stuck && len(q.pending) > 0:
		return t
	case t != nil:
		t.Stop()
	}
	return nil
}

// linger waits Options.CommitDelay (or until Close, or until a settle
// hurries it) so that the requests arriving meanwhile share the next
// commit. Under load the writer would otherwise start a commit the moment
// the last one ends, with whatever few requests arrived during its
// fdatasyncs: each commit rewrites the pages it touches and syncs twice,
// so more of them cost more CPU and disk flushes per message, which the
// intake sessions on the same CPUs then lack, and keep the disk busy, so
// that the journal's own fdatasync, which every 250 waits for, waits
// behind theirs. Clients of journaled messages do not wait for the writer
// (the journal's fdatasync answers them), nor do attempts started from the
// journal's copy (ApplyAsync). A caller that does wait (request.waited:
// a Begin, an operator's action) waits at most waitedLinger for it to
// end: a retry backlog is drained by workers that each wait for their
// Begin, and at the full delay they would spend most of their time
// waiting. A settle, which intake waits for, ends it at once. It returns
// batch with the requests that arrived meanwhile.
func (q *Queue) linger(batch []request) []request {
	d := q.opt.CommitDelay
	if d <= 0 {
		return batch
	}
	if slices.ContainsFunc(batch, func(r request) bool { return r.waited }) {
		d = min(d, waitedLinger)
	}
	// A signal left by a settle whose request was committed without a
	// linger cuts the next one short once: harmless.
	t := time.NewTimer(d)
	defer t.Stop()
	n, size := weigh(batch)
	for n < maxBatchMsgs && size < maxBatchBytes {
		select {
		case r := <-q.reqs:
			batch = append(batch, r)
			n, size = n+r.n, size+r.size
			if r.waited && d > waitedLinger {
				d = waitedLinger
				t.Reset(d)
			}
		case <-t.C:
			return batch
		case <-q.hurry:
			return batch
		case <-q.done:
			return batch
		}
	}
	return batch
}

// waitedLinger bounds the linger before a commit that a caller waits for.
const waitedLinger = 500 * time.Microsecond

// drain commits what was submitted before Close, so that a caller who did
// not wait (ApplyAsync) still has its update stored.
func (q *Queue) drain() {
	for {
		select {
		case r := <-q.reqs:
			q.commit(q.gather(r))
		default:
			if len(q.pending) == 0 || q.stuck {
				return // a failing database keeps them in the journal for the next Open
			}
			q.commit([]request{{fn: func(*wtx) error { return nil }, insert: true, reply: make(chan error, 1)}})
		}
	}
}

func (q *Queue) gather(first request) []request {
	return q.gatherMore([]request{first})
}

// weigh is the number of messages and octets of batch, to compare with
// maxBatchMsgs and maxBatchBytes.
func weigh(batch []request) (n, size int) {
	for _, r := range batch {
		n, size = n+r.n, size+r.size
	}
	return n, size
}

// gatherMore adds the requests already waiting to batch, within the limits.
func (q *Queue) gatherMore(batch []request) []request {
	n, size := weigh(batch)
	for n < maxBatchMsgs && size < maxBatchBytes {
		select {
		case r := <-q.reqs:
			batch = append(batch, r)
			n, size = n+r.n, size+r.size
		default:
			return batch
		}
	}
	return batch
}

// commit runs every request of the batch in one transaction, after the
// journaled messages not inserted yet (oldest first; they stay pending until
// a commit holding them succeeds). A refused request fails alone; any other
// error rolls back the batch and fails all. It reports whether requests
// were waiting when the transaction ended (the writer then lingers).
//
// While stuck (the last commit holding journaled messages failed: a full
// disk, where inserting a message takes more room than recording an
// outcome), the batch commits without them, unless one of its requests
// reads one (needs) or is a settle (insert): otherwise one message the
// database cannot take would fail every commit, and with them the
// deliveries, whose commits are what frees space. The writer tries the
// inserts again on its own, less and less often (retryTimer).
func (q *Queue) commit(all []request) (waiting bool) {
	batch := all[:0:0]
	for _, r := range all {
		if r.ins != nil {
			q.pending = append(q.pending, r.ins)
		} else {
			batch = append(batch, r)
		}
	}
	errs := make([]error, len(batch))
	var needs ID
	insert := !q.stuck
	for _, r := range batch {
		needs = max(needs, r.needs)
		insert = insert || r.insert
	}
	if needs > ID(q.insertedID.Load()) {
		insert = true
	}
	var pending []*insertBatch
	if insert {
		pending = q.pending[:insertBudget(q.pending, needs)]
	}
	if len(pending) > 0 {
		// Raised before the commit, so that whoever reads it after a
		// read transaction began gets at least what that transaction
		// sees (fresh.go).
		q.visible.Store(pending[len(pending)-1].seq)
	}
	finish := finishedInBatch(pending, batch)
	err := q.update(func(w *wtx) error {
		w.finish = finish
		if err := w.insertJournaled(pending); err != nil {
			return err
		}
		w.settled = pending
		for i, r := range batch {
			errs[i] = nil
			if err := r.fn(w); err != nil {
				var rf *refused
				if !errors.As(err, &rf) {
					return err
				}
				errs[i] = rf.err
			}
		}
		return w.storeHeld()
	})
	if len(pending) > 0 || !q.stuck {
		q.stuck = err != nil && len(pending) > 0
		q.stuckWait = nextStuckWait(q.stuckWait, q.stuck)
	}
	if err == nil {
		clear(pending) // the array outlives the slice: let the inserted bodies go
		q.pending = q.pending[len(pending):]
	}
	// Whether requests waited when the commit ended is decided before
	// anyone is answered: a caller answered now may send its next request
	// at once, and that one found the writer idle.
	waiting = len(q.reqs) > 0
	for i, r := range batch {
		if err != nil {
			r.reply <- err
		} else {
			r.reply <- errs[i]
		}
	}
	return waiting
}

// nextStuckWait is the wait before the writer's next try of the journaled
// inserts: stuckRetry after the first failure, doubled by each further
// one up to stuckRetryMax, and reset by a success.
func nextStuckWait(last time.Duration, stuck bool) time.Duration {
	switch {
	case !stuck:
		return 0
	case last == 0:
		return stuckRetry
	}
	return min(2*last, stuckRetryMax)
}

// insertBudget is how many of the pending journaled batches (at least one)
// the next transaction inserts: a transaction's dirty pages stay in memory
// until its commit, and a burst of messages with a thousand recipients
// each would otherwise build one of hundreds of megabytes. The budget
// always covers the batch holding message needs (0: none), which a
// request of the same transaction reads: an outcome of an attempt begun
// from the journaled copy (Fresh) must not commit before its message.
func insertBudget(bs []*insertBatch, needs ID) int {
	rcpts, size := 0, 0
	for i, b := range bs {
		for j := range b.ms {
			rcpts += len(b.ms[j].To)
			size += len(b.ms[j].Body)
		}
		if i > 0 && (rcpts > maxBatchRcpts || size > maxBatchBytes) && !holdsAbove(b, needs) {
			return i
		}
	}
	return len(bs)
}

// holdsAbove reports whether b may hold message needs: its first ID is at
// most needs (IDs grow along the journal, so no later batch holds it when
// b does not).
func holdsAbove(b *insertBatch, needs ID) bool {
	return needs != 0 && len(b.ids) > 0 && b.ids[0] <= needs
}

// insertMessage writes one new message: record, body, and one Queued
// recipient record (with its due entry) per recipient.
// A zero id takes the next one; the bucket's sequence keeps the highest
// ID stored, from which Open starts counting.
func (w *wtx) insertMessage(m *NewMessage, id ID) (ID, error) {
	if id == 0 {
		id = w.newID()
	}
	if err := w.raiseSequence(id); err != nil {
		return 0, err
	}
	rec := m.record(id)
	if err := w.b(bMsgs).Put(idKey(id), encodeMessage(&rec)); err != nil {
		return 0, err
	}
	if err := w.putBody(id, m); err != nil {
		return 0, err
	}
	w.delta.msgs++
	for _, r := range m.recipients(id) {
		if err := w.putRcpt(nil, &r); err != nil {
			return 0, err
		}
	}
	return id, nil
}

// raiseSequence keeps the highest ID stored in the messages bucket's
// sequence, from which Open starts counting.
func (w *wtx) raiseSequence(id ID) error {
	if b := w.b(bMsgs); uint64(id) > b.Sequence() {
		return b.SetSequence(uint64(id))
	}
	return nil
}

// record is m's message record as stored under id.
func (m *NewMessage) record(id ID) Message {
	size := int64(len(m.Body))
	sum, summed := bodySum(m.Body), true
	if m.File != nil {
		size = m.File.Len()
		sum, summed = m.File.sum, m.File.summed
	}
	rec := m.envelope(id, size)
	rec.bodySum, rec.bodySummed = sum, summed
	return rec
}

// recipients are m's recipient records as inserted under id: Queued, due
// at m.NextAttempt or else at the arrival.
func (m *NewMessage) recipients(id ID) []Recipient {
	next := m.NextAttempt
	if next.IsZero() {
		next = m.Arrival
	}
	rs := make([]Recipient, len(m.To))
	for i, to := range m.To {
		rs[i] = Recipient{Key: Key{id, i}, Addr: to.Addr, Domain: to.Domain, Notify: to.Notify,
			ORCPT: to.ORCPT, Status: Queued, NextAttempt: next}
	}
	return rs
}

// putBody stores m's body, or the name of its spool file.
func (w *wtx) putBody(id ID, m *NewMessage) error {
	if m.File != nil {
		return w.b(bSpool).Put(idKey(id), []byte(m.File.name))
	}
	body := m.Body
	if body == nil {
		body = []byte{} // bbolt stores nil as an empty value, but be explicit
	}
	return w.b(bBodies).Put(idKey(id), body)
}

// update runs fn in one write transaction and stores the counter delta in
// it (see counters.go). After a successful commit it applies the delta to
// the in-memory counters, reports quarantined records and signals Wake.
// Every write to the database goes through here, except the creation of
// missing buckets in Open.
func (q *Queue) update(fn func(w *wtx) error) error {
	var w *wtx
	err := q.guard(func() error {
		return q.db.Update(func(tx *bolt.Tx) error {
			w = &wtx{tx: tx, delta: newCounts(), newID: q.newID, history: q.opt.History}
			w.events = eventTx{accept: q.opt.OnAccept, spool: q.spoolDir()}
			w.setFillPercent()
			if err := fn(w); err != nil {
				return err
			}
			if w.recount {
				w.setCounts(countAll(tx))
			}
			return w.saveCounts()
		})
	})
	if err != nil {
		if errors.Is(err, berrors.ErrDatabaseNotOpen) {
			return ErrClosed
		}
		return resizeErrno(err)
	}
	q.removeFiles(w.unlink)
	q.mu.Lock()
	if w.reset != nil {
		// A recount: take it as it is. Adding its delta would double the
		// counters if the stored ones it was measured against were unusable.
		q.counts = *w.reset
	} else {
		q.counts.add(w.delta)
	}
	if n := len(w.settled); n > 0 {
		q.inflight.Add(-int64(rcptsOf(w.settled)))
		q.owed.Add(-insertCost(w.settled))
		// Before the signal: a woken worker reading the message must not
		// think it is still on its way.
		last := w.settled[n-1]
		q.insertedID.Store(uint64(last.ids[len(last.ids)-1]))
		q.applied.Store(last.seq)
	}
	q.lowerCursors(w.low) // before signal: a woken scan must see the mark
	q.mu.Unlock()
	q.report(w.quar)
	q.eventsStored(w.events.added)
	if w.wake {
		q.signal()
	}
	return nil
}

// resizeErrno gives back the errno of bbolt's failure to grow the file:
// bbolt formats it into its message ("file resize error: %s", db.go)
// instead of wrapping it, and callers tell a full disk (ENOSPC, or a
// quota or file size limit) by errors.Is.
func resizeErrno(err error) error {
	msg := err.Error()
	if !strings.Contains(msg, "file resize error: ") {
		return err
	}
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG} {
		if strings.HasSuffix(msg, errno.Error()) && !errors.Is(err, errno) {
			return fmt.Errorf("%w (%w)", err, errno)
		}
	}
	return err
}

// view runs fn in a read transaction. Keep fn short: long read
// transactions stop bbolt from reusing freed pages, so the file grows.
func (q *Queue) view(fn func(tx *bolt.Tx) error) error {
	err := q.guard(func() error { return q.db.View(fn) })
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

func (q *Queue) report(qs []quarantined) {
	if q.opt.OnQuarantine == nil {
		return
	}
	for _, x := range qs {
		q.opt.OnQuarantine(x.bucket, x.key, x.err)
	}
}

// fixup repairs problems found by readers. Errors are ignored: the problem
// stays and the next reader finds it again.
func (q *Queue) fixup(ps []problem) {
	if len(ps) == 0 {
		return
	}
	_ = q.update(func(w *wtx) error {
		for _, p := range ps {
			if err := w.fix(p); err != nil {
				return err
			}
		}
		return nil
	})
}

// envelope is the message record of m under id, without its body's
// checksum: the one place a new message's fields are copied, so the record
// inserted and the copy a fresh attempt starts from (offerFresh) cannot
// differ (a REQUIRETLS flag lost on either would send the message without
// its TLS requirement).
func (m *NewMessage) envelope(id ID, size int64) Message {
	return Message{ID: id, From: m.From, Arrival: m.Arrival, Size: size,
		ClientAddr: m.ClientAddr, AuthUser: m.AuthUser, Helo: m.Helo, RET: m.RET,
		EnvID: m.EnvID, SMTPUTF8: m.SMTPUTF8, EightBit: m.EightBit, DSN: m.DSN,
		RequireTLS: m.RequireTLS, TLSOptional: m.TLSOptional, Tag: m.Tag, MessageID: m.MessageID}
}
