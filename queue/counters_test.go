package queue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// rot writes raw bytes into a closed queue file the way bit rot would: the
// stored counters still look valid afterwards (their transaction id is
// moved along), so Open trusts them and does not scan.
func rot(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	poke(t, path, func(tx *bolt.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		return tx.Bucket(bCounts).Put([]byte(countTxid), txidValue(tx.ID()))
	})
}

// storedCounts reads the counters of a closed queue file as Open would.
func storedCounts(t *testing.T, path string) (counts, bool) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var c counts
	var ok bool
	db.View(func(tx *bolt.Tx) error {
		c, ok = loadCounts(tx.Bucket(bCounts), tx.ID())
		return nil
	})
	return c, ok
}

// quarantineLog collects OnQuarantine reports.
type quarantineLog struct {
	mu   sync.Mutex
	reps []report
}

func (l *quarantineLog) opt() Options {
	return Options{OnQuarantine: func(b string, k []byte, err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.reps = append(l.reps, report{b, k})
	}}
}

func (l *quarantineLog) take() []report {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.reps
	l.reps = nil
	return r
}

// sameCounts fails unless the queue's counters equal a recount of the
// records that decode (unlike fullScan, it allows stale due entries, which
// readers drop when they reach them).
func sameCounts(t *testing.T, q *Queue, when string) {
	t.Helper()
	if err := q.settle(); err != nil { // journaled messages in the database, and counted
		t.Fatal(err)
	}
	want := newCounts()
	q.db.View(func(tx *bolt.Tx) error {
		cur := tx.Bucket(bMsgs).Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			if _, err := decodeMessage(ID(binary.BigEndian.Uint64(k)), v); err == nil {
				want.msgs++
			}
		}
		cur = tx.Bucket(bRcpts).Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			key, _ := parseRcptKey(k)
			if r, err := decodeRecipient(key, v); err == nil {
				want.rcpt(&r, +1)
			}
		}
		return nil
	})
	q.mu.Lock()
	got := q.counts.stats()
	q.mu.Unlock()
	if w := want.stats(); !reflect.DeepEqual(got, w) {
		t.Fatalf("%s: counters %+v, recount %+v", when, got, w)
	}
}

