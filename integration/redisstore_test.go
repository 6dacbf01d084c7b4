package integration

// relay/cluster's Store on real redis-server instances: a single server
// and a 3-master Redis Cluster made with redis-cli --cluster create. The
// unit tests of relay/cluster run the same cases on an in-memory store;
// here the Lua scripts, the key hash tags, the pipeline, the
// subscription and Redis's own clock are what is under test, through the
// package's exported API and a go-redis client of the test's own.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/cluster"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// rsNode is one node on a Redis store: its Cluster, the store (which the
// test can make crash), its metrics and its log.
type rsNode struct {
	*cluster.Cluster
	st   *crashable
	reg  *prometheus.Registry
	logs *observer.ObservedLogs
	url  string
}

// crashable is a Store that stops at once, the way a killed process
// stops: after crash it neither renews nor heartbeats nor cleans up, and
// what it holds in Redis is left to expire.
type crashable struct {
	cluster.Store
	crashed atomic.Bool
}

func (s *crashable) crash() { s.crashed.Store(true) }

func (s *crashable) Renew(ctx context.Context, ttl time.Duration, held map[string]map[string]int) (map[string][]string, map[string][]string, error) {
	if s.crashed.Load() {
		return nil, nil, nil
	}
	return s.Store.Renew(ctx, ttl, held)
}

func (s *crashable) Heartbeat(ctx context.Context, name string, entry []byte, ttl time.Duration) ([]byte, error) {
	if s.crashed.Load() {
		return nil, nil
	}
	return s.Store.Heartbeat(ctx, name, entry, ttl)
}

func (s *crashable) Drop(ctx context.Context, domain, member string) error {
	if s.crashed.Load() {
		return nil
	}
	return s.Store.Drop(ctx, domain, member)
}

func (s *crashable) Unregister(ctx context.Context, name, instance string) error {
	if s.crashed.Load() {
		return nil
	}
	return s.Store.Unregister(ctx, name, instance)
}

