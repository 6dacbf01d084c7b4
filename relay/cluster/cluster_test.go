package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/cluster/clustertest"
	"github.com/greyrelay/greyrelay/relay/config"
)

// The unit tests' nodes share an in-memory Store, so that they need no
// Redis server (the Redis store is tested against real redis-server
// instances, single and Cluster, in the integration package), and run in
// a testing/synctest bubble: lease expiries, renewals and heartbeats
// happen on the bubble's clock, at once.
var _ Store = (*clustertest.Memory)(nil)

// newNode connects a node named name to st and waits until st answers it.
//
// The store's timeout is a safety net here, not what the tests measure.
// The node's log goes to the test's, so a failure says why.
func newNode(t *testing.T, name string, st Store) *Cluster {
	t.Helper()
	c, err := New(Options{Node: Node{Name: name}, Registry: prometheus.NewRegistry(), Logger: zaptest.NewLogger(t), Store: st,
		Config: config.Cluster{Redis: config.Redis{Timeout: 5 * time.Second}, DestinationLimits: LimitsShared, LeaseTTL: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for deadline := time.Now().Add(10 * time.Second); !c.Up(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("node %s: the store never answered", name)
		}
	}
	return c
}

func TestShareRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		a, b := newNode(t, "a", st), newNode(t, "b", st)
		if _, ok := b.Load("dest.test"); ok {
			t.Fatal("a record before anyone published one")
		}
		now := time.Now().UTC().Truncate(time.Second)
		rec := queue.Destination{Domain: "Dest.Test", Greylists: true, GreylistSeen: 7, LearnedDelay: 5 * time.Minute,
			GreylistLow: 4 * time.Minute, GreylistLearned: now.Add(-time.Minute), PaceInterval: 2 * time.Second, PaceBase: time.Second, PaceRefusals: 3,
			PaceRefused:   now.Add(-2 * time.Minute),
			ThrottleLevel: 2, ThrottledUntil: now.Add(time.Minute), DeadHosts: map[string]time.Time{"192.0.2.1": now.Add(time.Hour)},
			LastReply: queue.Reply{Code: 421, Enhanced: "4.7.0", Text: "slow down"}, Updated: now}
		a.Publish(rec)
		got, ok := b.Load("dest.test")
		if !ok {
			t.Fatal("node b finds nothing after node a published")
		}
		want := rec
		want.Domain, want.GreylistSeen = "dest.test", 0 // counters stay with each node
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("loaded %+v\nwant   %+v", got, want)
		}
		// The runs of accepted messages into an opening: each node finds
		// the others' sum, not its own; a run more than runSpan older
		// than the latest (an earlier episode's) does not count.
		opening := queue.Destination{Domain: "runs.test", PaceInterval: 2 * time.Second, PaceRefusals: 1, Updated: now}
		c := newNode(t, "c", st)
		opening.PaceRun, opening.PaceRunStart = 7, now.Add(-time.Hour)
		c.Publish(opening)
		opening.PaceRun, opening.PaceRunStart = 5, now
		a.Publish(opening)
		opening.PaceRun, opening.PaceRunStart = 3, now.Add(time.Second)
		b.Publish(opening)
		if got, _ := b.Load("runs.test"); got.PaceRun != 5 {
			t.Errorf("node b finds the others' run %d, want node a's 5", got.PaceRun)
		}
		if got, _ := a.Load("runs.test"); got.PaceRun != 3 {
			t.Errorf("node a finds the others' run %d, want node b's 3", got.PaceRun)
		}
		// Once the opening has ended (a rate learned: a base), the runs
		// are neither written nor read.
		ended := opening
		ended.PaceBase, ended.PaceRefusals, ended.Updated = 3*time.Second, 0, now.Add(time.Second)
		b.Publish(ended)
		if got, _ := a.Load("runs.test"); got.PaceRun != 0 {
			t.Errorf("after the opening, node a finds the others' run %d, want 0 (not read)", got.PaceRun)
		}
		// With cluster.destination_limits local each node paces on its
		// own: the pace stays with the node that learned it.
		local, err := New(Options{Node: Node{Name: "local"}, Registry: prometheus.NewRegistry(), Logger: zaptest.NewLogger(t), Store: st,
			Config: config.Cluster{Redis: config.Redis{Timeout: 5 * time.Second}, DestinationLimits: LimitsLocal, LeaseTTL: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		defer local.Close()
		for !local.Up() {
			time.Sleep(20 * time.Millisecond)
		}
		got, _ = local.Load("dest.test")
		want.PaceInterval, want.PaceBase, want.PaceRefusals, want.PaceRefused = 0, 0, 0, time.Time{}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("with local limits, loaded %+v\nwant   %+v", got, want)
		}
	})
}

func TestLeasesBoundConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		nodes := []*Cluster{newNode(t, "a", st), newNode(t, "b", st), newNode(t, "c", st)}
		var releases []func()
		for i := range 3 {
			rel, _, ok := nodes[i].Acquire("busy.test", 2)
			if ok != (i < 2) {
				t.Fatalf("acquire %d: %v, want %v (limit 2)", i, ok, i < 2)
			}
			if ok {
				releases = append(releases, rel)
			}
		}
		if _, _, ok := nodes[2].Acquire("other.test", 2); !ok {
			t.Fatal("another domain's slots are separate")
		}
		releases[0]()
		rel, _, ok := nodes[2].Acquire("busy.test", 2)
		if !ok {
			t.Fatal("no slot after a release")
		}
		rel()
		// A node that dies keeps nothing: its leases run out (lease_ttl 1s)
		// while the live node's is renewed.
		nodes[1].stop <- struct{}{} // not a clean Close: the loop stops renewing
		<-nodes[1].done
		dead := leaseExpiry(t, st, nodes[1], "busy.test")
		if now := time.Now(); dead.After(now.Add(nodes[1].cfg.LeaseTTL)) {
			t.Fatalf("a stopped node's lease runs until %v, more than lease_ttl past %v", dead, now)
		}
		awaitTime(t, dead)
		for _, n := range []*Cluster{nodes[2], nodes[0]} {
			if _, _, ok := n.Acquire("busy.test", 2); !ok {
				t.Fatal("a stopped node's lease did not expire")
			}
		}
		// Past the expiry the live nodes' leases have now: they renew them.
		awaitTime(t, latest(leaseExpiry(t, st, nodes[2], "busy.test"), leaseExpiry(t, st, nodes[0], "busy.test")))
		if _, _, ok := nodes[2].Acquire("busy.test", 2); ok {
			t.Fatal("live nodes' leases expired although they renew them")
		}
	})
}

// leaseExpiry is when c's one lease on domain expires in st; the zero
// time when st no longer has it (an acquire dropped it as expired).
func leaseExpiry(t *testing.T, st *clustertest.Memory, c *Cluster, domain string) time.Time {
	t.Helper()
	var members []string
	c.leaseMu.Lock()
	for m, l := range c.leases {
		if l.key == domain {
			members = append(members, m)
		}
	}
	c.leaseMu.Unlock()
	if len(members) != 1 {
		t.Fatalf("node %s holds %d leases on %s, want 1", c.node.Name, len(members), domain)
	}
	return st.Leases(domain)[members[0]]
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// awaitTime waits until the clock is past at: a lease with that expiry
// has run out, unless renewed.
func awaitTime(t *testing.T, at time.Time) {
	t.Helper()
	time.Sleep(time.Until(at) + time.Millisecond)
}

// awaitSubscribers waits until n nodes subscribe to released slots.
func awaitSubscribers(t *testing.T, st *clustertest.Memory, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); st.Subscribers() < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscribers, want %d", st.Subscribers(), n)
		}
	}
}

func TestStoreDownGrantsAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		c := newNode(t, "a", st)
		if !c.Up() || testutil.ToFloat64(c.m.up) != 1 {
			t.Fatal("not up at start")
		}
		st.SetDown(true)
		// The first call to fail marks Redis down; later ones answer at once.
		c.Publish(queue.Destination{Domain: "dest.test", Updated: time.Now()})
		if c.Up() || testutil.ToFloat64(c.m.up) != 0 {
			t.Fatal("still up after the store went down")
		}
		for range 3 {
			if _, _, ok := c.Acquire("dest.test", 1); !ok {
				t.Fatal("no slot granted with the store down: local limits must take over")
			}
		}
		if _, ok := c.Load("dest.test"); ok {
			t.Fatal("a record with the store down")
		}
		if _, ok := c.Pace("dest.test", time.Second, time.Hour); ok {
			t.Fatal("a shared pace with the store down: the node must pace on its own")
		}
		st.SetDown(false)
		deadline := time.Now().Add(10 * time.Second)
		for !c.Up() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if !c.Up() {
			t.Fatal("sharing did not resume after the store came back")
		}
		var nodes []Node
		var err error
		for deadline := time.Now().Add(10 * time.Second); len(nodes) == 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			nodes, err = c.Nodes(context.Background())
		}
		if err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
			t.Errorf("registry after the store came back: %+v, %v; want node a", nodes, err)
		}
	})
}

func TestReleaseAnnouncedToWaitingNodes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		a, b := newNode(t, "a", st), newNode(t, "b", st)
		awaitSubscribers(t, st, 2) // a release before b subscribed would reach no one
		rel, _, ok := a.Acquire("Busy.Test", 1)
		if !ok {
			t.Fatal("no slot")
		}
		if _, _, ok := b.Acquire("busy.test", 1); ok {
			t.Fatal("a second slot under limit 1")
		}
		rel()
		select {
		case d := <-b.Freed():
			if d != "busy.test" {
				t.Fatalf("announced %q, want busy.test", d)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("node b heard of no released slot")
		}
		if _, _, ok := b.Acquire("busy.test", 1); !ok {
			t.Fatal("no slot after the announced release")
		}
	})
}

