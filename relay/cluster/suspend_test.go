package cluster

import (
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/queue"
)

// TestShareSuspensions: a suspension one node puts is read by another, as
// put; a delete removes it for all; with Redis down every call says so
// instead of answering with nothing (which would read as "resumed").
func TestShareSuspensions(t *testing.T) {
	for name, addrs := range redisTargets(t) {
		t.Run(name, func(t *testing.T) {
			a, b := newNode(t, "a", addrs...), newNode(t, "b", addrs...)
			if got, ok := b.Suspensions(); !ok || len(got) != 0 {
				t.Fatalf("before any suspension: %+v, %v", got, ok)
			}
			now := time.Now().UTC().Truncate(time.Second)
			s := queue.Suspension{Domain: "dest.test", Reason: "migration", Since: now, Until: now.Add(time.Hour), Node: "a"}
			if !a.PutSuspension(s) || !a.PutSuspension(queue.Suspension{Domain: "other.test", Since: now}) {
				t.Fatal("PutSuspension failed with Redis up")
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
			if !b.DeleteSuspension("dest.test") {
				t.Fatal("DeleteSuspension failed with Redis up")
			}
			if got, _ := a.Suspensions(); len(got) != 1 || got[0].Domain != "other.test" {
				t.Errorf("after the delete: %+v", got)
			}
		})
	}
}

func TestSuspensionsRedisDown(t *testing.T) {
	peers.Require(t, "redis-server")
	r := peers.StartRedis(t, "")
	c := newNode(t, "a", r.Addr)
	r.Kill()
	if _, ok := c.Suspensions(); ok {
		t.Error("Suspensions answered with Redis down")
	}
	if c.PutSuspension(queue.Suspension{Domain: "dest.test"}) || c.DeleteSuspension("dest.test") {
		t.Error("a write reported success with Redis down")
	}
}