func TestCountersAfterReopenEqualRecount(t *testing.T) {
	type ops func(t *testing.T, q *Queue, a, b ID)
	deferred := func(k Key, reason string) Result {
		return Result{Key: k, Status: Deferred, Reason: reason, End: t0, NextAttempt: t0.Add(time.Hour)}
	}
	for _, tc := range []struct {
		name string
		ops  ops
	}{
		{"enqueue only", func(t *testing.T, q *Queue, a, b ID) {}},
		{"begin leaves active", func(t *testing.T, q *Queue, a, b ID) { begin(t, q, t0, Key{a, 0}, Key{b, 0}) }},
		{"apply deferred", func(t *testing.T, q *Queue, a, b ID) {
			begin(t, q, t0, Key{a, 0}, Key{a, 1})
			apply(t, q, Update{Results: []Result{deferred(Key{a, 0}, "greylisted"), deferred(Key{a, 1}, "timeout")}})
		}},
		{"apply final with DSN", func(t *testing.T, q *Queue, a, b ID) {
			begin(t, q, t0, Key{a, 0}, Key{b, 0})
			apply(t, q, Update{Results: []Result{{Key: Key{a, 0}, Status: Delivered, End: t0},
				{Key: Key{b, 0}, Status: Failed, Reason: "refused", End: t0}}, DSNs: []NewMessage{msg("", "s@x.test")}})
		}},
		{"hold, apply deferred, release", func(t *testing.T, q *Queue, a, b ID) {
			begin(t, q, t0, Key{a, 0})
			if _, err := q.Hold(Selector{Domain: "a.test"}); err != nil {
				t.Fatal(err)
			}
			apply(t, q, Update{Results: []Result{deferred(Key{a, 0}, "greylisted")}})
			if _, err := q.Release(Selector{ID: a}, t0); err != nil {
				t.Fatal(err)
			}
		}},
		{"retry", func(t *testing.T, q *Queue, a, b ID) {
			begin(t, q, t0, Key{b, 0})
			apply(t, q, Update{Results: []Result{deferred(Key{b, 0}, "timeout")}})
			if _, err := q.Retry(Selector{All: true}, t0.Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
		}},
		{"delete by domain and by id", func(t *testing.T, q *Queue, a, b ID) {
			if _, err := q.Delete(Selector{Domain: "b.test"}); err != nil {
				t.Fatal(err)
			}
			if _, err := q.Delete(Selector{ID: b}); err != nil {
				t.Fatal(err)
			}
		}},
		{"delete all", func(t *testing.T, q *Queue, a, b ID) {
			begin(t, q, t0, Key{a, 0})
			if _, err := q.Delete(Selector{All: true}); err != nil {
				t.Fatal(err)
			}
		}},
		{"recover", func(t *testing.T, q *Queue, a, b ID) {
			begin(t, q, t0, Key{a, 0}, Key{a, 1})
			apply(t, q, Update{Results: []Result{deferred(Key{a, 1}, "greylisted")}})
			if n, err := q.Recover(t0.Add(time.Minute)); n != 1 || err != nil {
				t.Fatalf("Recover = %d, %v", n, err)
			}
		}},
		{"quarantine of a damaged recipient", func(t *testing.T, q *Queue, a, b ID) {
			q.update(func(w *wtx) error { return w.b(bRcpts).Put(rcptKey(Key{a, 1}), []byte{1, 0xff}) })
			if _, err := q.Due(t0, 0); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := dbPath(t)
			q := openAt(t, path, Options{})
			a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@b.test"))
			b := mustEnqueue(t, q, msg("", "r3@a.test"))
			tc.ops(t, q, a, b)
			sameCounts(t, q, "before reopen")
			before, _ := q.Stats()
			q.Close()
			if _, ok := storedCounts(t, path); !ok {
				t.Fatal("stored counters not valid after a clean close")
			}
			var ql quarantineLog
			q = openAt(t, path, ql.opt())
			sameCounts(t, q, "after reopen")
			if after, _ := q.Stats(); !reflect.DeepEqual(before, after) {
				t.Errorf("Stats after reopen %+v, before %+v", after, before)
			}
			if reps := ql.take(); len(reps) != 0 {
				t.Errorf("reopen quarantined %v", reps)
			}
		})
	}
}

// TestOpenFallsBackToFullScan covers databases whose stored counters
// cannot be trusted: Open counts again, and stores counters that the next
// Open trusts.
func TestOpenFallsBackToFullScan(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other bool // written by other software: the stored txid is not moved along
		poke  func(tx *bolt.Tx) error
	}{
		{"old database without counters", true, func(tx *bolt.Tx) error { return tx.DeleteBucket(bCounts) }},
		{"written by something else", true, func(tx *bolt.Tx) error {
			return tx.Bucket(bDests).Put([]byte("b.test"), encodeDestination(&Destination{Domain: "b.test"}))
		}},
		{"counter does not decode", false, func(tx *bolt.Tx) error {
			return tx.Bucket(bCounts).Put([]byte(countRcpts), []byte{7})
		}},
		{"unknown counter", false, func(tx *bolt.Tx) error {
			return tx.Bucket(bCounts).Put([]byte("status/lost"), encodeCount(1))
		}},
		{"counters do not add up", false, func(tx *bolt.Tx) error {
			return tx.Bucket(bCounts).Put([]byte(countRcpts), encodeCount(99))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := dbPath(t)
			q := openAt(t, path, Options{})
			mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@b.test"))
			begin(t, q, t0, Key{1, 0})
			apply(t, q, Update{Results: []Result{{Key: Key{1, 0}, Status: Deferred, Reason: "greylisted", End: t0}}})
			q.Close()
			if tc.other {
				poke(t, path, tc.poke)
			} else {
				rot(t, path, tc.poke) // the stamp is valid: Open must notice the rest
			}
			if _, ok := storedCounts(t, path); ok {
				t.Fatal("damaged counters read as valid")
			}
			q = openAt(t, path, Options{})
			sameCounts(t, q, "after fallback")
			q.Close()
			c, ok := storedCounts(t, path)
			if !ok {
				t.Fatal("fallback did not store valid counters")
			}
			q = openAt(t, path, Options{})
			if got := q.counts.stats(); !reflect.DeepEqual(got, c.stats()) {
				t.Errorf("in memory %+v, stored %+v", got, c.stats())
			}
			sameCounts(t, q, "second open")
		})
	}
}