func TestPaceHoldsAcrossNodes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		nodes := []*Cluster{newNode(t, "a", st), newNode(t, "b", st), newNode(t, "c", st)}
		const interval = 200 * time.Millisecond
		start := time.Now()
		var starts []time.Duration
		for i := range 9 { // three rounds of the three nodes, as fast as they can ask
			wait, ok := nodes[i%3].Pace("Paced.test", interval, time.Hour)
			if !ok {
				t.Fatal("no shared pace with the store up")
			}
			starts = append(starts, time.Since(start)+wait)
		}
		slices.Sort(starts)
		for i := 1; i < len(starts); i++ {
			// The store's clock is ours here; 20 ms slack as for Redis's.
			if gap := starts[i] - starts[i-1]; gap < interval-20*time.Millisecond {
				t.Errorf("starts %d and %d %v apart, want at least %v: %v", i-1, i, gap, interval, starts)
			}
		}
		if wait, ok := nodes[0].Pace("other.test", interval, time.Hour); !ok || wait != 0 {
			t.Errorf("another domain's first start waits %v (%v), want 0", wait, ok)
		}
	})
}

// TestPaceFollowsCurrentGap: a start is reserved one gap after the last
// one, the gap being the asking node's current one. A probe of a
// throttling destination's opening is reserved with a long gap (32 s
// here); when the destination accepts it, the pace learned from that
// says 2 s, and the next start, by any node, comes 2 s after the probe.
// Before, the probe's reservation held every node back for its own 32 s
// gap: after an opening whose probes had reached half an hour (a window
// of an hour), the whole cluster waited that long with a pace of 36 s.
func TestPaceFollowsCurrentGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		a, b := newNode(t, "a", st), newNode(t, "b", st)
		if wait, ok := a.Pace("paced.test", 32*time.Second, time.Hour); !ok || wait != 0 {
			t.Fatalf("the probe waits %v (%v), want 0", wait, ok)
		}
		time.Sleep(time.Second)
		if wait, _ := b.Pace("paced.test", 2*time.Second, time.Hour); wait != time.Second {
			t.Errorf("the next start after the probe was accepted waits %v, want 1s (2s after the probe)", wait)
		}
		if wait, _ := a.Pace("paced.test", 2*time.Second, time.Hour); wait != 3*time.Second {
			t.Errorf("the start after that waits %v, want 3s (2s after the one before)", wait)
		}
		// A start further away than the caller reserves ahead is only
		// found, not reserved: the next asks from the same last start.
		if wait, _ := b.Pace("paced.test", 10*time.Second, time.Second); wait != 13*time.Second {
			t.Errorf("a start 10s after the last waits %v, want 13s", wait)
		}
		if wait, _ := a.Pace("paced.test", 2*time.Second, time.Second); wait != 5*time.Second {
			t.Errorf("after a start found but not reserved, the next waits %v, want 5s (2s after the last reserved)", wait)
		}
	})
}

// held is how many leases on domain the nodes hold between them.
func held(domain string, nodes ...*Cluster) int {
	n := 0
	for _, c := range nodes {
		c.leaseMu.Lock()
		for _, l := range c.leases {
			if l.key == domain {
				n++
			}
		}
		c.leaseMu.Unlock()
	}
	return n
}

func closed(chs []<-chan struct{}) int {
	n := 0
	for _, ch := range chs {
		select {
		case <-ch:
			n++
		default:
		}
	}
	return n
}

// TestOutageLeasesCountAgain: three nodes share a limit of 2. The store
// goes down while one lease is held, the nodes grant four more on their
// own, and the store comes back empty (a Redis without persistence). The
// nodes register again what they hold as far as the limit allows and
// take the rest back: two leases in the store, three lost channels
// closed, and the limit holds for a new connection. Before, the store
// came back with no lease at all and the five connections went on
// uncounted.
func TestOutageLeasesCountAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		nodes := []*Cluster{newNode(t, "a", st), newNode(t, "b", st), newNode(t, "c", st)}
		_, lost, ok := nodes[0].Acquire("busy.test", 2)
		if !ok {
			t.Fatal("no slot with the store up")
		}
		losts := []<-chan struct{}{lost}
		st.SetDown(true)
		for deadline := time.Now().Add(10 * time.Second); slices.ContainsFunc(nodes, (*Cluster).Up); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the nodes never noticed the store was gone")
			}
		}
		for _, i := range []int{0, 1, 1, 2} {
			_, lost, ok := nodes[i].Acquire("busy.test", 2)
			if !ok {
				t.Fatal("no slot granted with the store down: local limits must take over")
			}
			losts = append(losts, lost)
		}
		st.Flush()
		st.SetDown(false)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if slices.ContainsFunc(nodes, func(c *Cluster) bool { return !c.Up() }) {
				continue
			}
			if len(st.Leases("busy.test")) == 2 && closed(losts) == 3 && held("busy.test", nodes...) == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the store came back empty: %d leases in it, %d held, %d taken back; want 2, 2, 3",
					len(st.Leases("busy.test")), held("busy.test", nodes...), closed(losts))
			}
		}
		if _, _, ok := nodes[2].Acquire("busy.test", 2); ok {
			t.Error("a third slot under limit 2 after the leases were registered again")
		}
	})
}

