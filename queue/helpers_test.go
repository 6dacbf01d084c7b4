package queue

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func dbPath(t testing.TB) string { return filepath.Join(t.TempDir(), "q", "queue.db") }

func openAt(t testing.TB, path string, opt Options) *Queue {
	t.Helper()
	if opt.LockTimeout == 0 {
		opt.LockTimeout = 200 * time.Millisecond
	}
	q, err := Open(path, opt)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func newQ(t testing.TB) (*Queue, string) {
	p := dbPath(t)
	return openAt(t, p, Options{}), p
}

// msg builds a NewMessage to addrs, arriving (and due) at t0.
func msg(from string, addrs ...string) NewMessage {
	m := NewMessage{From: from, Arrival: t0, Body: []byte("Subject: hi\r\n\r\nbody " + strings.Join(addrs, ",") + "\r\n")}
	for _, a := range addrs {
		m.To = append(m.To, NewRecipient{Addr: a, Domain: a[strings.LastIndexByte(a, '@')+1:]})
	}
	return m
}

func mustEnqueue(t testing.TB, q *Queue, m NewMessage) ID {
	t.Helper()
	id, err := q.Enqueue(m)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return id
}

func mustShow(t testing.TB, q *Queue, id ID) Message {
	t.Helper()
	m, err := q.Show(id)
	if err != nil {
		t.Fatalf("Show(%s): %v", id, err)
	}
	return m
}

func rcptOf(t testing.TB, q *Queue, k Key) Recipient {
	t.Helper()
	for _, r := range mustShow(t, q, k.ID).Recipients {
		if r.Key == k {
			return r
		}
	}
	t.Fatalf("recipient %s not found", k)
	return Recipient{}
}

func keysOf(rs []Recipient) []Key {
	var ks []Key
	for _, r := range rs {
		ks = append(ks, r.Key)
	}
	return ks
}

// fullScan recomputes what Stats keeps in memory and checks the due-index
// invariant: exactly one entry, at NextAttempt, per Queued/Deferred/Active
// recipient, and no other entries.
func fullScan(t testing.TB, q *Queue) counts {
	t.Helper()
	if err := q.settle(); err != nil { // journaled messages in the database first
		t.Fatal(err)
	}
	c := newCounts()
	err := q.db.View(func(tx *bolt.Tx) error {
		c.msgs = tx.Bucket(bMsgs).Stats().KeyN
		want := map[string]string{}
		cur := tx.Bucket(bRcpts).Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			key, _ := parseRcptKey(k)
			r, err := decodeRecipient(key, v)
			if err != nil {
				return fmt.Errorf("rcpt %x: %w", k, err)
			}
			if tx.Bucket(bMsgs).Get(idKey(key.ID)) == nil {
				return fmt.Errorf("orphan recipient %s", key)
			}
			c.rcpt(&r, +1)
			if dk := expectedDueKey(&r); dk != nil {
				want[string(dk)] = string(dueValue(&r))
			}
		}
		got := map[string]string{}
		cur = tx.Bucket(bDue).Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			got[string(k)] = string(v)
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("due index has %d entries, want %d (%v vs %v)", len(got), len(want), got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("full scan: %v", err)
	}
	for k, v := range c.byStatus {
		if v == 0 {
			delete(c.byStatus, k)
		}
	}
	for k, v := range c.byReason {
		if v == 0 {
			delete(c.byReason, k)
		}
	}
	return c
}

func checkStats(t testing.TB, q *Queue) {
	t.Helper()
	c := fullScan(t, q)
	want := c.stats()
	got, err := q.Stats()
	if err != nil {
		t.Fatal(err)
	}
	got.Oldest = time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Stats = %+v\nfull scan = %+v", got, want)
	}
}
