package queue

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestGroupCommitMixedOps runs Enqueue, Begin, refused Begins and Apply
// from many goroutines at once, so they share the writer's transactions.
// A refused Begin (ErrState, ErrNotFound) must fail alone and leave no
// trace; the others must commit. Counters must match a full scan, before
// and after reopening.
func TestGroupCommitMixedOps(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	const workers, per = 24, 6
	at := t0.Add(time.Minute)
	var mu sync.Mutex
	var ids []ID
	var dsns int
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				id, ok := mixedRound(t, q, at, w*per+i)
				if !ok {
					return
				}
				mu.Lock()
				ids = append(ids, id)
				if (w*per+i)%3 == 0 {
					dsns++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	check := func(q *Queue) {
		t.Helper()
		checkStats(t, q)
		for _, id := range ids {
			m := mustShow(t, q, id)
			if len(m.Recipients) != 3 || m.Recipients[0].Status != Delivered {
				t.Fatalf("message %s = %+v, want Delivered, Deferred, Queued recipients", id, m.Recipients)
			}
			if r := m.Recipients[2]; r.Status != Queued || r.Attempts != 0 || len(r.History) != 0 || !r.NextAttempt.Equal(t0) {
				t.Fatalf("recipient %s = %+v, want untouched by the refused Begins", r.Key, r)
			}
			for _, r := range m.Recipients[:2] {
				if r.Attempts != 1 || len(r.History) != 1 {
					t.Fatalf("recipient %s = %+v, want exactly one attempt", r.Key, r)
				}
			}
			if r := m.Recipients[1]; r.Status != Deferred || !r.NextAttempt.Equal(at.Add(time.Hour)) {
				t.Fatalf("recipient %s = %+v, want Deferred until %v", r.Key, r, at.Add(time.Hour))
			}
		}
		st, err := q.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if want := len(ids) + dsns; st.Messages != want {
			t.Fatalf("%d messages, want %d", st.Messages, want)
		}
	}
	check(q)
	q.Close()
	check(openAt(t, path, Options{}))
}

// mixedRound enqueues one message to three recipients, begins two, tries
// two Begins that must be refused, and applies Delivered and Deferred
// results (with a DSN every third round).
func mixedRound(t *testing.T, q *Queue, at time.Time, n int) (ID, bool) {
	id, err := q.Enqueue(msg("s@x.test", "r@a.test", "r@b.test", "r@c.test"))
	if err != nil {
		t.Errorf("Enqueue: %v", err)
		return 0, false
	}
	keys := []Key{{id, 0}, {id, 1}}
	start := Start{Keys: keys, Time: at, SourceIP: "127.0.0.2", LeaseUntil: at.Add(10 * time.Minute)}
	if err := q.Begin(start); err != nil {
		t.Errorf("Begin: %v", err)
		return 0, false
	}
	// Both refused Begins start with a valid key (r@c.test, still Queued),
	// which must stay untouched.
	again := Start{Keys: []Key{{id, 2}, {id, 0}}, Time: at, LeaseUntil: at.Add(time.Minute)}
	if err := q.Begin(again); !errors.Is(err, ErrState) {
		t.Errorf("second Begin of %s = %v, want ErrState", id, err)
	}
	missing := Start{Keys: []Key{{id, 2}, {id, 7}}, Time: at, LeaseUntil: at.Add(time.Minute)}
	if err := q.Begin(missing); !errors.Is(err, ErrNotFound) {
		t.Errorf("Begin with a missing key = %v, want ErrNotFound", err)
	}
	u := Update{Results: []Result{
		{Key: keys[0], Status: Delivered, End: at},
		{Key: keys[1], Status: Deferred, Reason: "greylisted", End: at, NextAttempt: at.Add(time.Hour)},
	}}
	if n%3 == 0 {
		u.DSNs = []NewMessage{msg("", "s@x.test")}
	}
	got, err := q.Apply(u)
	if err != nil || len(got) != len(u.DSNs) {
		t.Errorf("Apply = %v, %v; want %d DSN IDs", got, err, len(u.DSNs))
		return 0, false
	}
	return id, true
}

// TestCommitDelay checks when the writer lingers (Options.CommitDelay): not
// for a request that finds it idle, and after a commit that ended with a
// request waiting, for the delay, gathering what arrives meanwhile into the
// same transaction. The bubble's clock shows how long each reply took.
func TestCommitDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 3 * time.Millisecond
		q := openAt(t, dbPath(t), Options{CommitDelay: delay})
		txs := make([]*bolt.Tx, 4)
		entered := make(chan struct{})
		// send hands the writer request i directly, so that the test knows it
		// is waiting; block, if set, holds the writer inside its transaction.
		send := func(i int, block chan struct{}) chan error {
			reply := make(chan error, 1)
			q.reqs <- request{n: 1, reply: reply, fn: func(w *wtx) error {
				txs[i] = w.tx
				if block != nil {
					entered <- struct{}{}
					<-block
				}
				return nil
			}}
			return reply
		}
		release := make(chan struct{})
		replies := []chan error{send(0, release)}
		<-entered // the writer is in request 0's transaction, which found it idle
		replies = append(replies, send(1, nil))
		start := time.Now()
		close(release) // that commit ends with request 1 waiting: linger
		synctest.Wait()
		select {
		case err := <-replies[1]:
			t.Fatalf("request 1 answered (%v) at once: the writer did not linger after a commit that ended with a request waiting", err)
		default:
		}
		replies = append(replies, send(2, nil))
		for i, r := range replies {
			if err := <-r; err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		if d := time.Since(start); d != delay {
			t.Fatalf("lingered %v, want %v", d, delay)
		}
		if txs[0] == txs[1] || txs[1] != txs[2] {
			t.Fatalf("transactions %p %p %p, want the second shared by requests 1 and 2 only", txs[0], txs[1], txs[2])
		}
		// That commit ended with nothing waiting: the next request finds the
		// writer idle and is committed at once.
		start = time.Now()
		if err := <-send(3, nil); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("lingered %v for a request that found the writer idle", d)
		}
	})
}