// TestLostLeasesRefilled: the store loses its data (a Redis restart
// without persistence, or a failover to a replica that lagged) while two
// nodes hold the two slots of a domain. Their next renewal writes the
// leases back, so a third node still finds the limit held.
func TestLostLeasesRefilled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		nodes := []*Cluster{newNode(t, "a", st), newNode(t, "b", st), newNode(t, "c", st)}
		var losts []<-chan struct{}
		for _, c := range nodes[:2] {
			_, lost, ok := c.Acquire("busy.test", 2)
			if !ok {
				t.Fatal("no slot with the store up")
			}
			losts = append(losts, lost)
		}
		st.Flush()
		for deadline := time.Now().Add(10 * time.Second); len(st.Leases("busy.test")) != 2; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d leases in the store after the flush, want the nodes' 2 back", len(st.Leases("busy.test")))
			}
		}
		if _, _, ok := nodes[2].Acquire("busy.test", 2); ok {
			t.Error("a third slot under limit 2 after the store lost the leases")
		}
		if n := closed(losts); n != 0 {
			t.Errorf("%d leases taken back, want none: there was room for both", n)
		}
	})
}

// TestLatePublishKeepsNewerRecord: a node publishes its record once the
// commit that stores it is decided, which may come after another node
// published what it learned later. The older record must not replace
// the newer one (it did: the last writer won, and a pace another node
// had just learned was gone from the store, so no node ever loaded it).
// A newer record still replaces an older one, and the same version may
// be published again.
func TestLatePublishKeepsNewerRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		a, b, c := newNode(t, "a", st), newNode(t, "b", st), newNode(t, "c", st)
		t0 := time.Now().UTC()
		b.Publish(queue.Destination{Domain: "dest.test", PaceInterval: 400 * time.Millisecond,
			PaceBase: 400 * time.Millisecond, Updated: t0.Add(time.Second)})
		a.Publish(queue.Destination{Domain: "dest.test", LastReply: queue.Reply{Code: 250}, Updated: t0}) // late, older
		if got, _ := c.Load("dest.test"); got.PaceInterval != 400*time.Millisecond {
			t.Errorf("after a late older publish: %+v, want the newer record's pace", got)
		}
		a.Publish(queue.Destination{Domain: "dest.test", GreylistLow: time.Minute, Updated: t0.Add(2 * time.Second)})
		if got, _ := c.Load("dest.test"); got.GreylistLow != time.Minute || got.PaceInterval != 0 {
			t.Errorf("after a newer publish: %+v, want it", got)
		}
		a.Publish(queue.Destination{Domain: "dest.test", GreylistLow: 2 * time.Minute, Updated: t0.Add(2 * time.Second)})
		if got, _ := c.Load("dest.test"); got.GreylistLow != 2*time.Minute {
			t.Errorf("the same version published again: %+v, want it", got)
		}
		// A refusal that slowed the pace outranks a later record by a
		// node that had not heard of it; a record that knows it and is
		// later replaces it.
		refused := t0.Add(3 * time.Second)
		b.Publish(queue.Destination{Domain: "dest.test", PaceInterval: time.Second, PaceRefusals: 1,
			PaceRefused: refused, Updated: refused})
		a.Publish(queue.Destination{Domain: "dest.test", PaceInterval: 500 * time.Millisecond, Updated: t0.Add(4 * time.Second)})
		if got, _ := c.Load("dest.test"); got.PaceInterval != time.Second || !got.PaceRefused.Equal(refused) {
			t.Errorf("after a later publish unaware of a refusal: %+v, want the refused record", got)
		}
		a.Publish(queue.Destination{Domain: "dest.test", PaceInterval: 900 * time.Millisecond,
			PaceRefused: refused, Updated: t0.Add(5 * time.Second)})
		if got, _ := c.Load("dest.test"); got.PaceInterval != 900*time.Millisecond {
			t.Errorf("after a later publish that knew the refusal: %+v, want it", got)
		}
	})
}
