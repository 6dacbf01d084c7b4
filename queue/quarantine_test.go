package queue

import (
	"bytes"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// poke writes raw bytes into a closed queue file, as bit rot or a bug would.
func poke(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

type report struct {
	bucket string
	key    []byte
}

func TestCorruptRecordsAreQuarantined(t *testing.T) {
	garbage := []byte("\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xffgarbage")
	for _, tc := range []struct {
		name string
		poke func(tx *bolt.Tx, a, b ID) error
	}{
		{
			name: "recipient record",
			poke: func(tx *bolt.Tx, a, b ID) error { return tx.Bucket(bRcpts).Put(rcptKey(Key{a, 0}), garbage) },
		},
		{
			name: "message record",
			poke: func(tx *bolt.Tx, a, b ID) error { return tx.Bucket(bMsgs).Put(idKey(a), []byte{9}) },
		},
		{
			name: "history record",
			poke: func(tx *bolt.Tx, a, b ID) error { return tx.Bucket(bHist).Put(rcptKey(Key{b, 0}), garbage) },
		},
		{
			name: "destination record",
			poke: func(tx *bolt.Tx, a, b ID) error { return tx.Bucket(bDests).Put([]byte("a.test"), garbage) },
		},
		{
			name: "missing body",
			poke: func(tx *bolt.Tx, a, b ID) error { return tx.Bucket(bBodies).Delete(idKey(a)) },
		},
		{
			name: "orphan recipient",
			poke: func(tx *bolt.Tx, a, b ID) error {
				return tx.Bucket(bRcpts).Put(rcptKey(Key{b + 100, 0}), tx.Bucket(bRcpts).Get(rcptKey(Key{b, 0})))
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := dbPath(t)
			q := openAt(t, path, Options{})
			a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test"))
			b := mustEnqueue(t, q, msg("s@x.test", "r3@a.test"))
			begin(t, q, t0, Key{b, 0}) // gives b a history record
			apply(t, q, Update{Results: []Result{{Key: Key{b, 0}, Status: Deferred, End: t0, NextAttempt: t0}},
				Destinations: []Destination{{Domain: "a.test"}}})
			q.Close()
			poke(t, path, func(tx *bolt.Tx) error { return tc.poke(tx, a, b) })

			var mu sync.Mutex
			var got []report
			q = openAt(t, path, Options{OnQuarantine: func(bucket string, key []byte, err error) {
				mu.Lock()
				defer mu.Unlock()
				if !errors.Is(err, errCorrupt) {
					t.Errorf("quarantine error %v does not wrap errCorrupt", err)
				}
				got = append(got, report{bucket, key})
			}})
			mu.Lock()
			n := len(got)
			mu.Unlock()
			if n == 0 {
				t.Fatal("nothing quarantined")
			}
			// The rest keeps working: every remaining live recipient can be
			// delivered, and its message then disappears.
			checkStats(t, q)
			rs, err := q.Due(t0, 0)
			if err != nil || len(rs) == 0 {
				t.Fatalf("Due = %v, %v", keysOf(rs), err)
			}
			var res []Result
			for _, r := range rs {
				if _, err := q.Body(r.Key.ID); err != nil {
					t.Errorf("due recipient %s has no body: %v", r.Key, err)
				}
				begin(t, q, t0, r.Key)
				res = append(res, Result{Key: r.Key, Status: Delivered, End: t0})
			}
			apply(t, q, Update{Results: res})
			if st, _ := q.Stats(); st.Messages != 0 || st.Recipients != 0 {
				t.Errorf("after delivering the rest: %+v", st)
			}
			checkStats(t, q)
			if _, _, err := q.Destination("a.test"); err != nil {
				t.Errorf("Destination: %v", err)
			}
			assertQuarantined(t, q, got)
		})
	}
}

// assertQuarantined checks that every reported record is in the quarantine
// bucket and nowhere else.
func assertQuarantined(t *testing.T, q *Queue, reps []report) {
	t.Helper()
	err := q.db.View(func(tx *bolt.Tx) error {
		for _, r := range reps {
			qb := tx.Bucket(bQuarantine).Bucket([]byte(r.bucket))
			if qb == nil || qb.Get(r.key) == nil {
				t.Errorf("%s/%x not in quarantine", r.bucket, r.key)
			}
			if tx.Bucket([]byte(r.bucket)).Get(r.key) != nil {
				t.Errorf("%s/%x still in its bucket", r.bucket, r.key)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGarbageRecipientReportedOnce(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test"))
	q.Close()
	garbage := []byte("not a record at all")
	poke(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bRcpts).Put(rcptKey(Key{a, 0}), garbage) })
	var got []report
	q = openAt(t, path, Options{OnQuarantine: func(b string, k []byte, err error) { got = append(got, report{b, k}) }})
	if want := []report{{"rcpts", rcptKey(Key{a, 0})}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("reports = %+v, want %+v", got, want)
	}
	q.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bQuarantine).Bucket(bRcpts).Get(rcptKey(Key{a, 0})); !bytes.Equal(v, garbage) {
			t.Errorf("quarantined bytes = %q", v)
		}
		return nil
	})
	// Open also dropped the due entry of the quarantined recipient.
	if rs, _ := q.Due(t0, 0); !reflect.DeepEqual(keysOf(rs), []Key{{a, 1}}) {
		t.Errorf("Due = %v", keysOf(rs))
	}
	checkStats(t, q)
	q.Close()
	got = nil
	openAt(t, path, Options{OnQuarantine: func(b string, k []byte, err error) { got = append(got, report{b, k}) }})
	if len(got) != 0 {
		t.Errorf("reopen reported again: %+v", got)
	}
}