// TestDamageFoundWhenRead covers bit rot that Open does not look for: the
// damaged record is quarantined when a read path reaches it, and the
// counters stay equal to a recount.
func TestDamageFoundWhenRead(t *testing.T) {
	garbage := []byte("\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xffgarbage")
	for _, tc := range []struct {
		name   string
		poke   func(tx *bolt.Tx, a, b ID) error
		read   func(q *Queue, a, b ID) error
		bucket string
	}{
		{"recipient, by Due", func(tx *bolt.Tx, a, b ID) error {
			return tx.Bucket(bRcpts).Put(rcptKey(Key{a, 0}), garbage)
		}, func(q *Queue, a, b ID) error { _, err := q.Due(t0, 0); return err }, "rcpts"},
		{"recipient, by Begin", func(tx *bolt.Tx, a, b ID) error {
			return tx.Bucket(bRcpts).Put(rcptKey(Key{a, 0}), garbage)
		}, func(q *Queue, a, b ID) error {
			if err := q.Begin(Start{Keys: []Key{{a, 0}}, Time: t0, LeaseUntil: t0.Add(time.Hour)}); !errors.Is(err, ErrNotFound) {
				return err
			}
			return nil
		}, "rcpts"},
		{"message, by List", func(tx *bolt.Tx, a, b ID) error {
			return tx.Bucket(bMsgs).Put(idKey(a), []byte{9})
		}, func(q *Queue, a, b ID) error { _, _, err := q.List(Filter{}); return err }, "msgs"},
		{"message, by Message", func(tx *bolt.Tx, a, b ID) error {
			return tx.Bucket(bMsgs).Put(idKey(a), []byte{9})
		}, func(q *Queue, a, b ID) error { q.Message(a); return nil }, "msgs"},
		{"missing body, by Body", func(tx *bolt.Tx, a, b ID) error {
			return tx.Bucket(bBodies).Delete(idKey(a))
		}, func(q *Queue, a, b ID) error {
			if _, err := q.Body(a); !errors.Is(err, ErrNotFound) {
				return err
			}
			return nil
		}, "msgs"},
		{"orphan recipient, by List", func(tx *bolt.Tx, a, b ID) error {
			return tx.Bucket(bMsgs).Delete(idKey(b))
		}, func(q *Queue, a, b ID) error { _, _, err := q.List(Filter{}); return err }, "rcpts"},
		{"history, by Show", func(tx *bolt.Tx, a, b ID) error {
			return tx.Bucket(bHist).Put(rcptKey(Key{b, 0}), garbage)
		}, func(q *Queue, a, b ID) error { _, err := q.Show(b); return err }, "hist"},
		{"destination, by Destinations", func(tx *bolt.Tx, a, b ID) error {
			return tx.Bucket(bDests).Put([]byte("a.test"), garbage)
		}, func(q *Queue, a, b ID) error { _, err := q.Destinations(); return err }, "dests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := dbPath(t)
			q := openAt(t, path, Options{})
			a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test"))
			b := mustEnqueue(t, q, msg("s@x.test", "r3@a.test"))
			begin(t, q, t0, Key{b, 0})
			apply(t, q, Update{Results: []Result{{Key: Key{b, 0}, Status: Deferred, Reason: "timeout", End: t0, NextAttempt: t0}},
				Destinations: []Destination{{Domain: "a.test"}}})
			q.Close()
			rot(t, path, func(tx *bolt.Tx) error { return tc.poke(tx, a, b) })
			var ql quarantineLog
			q = openAt(t, path, ql.opt())
			if reps := ql.take(); len(reps) != 0 {
				t.Fatalf("Open scanned: quarantined %v", reps)
			}
			if err := tc.read(q, a, b); err != nil {
				t.Fatalf("read: %v", err)
			}
			reps := ql.take()
			found := false
			for _, r := range reps {
				found = found || r.bucket == tc.bucket
			}
			if !found {
				t.Fatalf("quarantined %v, want a record of %s", reps, tc.bucket)
			}
			assertQuarantined(t, q, reps)
			sameCounts(t, q, "after the repair")
			q.Close()
			if _, ok := storedCounts(t, path); !ok {
				t.Error("stored counters not valid after the repair")
			}
		})
	}
}

