package cluster

import (
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/greyrelay/greyrelay/relay/cluster/clustertest"
	"github.com/greyrelay/greyrelay/relay/suppress"
)

// suppressNode is one node's suppression list, shared through c.
func suppressNode(t *testing.T, c *Cluster) *suppress.List {
	t.Helper()
	l, err := suppress.Open(filepath.Join(t.TempDir(), "s.db"), suppress.Options{Scope: suppress.ScopeGlobal,
		TTL: time.Hour, Shared: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func suppressed(l *suppress.List, rcpt string) bool {
	_, ok := l.Check("app@src.test", rcpt)
	return ok
}

// syncAll runs one Sync on every list, in order.
func syncAll(t *testing.T, ls ...*suppress.List) {
	t.Helper()
	for _, l := range ls {
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestShareSuppressions: a suppression, its removal and its expiry made
// on one node hold on the other; with the store down each node keeps its
// list and its changes reach the other when the store answers again; a
// store that lost everything gets the nodes' lists back, not an empty
// list taken as "every entry removed"; a node that fell behind a trimmed
// log reads the whole list.
func TestShareSuppressions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		st.SuppressionLogLen = 4
		ca, cb := newNode(t, "a", st), newNode(t, "b", st)
		a, b := suppressNode(t, ca), suppressNode(t, cb)
		syncAll(t, a, b)
		now := time.Now()
		if _, err := a.Suppress("app@src.test", "gone@dest.test", "no-such-user", "550 5.1.1 unknown", now); err != nil {
			t.Fatal(err)
		}
		syncAll(t, b)
		if !suppressed(b, "Gone@dest.test") {
			t.Fatal("node b does not refuse what node a suppressed")
		}
		if err := b.Remove("", "gone@dest.test"); err != nil {
			t.Fatal(err)
		}
		syncAll(t, a)
		if suppressed(a, "gone@dest.test") {
			t.Fatal("node a still refuses what node b removed")
		}
		// An operator's entry with its own end: it ends on both.
		if err := a.Put(suppress.Entry{Address: "short@dest.test", Reason: "operator", Since: now, Expires: now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		syncAll(t, b)
		if !suppressed(b, "short@dest.test") {
			t.Fatal("node b does not refuse node a's operator entry")
		}
		time.Sleep(time.Minute)
		if suppressed(b, "short@dest.test") || suppressed(a, "short@dest.test") {
			t.Fatal("an entry outlived its end")
		}

		// The store goes away: each list keeps working and keeps its
		// changes; they meet when it answers again.
		st.SetDown(true)
		if _, err := a.Suppress("app@src.test", "away@dest.test", "no-such-user", "550 5.1.1", time.Now()); err != nil {
			t.Fatalf("a suppression with the store down: %v", err)
		}
		syncAll(t, a, b)
		if !suppressed(a, "away@dest.test") || suppressed(b, "away@dest.test") {
			t.Fatal("with the store down: a's own entry must hold on a alone")
		}
		st.SetDown(false)
		for !ca.Up() || !cb.Up() {
			time.Sleep(100 * time.Millisecond)
		}
		syncAll(t, a, b)
		if !suppressed(b, "away@dest.test") {
			t.Fatal("a change made while the store was down never reached node b")
		}

		// The store loses everything: the lists come back from the nodes.
		st.Flush()
		syncAll(t, a, b)
		if !suppressed(a, "away@dest.test") || !suppressed(b, "away@dest.test") {
			t.Fatal("a store that lost its state emptied the nodes' lists")
		}
		if _, err := b.Suppress("app@src.test", "after@dest.test", "no-such-user", "550 5.1.1", time.Now()); err != nil {
			t.Fatal(err)
		}
		syncAll(t, a)
		if !suppressed(a, "after@dest.test") {
			t.Fatal("after the store came back empty, node a does not follow node b")
		}

		// Node b falls behind more changes than the log keeps.
		for _, r := range []string{"x1", "x2", "x3", "x4", "x5", "x6"} {
			if _, err := a.Suppress("app@src.test", r+"@dest.test", "no-such-user", "550 5.1.1", time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Remove("", "away@dest.test"); err != nil {
			t.Fatal(err)
		}
		syncAll(t, b)
		if !suppressed(b, "x1@dest.test") || !suppressed(b, "x6@dest.test") || suppressed(b, "away@dest.test") {
			t.Fatal("node b, behind a trimmed log, does not have node a's list")
		}
	})
}
