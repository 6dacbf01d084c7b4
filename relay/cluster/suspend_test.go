package cluster

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/cluster/clustertest"
)

// TestShareSuspensions: a suspension one node puts is read by another, as
// put (domain lower-cased); a delete removes it for all; with the store
// down every call says so instead of answering with nothing (which would
// read as "resumed").
func TestShareSuspensions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		a, b := newNode(t, "a", st), newNode(t, "b", st)
		if got, ok := b.Suspensions(); !ok || len(got) != 0 {
			t.Fatalf("before any suspension: %+v, %v", got, ok)
		}
		now := time.Now().UTC().Truncate(time.Second)
		s := queue.Suspension{Domain: "dest.test", Reason: "migration", Since: now, Until: now.Add(time.Hour), Node: "a"}
		if !a.PutSuspension(s) || !a.PutSuspension(queue.Suspension{Domain: "Other.Test", Since: now}) {
			t.Fatal("PutSuspension failed with the store up")
		}
		got, ok := b.Suspensions()
		if !ok || len(got) != 2 {
			t.Fatalf("node b reads %+v, %v; want both suspensions", got, ok)
		}
		for _, g := range got {
			if g.Domain == "dest.test" && (g.Reason != s.Reason || !g.Since.Equal(s.Since) || !g.Until.Equal(s.Until) || g.Node != "a") {
				t.Errorf("read %+v, want %+v", g, s)
			}
		}
		if !b.DeleteSuspension("DEST.test") {
			t.Fatal("DeleteSuspension failed with the store up")
		}
		if got, _ := a.Suspensions(); len(got) != 1 || got[0].Domain != "other.test" {
			t.Errorf("after the delete: %+v", got)
		}

		st.SetDown(true)
		if _, ok := a.Suspensions(); ok {
			t.Error("Suspensions answered with the store down")
		}
		if a.PutSuspension(s) || a.DeleteSuspension("other.test") {
			t.Error("a write reported success with the store down")
		}
	})
}