func TestFullScanOption(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test"))
	q.Close()
	rot(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bRcpts).Put(rcptKey(Key{a, 1}), []byte("rot")) })
	var ql quarantineLog
	opt := ql.opt()
	opt.FullScan = true
	q = openAt(t, path, opt)
	if want := []report{{"rcpts", rcptKey(Key{a, 1})}}; !reflect.DeepEqual(ql.take(), want) {
		t.Errorf("FullScan did not quarantine the damaged recipient")
	}
	sameCounts(t, q, "after FullScan")
	if st, _ := q.Stats(); st.Recipients != 1 {
		t.Errorf("Stats after FullScan: %+v", st)
	}
}

// TestDamagedDueValueRewritten: a due entry whose value lost its flag is
// put right when Due reaches it.
func TestDamagedDueValueRewritten(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test"))
	q.Close()
	dk := dueKey(t0, Key{a, 0})
	rot(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bDue).Put(dk, []byte("?")) })
	q = openAt(t, path, Options{})
	q.Due(t0, 0) // finds and repairs it
	rs, err := q.Due(t0, 0)
	if err != nil || !reflect.DeepEqual(keysOf(rs), []Key{{a, 0}}) {
		t.Fatalf("Due after repair = %v, %v", keysOf(rs), err)
	}
	q.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bDue).Get(dk); !bytes.Equal(v, []byte("da.test")) {
			t.Errorf("due value %q", v)
		}
		return nil
	})
}

// TestRecoverAfterReopen: Recover relies on the stored count of Active
// recipients, so an attempt in flight at a stop is recovered after a
// reopen that did not scan, and a second Recover finds nothing.
func TestRecoverAfterReopen(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test"))
	begin(t, q, t0, Key{a, 0})
	q.Close()
	q = openAt(t, path, Options{})
	if st, _ := q.Stats(); st.ByStatus[Active] != 1 {
		t.Fatalf("Stats after reopen: %+v", st)
	}
	if n, err := q.Recover(t0); n != 1 || err != nil {
		t.Fatalf("Recover = %d, %v", n, err)
	}
	if n, err := q.Recover(t0); n != 0 || err != nil {
		t.Fatalf("second Recover = %d, %v", n, err)
	}
	if r := rcptOf(t, q, Key{a, 0}); r.Status != Deferred {
		t.Errorf("recovered recipient is %s", r.Status)
	}
	sameCounts(t, q, "after recover")
}

// TestHistoryFollowsItsRecipient: a history is stored against its
// recipient record, so a change to the fields it refers to, even one made
// without editing the history, must leave the history as it was.
func TestHistoryFollowsItsRecipient(t *testing.T) {
	q, _ := newQ(t)
	a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test"))
	k := Key{a, 0}
	if err := q.Begin(Start{Keys: []Key{k}, Time: t0, SourceIP: "192.0.2.1", MXHost: "mx.a.test",
		MXAddr: "192.0.2.2", LeaseUntil: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	apply(t, q, Update{Results: []Result{{Key: k, Status: Deferred, Reason: "greylisted", Stage: "rcpt",
		Reply: Reply{451, "4.7.1", "later"}, End: t0.Add(time.Second), NextAttempt: t0.Add(time.Hour)}}})
	want := rcptOf(t, q, k).History
	if len(want) != 1 || want[0].MXHost != "mx.a.test" || want[0].Reply.Text != "later" {
		t.Fatalf("history %+v", want)
	}
	err := q.update(func(w *wtx) error {
		r, _ := w.getRcpt(k)
		before := r
		r.SourceIP, r.MXHost, r.MXAddr, r.Reason = "198.51.100.1", "mx2.a.test", "198.51.100.2", "timeout"
		r.Reply, r.LastAttempt = Reply{421, "4.4.2", "gone"}, t0.Add(time.Minute)
		return w.putRcpt(&before, &r)
	})
	if err != nil {
		t.Fatal(err)
	}
	got := rcptOf(t, q, k)
	if !reflect.DeepEqual(got.History, want) {
		t.Errorf("history after the recipient changed:\n%+v\nwant\n%+v", got.History, want)
	}
	if got.MXHost != "mx2.a.test" {
		t.Errorf("recipient not changed: %+v", got)
	}
}