// startRSNode connects a node named name (admin URL url) to the Redis
// servers at addrs with lease_ttl 1s (a renewal and a heartbeat every
// 333 ms) and waits until Redis answers it. The Redis timeout is a
// safety net, not what the tests measure: 500 ms ran out on a loaded
// machine and the node went on without Redis, as it should, dropping
// what the test shares. The node's log is kept.
func startRSNode(t *testing.T, name, url string, addrs ...string) *rsNode {
	t.Helper()
	rc := config.Redis{Addresses: addrs, Timeout: 5 * time.Second}
	st, err := cluster.NewRedis(rc)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	n := &rsNode{st: &crashable{Store: st}, reg: prometheus.NewRegistry(), logs: logs, url: url}
	n.Cluster, err = cluster.New(cluster.Options{Node: cluster.Node{Name: name, AdminURL: url}, Registry: n.reg,
		Logger: zap.New(core), Store: n.st, Config: config.Cluster{Redis: rc, DestinationLimits: cluster.LimitsShared, LeaseTTL: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	relaytest.Eventually(t, 10*time.Second, "node "+name+": Redis answers", func() error {
		if !n.Up() {
			return fmt.Errorf("Redis at %v not up", addrs)
		}
		return nil
	})
	return n
}

// metric is the value of the node's metric name (summed over labels
// matching want).
func (n *rsNode) metric(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	return metricValue(byName, name, want)
}

// levelCount counts n's log lines at level whose message contains text.
func (n *rsNode) levelCount(level zapcore.Level, text string) int {
	return n.logs.Filter(func(e observer.LoggedEntry) bool {
		return e.Level == level && strings.Contains(e.Message, text)
	}).Len()
}

// rsTargets runs a test against a single redis-server and against a
// 3-master Redis Cluster.
func rsTargets(t *testing.T) map[string][]string {
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
		// The cluster bus port is a free port of its own: by default it
		// is the client port + 10000, which FreePort does not reserve,
		// and a parallel test could be listening there.
		r := peers.StartRedisWith(t, "", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(peers.FreePort(t, "127.0.0.1")))
		addrs = append(addrs, r.Addr)
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	relaytest.Eventually(t, 10*time.Second, "redis-cli --cluster create", func() error {
		out, err := exec.Command("redis-cli", args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "All 16384 slots covered") {
			return fmt.Errorf("%v\n%s", err, out)
		}
		return nil
	})
	// Every server, not only the first: one that has not yet heard that
	// the slots are covered answers CLUSTERDOWN for its own keys.
	for _, addr := range addrs {
		relaytest.Eventually(t, 10*time.Second, "cluster_state:ok on "+addr, func() error {
			o, _ := exec.Command("redis-cli", "-p", strings.Split(addr, ":")[1], "cluster", "info").Output()
			if !strings.Contains(string(o), "cluster_state:ok") {
				return fmt.Errorf("%s", o)
			}
			return nil
		})
	}
	return addrs
}

// rsClient is the test's own client of the Redis at addrs, to look at
// what the nodes wrote.
func rsClient(t *testing.T, addrs ...string) redis.UniversalClient {
	t.Helper()
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs})
	t.Cleanup(func() { c.Close() })
	return c
}

// leaseKey is the sorted set of a domain's leases, scored by expiry (ms
// on Redis's clock).
func leaseKey(domain string) string { return "greyrelay:{" + domain + "}:leases" }

// leaseExpiry is when node's one lease on domain expires, on Redis's
// clock; the zero time when the set no longer has it.
func leaseExpiry(t *testing.T, rdb redis.UniversalClient, node, domain string) time.Time {
	t.Helper()
	zs, err := rdb.ZRangeWithScores(context.Background(), leaseKey(domain), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var found []time.Time
	for _, z := range zs {
		if strings.HasPrefix(z.Member.(string), node+"/") {
			found = append(found, time.UnixMilli(int64(z.Score)))
		}
	}
	if len(found) > 1 {
		t.Fatalf("node %s has %d leases on %s in Redis, want at most 1", node, len(found), domain)
	}
	if len(found) == 0 {
		return time.Time{}
	}
	return found[0]
}

// awaitRedisTime waits until Redis's clock is past at: a lease with that
// expiry has run out, unless renewed.
func awaitRedisTime(t *testing.T, rdb redis.UniversalClient, at time.Time) {
	t.Helper()
	relaytest.Eventually(t, 10*time.Second, fmt.Sprintf("Redis's clock past %v", at), func() error {
		now, err := redisTime(rdb)
		if err == nil && !now.After(at) {
			err = fmt.Errorf("Redis's clock says %v", now)
		}
		return err
	})
}

// redisTime is Redis's clock (on one master of a Redis Cluster: their
// clocks are this machine's).
func redisTime(rdb redis.UniversalClient) (time.Time, error) {
	return rdb.Time(context.Background()).Result()
}

func TestRedisStoreSharesRecord(t *testing.T) {
	t.Parallel()
	for name, addrs := range rsTargets(t) {
		t.Run(name, func(t *testing.T) {
			a, b := startRSNode(t, "a", "", addrs...), startRSNode(t, "b", "", addrs...)
			if _, ok := b.Load("dest.test"); ok {
				t.Fatal("a record before anyone published one")
			}
			now := time.Now().UTC().Truncate(time.Second)
			rec := queue.Destination{Domain: "Dest.Test", Greylists: true, GreylistSeen: 7, LearnedDelay: 5 * time.Minute,
				GreylistLow: 4 * time.Minute, GreylistLearned: now.Add(-time.Minute), PaceInterval: 2 * time.Second, PaceBase: time.Second, PaceRefusals: 3,
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
			// A late publish of an older record keeps the newer one
			// (relay/cluster's TestLatePublishKeepsNewerRecord, here on
			// the script).
			a.Publish(queue.Destination{Domain: "dest.test", Updated: now.Add(-time.Second)})
			if got, _ := b.Load("dest.test"); got.PaceInterval != rec.PaceInterval {
				t.Errorf("after a late older publish: %+v, want the newer record", got)
			}
			b.Publish(queue.Destination{Domain: "dest.test", GreylistLow: time.Minute, Updated: now.Add(time.Second)})
			if got, _ := a.Load("dest.test"); got.GreylistLow != time.Minute || got.PaceInterval != 0 {
				t.Errorf("after a newer publish: %+v, want it", got)
			}
			// A refusal that slowed the pace outranks a later record
			// unaware of it; one that knows it and is later replaces it.
			refused := now.Add(2 * time.Second)
			a.Publish(queue.Destination{Domain: "dest.test", PaceInterval: time.Second, PaceRefused: refused, Updated: refused})
			b.Publish(queue.Destination{Domain: "dest.test", PaceInterval: time.Second / 2, Updated: now.Add(3 * time.Second)})
			if got, _ := a.Load("dest.test"); got.PaceInterval != time.Second || !got.PaceRefused.Equal(refused) {
				t.Errorf("after a later publish unaware of a refusal: %+v, want the refused record", got)
			}
			b.Publish(queue.Destination{Domain: "dest.test", PaceInterval: time.Second / 2, PaceRefused: refused, Updated: now.Add(4 * time.Second)})
			if got, _ := a.Load("dest.test"); got.PaceInterval != time.Second/2 {
				t.Errorf("after a later publish that knew the refusal: %+v, want it", got)
			}
			// The runs of accepted messages into an opening: each node
			// finds the others' sum, not its own.
			opening := queue.Destination{Domain: "runs.test", PaceInterval: 2 * time.Second, PaceRefusals: 1, Updated: now}
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
		})
	}
}

func TestRedisStoreLeasesBoundConnections(t *testing.T) {
	t.Parallel()
	for name, addrs := range rsTargets(t) {
		t.Run(name, func(t *testing.T) {
			rdb := rsClient(t, addrs...)
			nodes := []*rsNode{startRSNode(t, "a", "", addrs...), startRSNode(t, "b", "", addrs...), startRSNode(t, "c", "", addrs...)}
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
			nodes[1].st.crash()
			dead := leaseExpiry(t, rdb, "b", "busy.test")
			now, err := redisTime(rdb)
			if err != nil {
				t.Fatal(err)
			}
			if dead.IsZero() || dead.After(now.Add(time.Second+100*time.Millisecond)) {
				// 100 ms: a renewal may have been under way when the node crashed.
				t.Fatalf("a crashed node's lease runs until %v, more than lease_ttl past Redis's %v", dead, now)
			}
			awaitRedisTime(t, rdb, dead)
			for _, n := range []*rsNode{nodes[2], nodes[0]} {
				if _, _, ok := n.Acquire("busy.test", 2); !ok {
					t.Fatal("a crashed node's lease did not expire")
				}
			}
			// Past the expiry the live nodes' leases have now: they renew them.
			awaitRedisTime(t, rdb, latest(leaseExpiry(t, rdb, "c", "busy.test"), leaseExpiry(t, rdb, "a", "busy.test")))
			if _, _, ok := nodes[2].Acquire("busy.test", 2); ok {
				t.Fatal("live nodes' leases expired although they renew them")
			}
		})
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func TestRedisStoreDownGrantsAndRecovers(t *testing.T) {
	peers.Require(t, "redis-server")
	t.Parallel()
	r := peers.StartRedis(t, "")
	c := startRSNode(t, "a", "", r.Addr)
	if !c.Up() || c.metric(t, "greyrelay_cluster_redis_up", nil) != 1 {
		t.Fatal("not up at start")
	}
	r.Kill()
	// The first call to fail marks Redis down; later ones answer at once.
	c.Publish(queue.Destination{Domain: "dest.test", Updated: time.Now()})
	if c.Up() || c.metric(t, "greyrelay_cluster_redis_up", nil) != 0 {
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
	if _, ok := c.Pace("dest.test", time.Second, time.Hour); ok {
		t.Fatal("a shared pace with Redis down: the node must pace on its own")
	}
	r.Start()
	relaytest.Eventually(t, 10*time.Second, "sharing resumed after Redis came back", func() error {
		if !c.Up() {
			return fmt.Errorf("not up")
		}
		return nil
	})
	relaytest.Eventually(t, 10*time.Second, "node a in the registry after Redis came back", func() error {
		nodes, err := c.Nodes(context.Background())
		if err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
			return fmt.Errorf("%+v, %v; want node a", nodes, err)
		}
		return nil
	})
}

// awaitSubscribers waits until n connections subscribe to the channel
// releases are announced on (on every master of a Redis Cluster, which
// forwards a PUBLISH to all of them).
func awaitSubscribers(t *testing.T, rdb redis.UniversalClient, n int64) {
	t.Helper()
	const channel = "greyrelay:freed"
	count := func(ctx context.Context, rc *redis.Client) int64 { return rc.PubSubNumSub(ctx, channel).Val()[channel] }
	relaytest.Eventually(t, 10*time.Second, fmt.Sprintf("%d subscribers to %s", n, channel), func() error {
		ctx := context.Background()
		var got atomic.Int64
		switch rdb := rdb.(type) {
		case *redis.ClusterClient:
			if err := rdb.ForEachMaster(ctx, func(ctx context.Context, rc *redis.Client) error {
				got.Add(count(ctx, rc))
				return nil
			}); err != nil {
				return err
			}
		case *redis.Client:
			got.Add(count(ctx, rdb))
		}
		if got.Load() < n {
			return fmt.Errorf("%d subscribers", got.Load())
		}
		return nil
	})
}

func TestRedisStoreReleaseAnnounced(t *testing.T) {
	t.Parallel()
	for name, addrs := range rsTargets(t) {
		t.Run(name, func(t *testing.T) {
			a, b := startRSNode(t, "a", "", addrs...), startRSNode(t, "b", "", addrs...)
			awaitSubscribers(t, rsClient(t, addrs...), 2) // a release before b subscribed would reach no one
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

// TestRedisStorePaceHoldsAcrossNodes runs alone, not in parallel: it
// dates each start by this process's clock after the call returns, with
// 20 ms of slack, which the other tests' work in the same process exceeded
// (starts 173 ms apart for a 200 ms pace).
func TestRedisStorePaceHoldsAcrossNodes(t *testing.T) {
	for name, addrs := range rsTargets(t) {
		t.Run(name, func(t *testing.T) {
			nodes := []*rsNode{startRSNode(t, "a", "", addrs...), startRSNode(t, "b", "", addrs...), startRSNode(t, "c", "", addrs...)}
			const interval = 200 * time.Millisecond
			start := time.Now()
			var starts []time.Duration
			for i := range 9 { // three rounds of the three nodes, as fast as they can ask
				wait, ok := nodes[i%3].Pace("paced.test", interval, time.Hour)
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
			if wait, ok := nodes[0].Pace("other.test", interval, time.Hour); !ok || wait != 0 {
				t.Errorf("another domain's first start waits %v (%v), want 0", wait, ok)
			}
			// A start is one gap after the last, the gap being the asking
			// node's current one: after a probe reserved with a long gap
			// was accepted, the short pace learned from it applies at once.
			if wait, ok := nodes[0].Pace("probe.test", time.Minute, time.Hour); !ok || wait != 0 {
				t.Fatalf("the probe waits %v (%v), want 0", wait, ok)
			}
			if wait, _ := nodes[1].Pace("probe.test", interval, time.Hour); wait > interval+20*time.Millisecond {
				t.Errorf("the start after the probe waits %v with a pace of %v: the probe's minute held it", wait, interval)
			}
			// A start further away than the caller reserves ahead is
			// found, not reserved.
			if wait, _ := nodes[2].Pace("probe.test", time.Minute, time.Second); wait < 50*time.Second {
				t.Errorf("a start a minute after the last waits %v, want about a minute", wait)
			}
			if wait, _ := nodes[0].Pace("probe.test", interval, time.Hour); wait > 2*interval+20*time.Millisecond {
				t.Errorf("after a start found but not reserved, the next waits %v, want at most %v", wait, 2*interval)
			}
		})
	}
}

func closedCount(chs []<-chan struct{}) int {
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

// TestRedisStoreOutageLeasesCountAgain: three nodes share a limit of 2.
// Redis is killed while one lease is held, the nodes grant four more on
// their own, and Redis comes back empty (no persistence). The nodes
// register again what they hold as far as the limit allows and take the
// rest back: two leases in Redis, three lost channels closed, and the
// limit holds for a new connection.
func TestRedisStoreOutageLeasesCountAgain(t *testing.T) {
	peers.Require(t, "redis-server")
	t.Parallel()
	r := peers.StartRedis(t, "")
	rdb := rsClient(t, r.Addr)
	nodes := []*rsNode{startRSNode(t, "a", "", r.Addr), startRSNode(t, "b", "", r.Addr), startRSNode(t, "c", "", r.Addr)}
	_, lost, ok := nodes[0].Acquire("busy.test", 2)
	if !ok {
		t.Fatal("no slot with Redis up")
	}
	losts := []<-chan struct{}{lost}
	r.Kill()
	relaytest.Eventually(t, 10*time.Second, "the nodes notice Redis is gone", func() error {
		if slices.ContainsFunc(nodes, func(n *rsNode) bool { return n.Up() }) {
			return fmt.Errorf("a node still up")
		}
		return nil
	})
	for _, i := range []int{0, 1, 1, 2} {
		_, lost, ok := nodes[i].Acquire("busy.test", 2)
		if !ok {
			t.Fatal("no slot granted with Redis down: local limits must take over")
		}
		losts = append(losts, lost)
	}
	r.Start()
	relaytest.Eventually(t, 10*time.Second, "the leases registered again", func() error {
		if slices.ContainsFunc(nodes, func(n *rsNode) bool { return !n.Up() }) {
			return fmt.Errorf("a node not up yet")
		}
		if n, err := rdb.ZCard(context.Background(), leaseKey("busy.test")).Result(); err != nil || n != 2 || closedCount(losts) != 3 {
			return fmt.Errorf("%d leases in Redis (%v), %d taken back; want 2, 3", n, err, closedCount(losts))
		}
		return nil
	})
	if _, _, ok := nodes[2].Acquire("busy.test", 2); ok {
		t.Error("a third slot under limit 2 after the leases were registered again")
	}
}

// TestRedisStoreLostLeasesRefilled: Redis loses its data (FLUSHALL stands
// in for a restart without persistence or a failover to a replica that
// lagged) while two nodes hold the two slots of a domain. Their next
// renewal writes the leases back, so a third node still finds the limit
// held.
func TestRedisStoreLostLeasesRefilled(t *testing.T) {
	peers.Require(t, "redis-server")
	t.Parallel()
	r := peers.StartRedis(t, "")
	rdb := rsClient(t, r.Addr)
	nodes := []*rsNode{startRSNode(t, "a", "", r.Addr), startRSNode(t, "b", "", r.Addr), startRSNode(t, "c", "", r.Addr)}
	var losts []<-chan struct{}
	for _, c := range nodes[:2] {
		_, lost, ok := c.Acquire("busy.test", 2)
		if !ok {
			t.Fatal("no slot with Redis up")
		}
		losts = append(losts, lost)
	}
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	relaytest.Eventually(t, 10*time.Second, "the nodes' 2 leases back after the flush", func() error {
		if n, err := rdb.ZCard(context.Background(), leaseKey("busy.test")).Result(); err != nil || n != 2 {
			return fmt.Errorf("%d leases (%v)", n, err)
		}
		return nil
	})
	if _, _, ok := nodes[2].Acquire("busy.test", 2); ok {
		t.Error("a third slot under limit 2 after Redis lost the leases")
	}
	if n := closedCount(losts); n != 0 {
		t.Errorf("%d leases taken back, want none: there was room for both", n)
	}
}

// TestRedisStoreNodeNameConflict: the registry's heartbeat script returns
// the entry it replaced, so a second running process with the same node
// name is noticed (and a restart after a crash or a clean stop is not).
func TestRedisStoreNodeNameConflict(t *testing.T) {
	peers.Require(t, "redis-server")
	t.Parallel()
	addr := peers.StartRedis(t, "").Addr
	const conflictMsg, warnMsg = "another running process uses this node name", "replaced a fresh registry entry"
	tests := []struct {
		name                      string
		firstName, firstURL, then string
		wantConflict, wantWarn    bool
	}{
		{name: "same name, both running", firstName: "n", firstURL: "http://10.0.0.2:8025", then: "runs",
			wantConflict: true, wantWarn: true},
		{name: "same name and admin URL, both running", firstName: "n", firstURL: "http://10.0.0.1:8025", then: "runs",
			wantConflict: true},
		{name: "restart after a crash", firstName: "n", firstURL: "http://10.0.0.1:8025", then: "crashes"},
		{name: "queue moved to another host after a crash", firstName: "n", firstURL: "http://10.0.0.2:8025", then: "crashes",
			wantWarn: true},
		{name: "restart after a clean stop", firstName: "n", firstURL: "http://10.0.0.1:8025", then: "stops"},
		{name: "distinct names", firstName: "other", firstURL: "http://10.0.0.2:8025", then: "runs"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := fmt.Sprintf("case%d-", i) // the cases share one Redis
			first := startRSNode(t, prefix+tt.firstName, tt.firstURL, addr)
			heartbeats := func(n *rsNode) float64 {
				return n.metric(t, "greyrelay_cluster_redis_commands_total", map[string]string{"op": "heartbeat"})
			}
			relaytest.Eventually(t, 10*time.Second, "the first node's heartbeat", func() error {
				if heartbeats(first) < 1 {
					return fmt.Errorf("none yet")
				}
				return nil
			})
			switch tt.then {
			case "crashes":
				first.st.crash()
			case "stops":
				first.Close()
			}
			ours := startRSNode(t, prefix+"n", "http://10.0.0.1:8025", addr)
			relaytest.Eventually(t, 10*time.Second, "six heartbeats or conflicts", func() error {
				if tt.wantConflict && ours.metric(t, "greyrelay_cluster_node_name_conflicts_total", nil) < 6 ||
					!tt.wantConflict && heartbeats(ours) < 6 {
					return fmt.Errorf("not yet")
				}
				return nil
			})
			nodes := []*rsNode{ours}
			if tt.then == "runs" {
				nodes = append(nodes, first) // the first sees the conflict as well
			}
			for _, n := range nodes {
				conflicts := n.metric(t, "greyrelay_cluster_node_name_conflicts_total", nil)
				if got := n.levelCount(zapcore.ErrorLevel, conflictMsg); (conflicts > 0) != tt.wantConflict || got != map[bool]int{true: 1}[tt.wantConflict] {
					t.Errorf("%s: %v conflicts counted, %d errors logged; want conflict %v, logged once", n.url, conflicts, got, tt.wantConflict)
				}
			}
			if got := ours.levelCount(zapcore.WarnLevel, warnMsg); got != map[bool]int{true: 1}[tt.wantWarn] {
				t.Errorf("%d warnings about a replaced entry, want %v", got, tt.wantWarn)
			}
			if tt.wantConflict {
				e := ours.logs.FilterMessageSnippet(conflictMsg).All()[0]
				if m := e.ContextMap(); m["other_admin_url"] != tt.firstURL || m["admin_url"] != "http://10.0.0.1:8025" ||
					!strings.Contains(e.Message, "cluster.node_name") {
					t.Errorf("the error names %v and %v, want both admin URLs and the remedy", m["admin_url"], m["other_admin_url"])
				}
			}
		})
	}
}

// TestRedisStoreNodeNameConflictShownAndOver: while two processes share a
// name, the registry entry in Redis says so (for greyrelay cluster
// status); once one stops the other says the conflict is over and the
// entry is clean again.
func TestRedisStoreNodeNameConflictShownAndOver(t *testing.T) {
	peers.Require(t, "redis-server")
	t.Parallel()
	addr := peers.StartRedis(t, "").Addr
	a, b := startRSNode(t, "n", "http://a:8025", addr), startRSNode(t, "n", "http://b:8025", addr)
	relaytest.Eventually(t, 10*time.Second, "the entry names the conflict", func() error {
		ns, err := a.Nodes(context.Background())
		if err != nil || len(ns) != 1 || ns[0].ConflictWith == "" || ns[0].ConflictWith == ns[0].AdminURL {
			return fmt.Errorf("%+v, %v", ns, err)
		}
		return nil
	})
	b.Close()
	relaytest.Eventually(t, 10*time.Second, "the conflict over", func() error {
		if n := a.levelCount(zapcore.InfoLevel, "conflict is over"); n != 1 {
			return fmt.Errorf("logged %d times", n)
		}
		return nil
	})
	relaytest.Eventually(t, 10*time.Second, "a clean entry of node a", func() error {
		ns, err := a.Nodes(context.Background())
		if err != nil || len(ns) != 1 || ns[0].AdminURL != "http://a:8025" || ns[0].ConflictWith != "" || ns[0].Instance == "" {
			return fmt.Errorf("%+v, %v", ns, err)
		}
		return nil
	})
}

// TestRedisStoreCloseKeepsAnotherProcessEntry: the unregister script
// deletes the registry entry only if the stopping process wrote it, not
// that of the process that took over its name; and an entry of a version
// that wrote no instance, found by the heartbeat script, is a conflict.
func TestRedisStoreCloseKeepsAnotherProcessEntry(t *testing.T) {
	peers.Require(t, "redis-server")
	t.Parallel()
	addr := peers.StartRedis(t, "").Addr
	rdb := rsClient(t, addr)
	entry := func() cluster.Node {
		var n cluster.Node
		b, _ := rdb.Get(context.Background(), "greyrelay:node:n").Bytes()
		json.Unmarshal(b, &n)
		return n
	}
	old := startRSNode(t, "n", "http://old:8025", addr)
	relaytest.Eventually(t, 10*time.Second, "the old node's entry", func() error {
		if e := entry(); e.AdminURL != "http://old:8025" {
			return fmt.Errorf("entry %+v", e)
		}
		return nil
	})
	old.st.crash()
	moved := startRSNode(t, "n", "http://new:8025", addr)
	relaytest.Eventually(t, 10*time.Second, "the new node's entry", func() error {
		if e := entry(); e.AdminURL != "http://new:8025" {
			return fmt.Errorf("entry %+v", e)
		}
		return nil
	})
	old.st.crashed.Store(false) // its Close runs the unregister script
	old.Close()
	if got := entry(); got.AdminURL != "http://new:8025" {
		t.Errorf("after the old process closed, the entry is %+v; want the new node's", got)
	}
	moved.Close()
	if n, err := rdb.Exists(context.Background(), "greyrelay:node:n").Result(); err != nil || n != 0 {
		t.Errorf("the node's own entry left after Close: %d, %v", n, err)
	}

	ours := startRSNode(t, "m", "http://new:8025", addr)
	oldEntry := `{"name":"m","admin_url":"http://old:8025","version":"1.0","started":"2026-01-02T03:04:05Z","seen":"%s","queued":3}`
	relaytest.Eventually(t, 10*time.Second, "conflicts with an entry of an old version counted", func() error {
		// The old process's heartbeat, between two of ours.
		rdb.Set(context.Background(), "greyrelay:node:m", fmt.Sprintf(oldEntry, time.Now().UTC().Format(time.RFC3339Nano)), 3*time.Second)
		if n := ours.metric(t, "greyrelay_cluster_node_name_conflicts_total", nil); n < 2 {
			return fmt.Errorf("%v conflicts", n)
		}
		return nil
	})
	if e := ours.logs.FilterMessageSnippet("another running process uses this node name").All(); len(e) != 1 || e[0].ContextMap()["other_admin_url"] != "http://old:8025" {
		t.Errorf("logged %+v, want one error naming http://old:8025", e)
	}
}

// TestClusterStatusShowsNameConflict runs `greyrelay cluster status`
// against a real Redis where nodes registered: two running nodes with one
// name are reported with both admin URLs and the remedy, and the command
// exits with status 2 (with -json too), naming the node. So are two nodes
// whose queue ID tags meet. (It was a unit test of cmd/greyrelay, which
// then needed a redis-server.)
func TestClusterStatusShowsNameConflict(t *testing.T) {
	peers.Require(t, "redis-server")
	t.Parallel()
	conflicting := []cluster.Node{{Name: "relay1", AdminURL: "http://10.0.0.1:8025"}, {Name: "relay1", AdminURL: "http://10.0.0.2:8025"}}
	cases := []struct {
		name      string
		nodes     []cluster.Node
		flags     []string
		wantLines []string
		wantNo    string
		wantCode  int
		wantErr   string
	}{
		{"one name, two processes", conflicting, nil,
			[]string{"1 node(s)", "CONFLICT: node name relay1 is used by two running processes", "10.0.0.1:8025", "10.0.0.2:8025",
				"give each node its own cluster.node_name"}, "", 2, "relay1"},
		{"one name, two processes, json", conflicting, []string{"-json"},
			[]string{`"name": "relay1"`, `"conflict_with": "http://10.0.0.`}, "", 2, "relay1"},
		// Names whose queue ID tags (cluster.IDTag) meet: found by trying
		// relay0, relay1... until two 24-bit FNV-1a hashes were equal.
		{"two names, one queue ID tag",
			[]cluster.Node{{Name: "relay11859", AdminURL: "http://10.0.0.1:8025"}, {Name: "relay27924", AdminURL: "http://10.0.0.2:8025"}}, nil,
			[]string{"2 node(s)", "CONFLICT: nodes relay11859 and relay27924 share the queue ID tag 22a192", "rename one of them"},
			"", 2, "share the queue ID tag 22a192"},
		{"distinct names",
			[]cluster.Node{{Name: "relay1", AdminURL: "http://10.0.0.1:8025"}, {Name: "relay2", AdminURL: "http://10.0.0.2:8025"}}, nil,
			[]string{"2 node(s)", "relay1", "relay2", fmt.Sprintf("%06x", cluster.IDTag("relay2"))}, "CONFLICT", 0, ""},
	}
	containsAll := func(s string, subs []string) bool {
		return !slices.ContainsFunc(subs, func(sub string) bool { return !strings.Contains(s, sub) })
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := peers.StartRedis(t, "").Addr
			dir := t.TempDir()
			path := filepath.Join(dir, "greyrelay.yaml")
			if err := os.WriteFile(path, fmt.Appendf(nil, "cluster:\n  redis:\n    addresses: [%q]\n", addr), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, n := range tc.nodes {
				startRSNode(t, n.Name, n.AdminURL, addr)
			}
			var res cliResult
			// The conflict shows from the second heartbeat on.
			relaytest.Eventually(t, 10*time.Second, "cluster status showing "+strings.Join(tc.wantLines, ", "), func() error {
				res = runGreyrelay(t, dir, "", nil, append([]string{"cluster", "status", "-config", path}, tc.flags...)...)
				if res.Code != 0 && res.Code != 2 {
					t.Fatalf("cluster status: %s", res)
				}
				if !containsAll(res.Stdout, tc.wantLines) {
					return fmt.Errorf("%s", res)
				}
				return nil
			})
			if tc.wantNo != "" && strings.Contains(res.Stdout, tc.wantNo) {
				t.Errorf("cluster status:\n%s\nwant %q and not %q", res, tc.wantLines, tc.wantNo)
			}
			if res.Code != tc.wantCode || tc.wantErr != "" && !strings.Contains(res.Stderr, tc.wantErr) {
				t.Errorf("cluster status: %s\nwant exit %d naming %q", res, tc.wantCode, tc.wantErr)
			}
		})
	}
}

// TestRedisStoreSharesSuspensions: the operator's suspensions go through
// one Redis hash, on a single server and on a Redis Cluster: what one node
// puts the other reads, and a delete reaches both.
func TestRedisStoreSharesSuspensions(t *testing.T) {
	t.Parallel()
	for name, addrs := range rsTargets(t) {
		t.Run(name, func(t *testing.T) {
			a, b := startRSNode(t, "a", "", addrs...), startRSNode(t, "b", "", addrs...)
			now := time.Now().UTC().Truncate(time.Second)
			s := queue.Suspension{Domain: "dest.test", Reason: "migration", Since: now, Until: now.Add(time.Hour), Node: "a"}
			if !a.PutSuspension(s) {
				t.Fatal("PutSuspension failed")
			}
			got, ok := b.Suspensions()
			if !ok || len(got) != 1 || got[0].Reason != "migration" || !got[0].Until.Equal(s.Until) {
				t.Fatalf("node b reads %+v, %v; want %+v", got, ok, s)
			}
			if !b.DeleteSuspension("dest.test") {
				t.Fatal("DeleteSuspension failed")
			}
			if got, ok := a.Suspensions(); !ok || len(got) != 0 {
				t.Errorf("after the delete: %+v, %v", got, ok)
			}
		})
	}
}