// TestSettleCutsLinger checks that a settle does not wait out the writer's
// linger: the journaler settles before it rewinds the journal, and every
// session's 250 waits for the journaler meanwhile. The linger is an hour,
// so a settle that waited for it shows on the bubble's clock.
func TestSettleCutsLinger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = time.Hour
		q := openAt(t, dbPath(t), Options{CommitDelay: delay})
		entered, release := make(chan struct{}), make(chan struct{})
		block := make(chan error, 1)
		q.reqs <- request{n: 1, reply: block, fn: func(*wtx) error {
			entered <- struct{}{}
			<-release
			return nil
		}}
		<-entered
		waiting := make(chan error, 1)
		q.reqs <- request{n: 1, reply: waiting, fn: func(*wtx) error { return nil }}
		start := time.Now()
		close(release) // that commit ends with a request waiting: the writer lingers
		if err := <-block; err != nil {
			t.Fatal(err)
		}
		if _, err := q.Enqueue(msg("a@x.test", "b@y.test")); err != nil {
			t.Fatal(err)
		}
		if err := q.settle(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d >= delay {
			t.Fatalf("settle returned after %v: it waited out the linger", d)
		}
		if err := <-waiting; err != nil {
			t.Fatal(err)
		}
	})
}

// TestCommitDelayWaited checks that a caller who waits for the commit (a
// Begin, an operator's action) is not held for the whole delay, only for
// waitedLinger after it arrives, and shares the commit of what lingered.
func TestCommitDelayWaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = time.Hour
		q := openAt(t, dbPath(t), Options{CommitDelay: delay})
		entered, release := make(chan struct{}), make(chan struct{})
		txs := make([]*bolt.Tx, 3)
		first := make(chan error, 1)
		q.reqs <- request{n: 1, reply: first, fn: func(w *wtx) error {
			txs[0] = w.tx
			entered <- struct{}{}
			<-release
			return nil
		}}
		<-entered
		async := make(chan error, 1) // as from ApplyAsync: nobody waits for it
		q.reqs <- request{n: 1, reply: async, fn: func(w *wtx) error { txs[1] = w.tx; return nil }}
		close(release) // that commit ends with request 1 waiting: the writer lingers
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		start := time.Now()
		if err := q.submit(1, 0, func(w *wtx) error { txs[2] = w.tx; return nil }); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != waitedLinger {
			t.Fatalf("a waiting caller was answered after %v, want %v", d, waitedLinger)
		}
		if err := <-async; err != nil {
			t.Fatal(err)
		}
		if txs[1] != txs[2] || txs[0] == txs[1] {
			t.Fatalf("transactions %p %p %p, want the lingering request and the waiting one to share the second", txs[0], txs[1], txs[2])
		}
	})
}
