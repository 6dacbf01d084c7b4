package cluster

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
)

// newNode connects a node named name to the Redis servers at addrs and
// waits until Redis answers it.
//
// The Redis timeout is a safety net here, not what the tests measure:
// the default's 500 ms ran out on a loaded machine (the race detector,
// every package's tests at once on 2 cores), a call failed, and the node
// went on without Redis, as it should, dropping what the test shares.
// The node's log goes to the test's, so such a failure says why.
func newNode(t *testing.T, name string, addrs ...string) *Cluster {
	t.Helper()
	c, err := New(Options{Node: Node{Name: name}, Registry: prometheus.NewRegistry(), Logger: zaptest.NewLogger(t), Config: config.Cluster{
		Redis:             config.Redis{Addresses: addrs, Timeout: 5 * time.Second},
		DestinationLimits: LimitsShared, LeaseTTL: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for deadline := time.Now().Add(10 * time.Second); !c.Up(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("node %s: Redis at %v never answered", name, addrs)
		}
	}
	return c
}

// redisTargets runs each test against a single redis-server and against a
// 3-master Redis Cluster made with redis-cli --cluster create.
func redisTargets(t *testing.T) map[string][]string {
	t.Helper()
	peers.Require(t, "redis-server", "redis-cli")
	return map[string][]string{"single": {peers.StartRedis(t, "").Addr}, "cluster": startRedisCluster(t)}
}

func startRedisCluster(t *testing.T) []string {
	t.Helper()
	var addrs []string
	for range 3 {
		// peers waits until each server answers PING, or fails with its
		// log if it exits: under load a server was not listening yet
		// when the create loop below gave up ("Connection refused").
		r := peers.StartRedisWith(t, "", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		addrs = append(addrs, r.Addr)
	}
	var out []byte
	var err error
	for range 50 { // a safety net: every server answers by now
		args := append([]string{"--cluster", "create"}, addrs...)
		out, err = exec.Command("redis-cli", append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
		if err == nil && strings.Contains(string(out), "All 16384 slots covered") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Every server, not only the first: one that has not yet heard that
	// the slots are covered answers CLUSTERDOWN for its own keys.
	for _, addr := range addrs {
		ok := false
		for range 100 {
			o, _ := exec.Command("redis-cli", "-p", strings.Split(addr, ":")[1], "cluster", "info").Output()
			if ok = strings.Contains(string(o), "cluster_state:ok"); ok {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !ok {
			t.Fatalf("Redis Cluster server %s never reached cluster_state:ok", addr)
		}
	}
	return addrs
}

func TestShareRecord(t *testing.T) {
	for name, addrs := range redisTargets(t) {
		t.Run(name, func(t *testing.T) {
			a, b := newNode(t, "a", addrs...), newNode(t, "b", addrs...)
			if _, ok := b.Load("dest.test"); ok {
				t.Fatal("a record before anyone published one")
			}
			now := time.Now().UTC().Truncate(time.Second)
			rec := queue.Destination{Domain: "Dest.Test", Greylists: true, GreylistSeen: 7, LearnedDelay: 5 * time.Minute,
				GreylistLow: 4 * time.Minute, PaceInterval: 2 * time.Second, PaceBase: time.Second, PaceRefusals: 3,
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
		})
	}
}

func TestLeasesBoundConnections(t *testing.T) {
	for name, addrs := range redisTargets(t) {
		t.Run(name, func(t *testing.T) {
			nodes := []*Cluster{newNode(t, "a", addrs...), newNode(t, "b", addrs...), newNode(t, "c", addrs...)}
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
			dead := leaseExpiry(t, nodes[1], "busy.test")
			if now := redisTime(t, nodes[0]); dead.After(now.Add(nodes[1].cfg.LeaseTTL)) {
				t.Fatalf("a stopped node's lease runs until %v, more than lease_ttl past Redis's %v", dead, now)
			}
			awaitRedisTime(t, nodes[0], dead)
			for _, n := range []*Cluster{nodes[2], nodes[0]} {
				if _, _, ok := n.Acquire("busy.test", 2); !ok {
					t.Fatal("a stopped node's lease did not expire")
				}
			}
			// Past the expiry the live nodes' leases have now: they renew them.
			awaitRedisTime(t, nodes[0], latest(leaseExpiry(t, nodes[2], "busy.test"), leaseExpiry(t, nodes[0], "busy.test")))
			if _, _, ok := nodes[2].Acquire("busy.test", 2); ok {
				t.Fatal("live nodes' leases expired although they renew them")
			}
		})
	}
}

// leaseExpiry is when c's one lease on domain expires, in Redis's clock
// (its score in the domain's lease set); the zero time when the set no
// longer has it (an acquire dropped it as expired).
func leaseExpiry(t *testing.T, c *Cluster, domain string) time.Time {
	t.Helper()
	key := leaseKey(domain)
	var members []string
	c.leaseMu.Lock()
	for m, l := range c.leases {
		if l.key == key {
			members = append(members, m)
		}
	}
	c.leaseMu.Unlock()
	if len(members) != 1 {
		t.Fatalf("node %s holds %d leases on %s, want 1", c.node.Name, len(members), domain)
	}
	score, err := c.rdb.ZScore(context.Background(), key, members[0]).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}
	}
	if err != nil {
		t.Fatalf("node %s's lease on %s: %v", c.node.Name, domain, err)
	}
	return time.UnixMilli(int64(score))
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// redisTime is Redis's clock, which lease expiries are measured on.
func redisTime(t *testing.T, c *Cluster) time.Time {
	t.Helper()
	now, err := c.rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}

// awaitRedisTime waits until Redis's clock is past at: a lease with
// that expiry has run out, unless renewed.
func awaitRedisTime(t *testing.T, c *Cluster, at time.Time) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !redisTime(t, c).After(at); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Redis's clock never passed %v", at)
		}
	}
}

// awaitSubscribers waits until n connections subscribe to the channel
// releases are announced on (on every master of a Redis Cluster, which
// forwards a PUBLISH to all of them).
func awaitSubscribers(t *testing.T, c *Cluster, n int64) {
	t.Helper()
	count := func(ctx context.Context, rc *redis.Client) int64 {
		return rc.PubSubNumSub(ctx, freedChannel).Val()[freedChannel]
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ctx := context.Background()
		var got atomic.Int64
		switch rdb := c.rdb.(type) {
		case *redis.ClusterClient:
			if err := rdb.ForEachMaster(ctx, func(ctx context.Context, rc *redis.Client) error {
				got.Add(count(ctx, rc))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		case *redis.Client:
			got.Add(count(ctx, rdb))
		default:
			t.Fatalf("unexpected Redis client %T", c.rdb)
		}
		if got.Load() >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d subscribers to %s, want %d", got.Load(), freedChannel, n)
		}
	}
}

func TestRedisDownGrantsAndRecovers(t *testing.T) {
	peers.Require(t, "redis-server")
	r := peers.StartRedis(t, "")
	c := newNode(t, "a", r.Addr)
	if !c.Up() || testutil.ToFloat64(c.m.up) != 1 {
		t.Fatal("not up at start")
	}
	r.Kill()
	// The first call to fail marks Redis down; later ones answer at once.
	c.Publish(queue.Destination{Domain: "dest.test", Updated: time.Now()})
	if c.Up() || testutil.ToFloat64(c.m.up) != 0 {
		t.Fatal("still up after Redis was killed")
	}
	for range 3 {
		if _, _, ok := c.Acquire("dest.test", 1); !ok {
			t.Fatal("no slot granted with Redis down: local limits must take over")
		}
	}
	if _, ok := c.Load("dest.test"); ok {
		t.Fatal("a record with Redis down")
	}
	if _, ok := c.Pace("dest.test", time.Second); ok {
		t.Fatal("a shared pace with Redis down: the node must pace on its own")
	}
	r.Start()
	deadline := time.Now().Add(10 * time.Second)
	for !c.Up() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !c.Up() {
		t.Fatal("sharing did not resume after Redis came back")
	}
	var nodes []Node
	var err error
	for deadline := time.Now().Add(10 * time.Second); len(nodes) == 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		nodes, err = c.Nodes(context.Background())
	}
	if err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
		t.Errorf("registry after Redis came back: %+v, %v; want node a", nodes, err)
	}
}

func TestReleaseAnnouncedToWaitingNodes(t *testing.T) {
	for name, addrs := range redisTargets(t) {
		t.Run(name, func(t *testing.T) {
			a, b := newNode(t, "a", addrs...), newNode(t, "b", addrs...)
			awaitSubscribers(t, a, 2) // a release before b subscribed would reach no one
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
}

func TestPaceHoldsAcrossNodes(t *testing.T) {
	for name, addrs := range redisTargets(t) {
		t.Run(name, func(t *testing.T) {
			nodes := []*Cluster{newNode(t, "a", addrs...), newNode(t, "b", addrs...), newNode(t, "c", addrs...)}
			const interval = 200 * time.Millisecond
			start := time.Now()
			var starts []time.Duration
			for i := range 9 { // three rounds of the three nodes, as fast as they can ask
				wait, ok := nodes[i%3].Pace("paced.test", interval)
				if !ok {
					t.Fatal("no shared pace with Redis up")
				}
				starts = append(starts, time.Since(start)+wait)
			}
			slices.Sort(starts)
			for i := 1; i < len(starts); i++ {
				// Redis's clock and ours differ by the round trip: 20 ms slack.
				if gap := starts[i] - starts[i-1]; gap < interval-20*time.Millisecond {
					t.Errorf("starts %d and %d %v apart, want at least %v: %v", i-1, i, gap, interval, starts)
				}
			}
			if wait, ok := nodes[0].Pace("other.test", interval); !ok || wait != 0 {
				t.Errorf("another domain's first start waits %v (%v), want 0", wait, ok)
			}
		})
	}
}

// leaseCount is how many members the lease set of domain holds in Redis.
func leaseCount(t *testing.T, c *Cluster, domain string) int64 {
	t.Helper()
	n, err := c.rdb.ZCard(context.Background(), leaseKey(domain)).Result()
	if err != nil {
		t.Fatalf("ZCARD: %v", err)
	}
	return n
}

// held is how many leases on domain the nodes hold between them.
func held(domain string, nodes ...*Cluster) int {
	n := 0
	for _, c := range nodes {
		c.leaseMu.Lock()
		for _, l := range c.leases {
			if l.key == leaseKey(domain) {
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

// TestOutageLeasesCountAgain: three nodes share a limit of 2. Redis is
// killed while one lease is held, the nodes grant four more on their own,
// and Redis comes back empty (no persistence). The nodes register again
// what they hold as far as the limit allows and take the rest back: two
// leases in Redis, three lost channels closed, and the limit holds for a
// new connection. Before, Redis came back with no lease at all and the
// five connections went on uncounted.
func TestOutageLeasesCountAgain(t *testing.T) {
	peers.Require(t, "redis-server")
	r := peers.StartRedis(t, "")
	nodes := []*Cluster{newNode(t, "a", r.Addr), newNode(t, "b", r.Addr), newNode(t, "c", r.Addr)}
	_, lost, ok := nodes[0].Acquire("busy.test", 2)
	if !ok {
		t.Fatal("no slot with Redis up")
	}
	losts := []<-chan struct{}{lost}
	r.Kill()
	for deadline := time.Now().Add(10 * time.Second); slices.ContainsFunc(nodes, (*Cluster).Up); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the nodes never noticed Redis was gone")
		}
	}
	for _, i := range []int{0, 1, 1, 2} {
		_, lost, ok := nodes[i].Acquire("busy.test", 2)
		if !ok {
			t.Fatal("no slot granted with Redis down: local limits must take over")
		}
		losts = append(losts, lost)
	}
	r.Start()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if slices.ContainsFunc(nodes, func(c *Cluster) bool { return !c.Up() }) {
			continue
		}
		if leaseCount(t, nodes[0], "busy.test") == 2 && closed(losts) == 3 && held("busy.test", nodes...) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Redis came back empty: %d leases in Redis, %d held, %d taken back; want 2, 2, 3",
				leaseCount(t, nodes[0], "busy.test"), held("busy.test", nodes...), closed(losts))
		}
	}
	if _, _, ok := nodes[2].Acquire("busy.test", 2); ok {
		t.Error("a third slot under limit 2 after the leases were registered again")
	}
}

// TestLostLeasesRefilled: Redis loses its data (FLUSHALL stands in for a
// restart without persistence or a failover to a replica that lagged) while
// two nodes hold the two slots of a domain. Their next renewal writes the
// leases back, so a third node still finds the limit held.
func TestLostLeasesRefilled(t *testing.T) {
	peers.Require(t, "redis-server")
	r := peers.StartRedis(t, "")
	nodes := []*Cluster{newNode(t, "a", r.Addr), newNode(t, "b", r.Addr), newNode(t, "c", r.Addr)}
	var losts []<-chan struct{}
	for _, c := range nodes[:2] {
		_, lost, ok := c.Acquire("busy.test", 2)
		if !ok {
			t.Fatal("no slot with Redis up")
		}
		losts = append(losts, lost)
	}
	if err := nodes[0].rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); leaseCount(t, nodes[0], "busy.test") != 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d leases in Redis after the flush, want the nodes' 2 back", leaseCount(t, nodes[0], "busy.test"))
		}
	}
	if _, _, ok := nodes[2].Acquire("busy.test", 2); ok {
		t.Error("a third slot under limit 2 after Redis lost the leases")
	}
	if n := closed(losts); n != 0 {
		t.Errorf("%d leases taken back, want none: there was room for both", n)
	}
}
