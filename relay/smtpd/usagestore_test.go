package smtpd

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
)

// mapKV is a KV in memory that can fail, as a full disk or a store away.
type mapKV struct {
	mu   sync.Mutex
	m    map[string][]byte
	down bool
}

func (k *mapKV) Get(key string) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.down {
		return nil, errors.New("down")
	}
	return k.m[key], nil
}

func (k *mapKV) Put(key string, v []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.down {
		return errors.New("down")
	}
	k.m[key] = v
	return nil
}

// TestUsageStoreSharesCounts: two nodes (two quotas on one store) share an
// identity's hourly quota once their counts were exchanged; a node
// started again on the store finds the counts; with the store failing a
// node goes on counting on its own and hands its counts over when it
// answers again; counts older than a day are forgotten.
func TestUsageStoreSharesCounts(t *testing.T) {
	kv := &mapKV{m: map[string][]byte{}}
	st := NewStoredUsage(kv)
	lim := config.UserLimits{MessagesPerHour: 4}
	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	a, b := newUserQuota(lim, st), newUserQuota(lim, st)
	send := func(q *userQuota, n int) {
		for range n {
			if over := q.overMessages("app", now); over != "" {
				t.Fatalf("refused early: %s", over)
			}
			q.add("app", 1, now)
		}
	}
	send(a, 2)
	a.syncAll(now)
	send(b, 2)
	if over := b.overMessages("app", now); over != "4 messages per hour" {
		t.Fatalf("node b after 2+2 messages: %q, want the hourly limit", over)
	}
	b.syncAll(now)
	a.syncAll(now)
	if over := a.overMessages("app", now); over == "" {
		t.Fatal("node a does not see node b's messages after an exchange")
	}

	// A restart: a new quota on the same store.
	c := newUserQuota(lim, st)
	if over := c.overMessages("app", now); over == "" {
		t.Fatal("a restarted node forgot the counts")
	}

	// The store fails: node d counts on its own, then hands over.
	kv.mu.Lock()
	kv.m, kv.down = map[string][]byte{}, true
	kv.mu.Unlock()
	d := newUserQuota(lim, st)
	send(d, 4)
	if over := d.overMessages("app", now); over == "" {
		t.Fatal("with the store away, node d's own counts do not hold")
	}
	d.syncAll(now)
	kv.mu.Lock()
	kv.down = false
	kv.mu.Unlock()
	d.syncAll(now)
	e := newUserQuota(lim, st)
	if mh, _, _, _ := sumsOf(e, "app", now); mh != 4 {
		t.Fatalf("after the store came back: %d messages stored, want node d's 4", mh)
	}

	// A day later the counts are gone.
	later := now.Add(25 * time.Hour)
	e.syncAll(later)
	if _, md, _, _ := sumsOf(newUserQuota(lim, st), "app", later); md != 0 {
		t.Errorf("a day later: %d messages counted", md)
	}
}

// sumsOf reads q's counts for id as a check would, the store's first.
func sumsOf(q *userQuota, id string, now time.Time) (mh, md, rh, rd int) {
	q.first(id, now)
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.sums(id, now)
}
