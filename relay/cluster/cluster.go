// Package cluster shares what several greyrelay nodes know about
// destinations, and the connection limits they owe them, through Redis.
//
// Design notes:
//
//   - Each node keeps its own durable queue and its own destination
//     records; Redis holds a shared copy of the part worth sharing (learned
//     greylisting window, throttle level, pause and pace, dead MX hosts,
//     the last rate-limit reply). The delivery engine reads it when it loads a
//     domain's state and when it opens a connection, and writes it when its
//     own record changed: Redis traffic is per connection or state change,
//     never per message. The one exception is a destination that throttles
//     us: each of its paced starts is one reservation (below), at the slow
//     rate the destination allows.
//   - Cluster-wide connection limits are leases: one sorted set per domain
//     whose members are "node/lease" scored by their expiry (Redis server
//     time). A Lua script drops expired members and adds one if fewer than
//     the limit remain. A node renews its leases in one pipeline per
//     lease_ttl/3, so a dead node's slots free within lease_ttl.
//   - The state lives in a Store: Redis in production (redis.go); the
//     Cluster decides what to share and what to do when the store fails,
//     the Store applies each operation atomically on one clock. Keys put
//     the domain in a hash tag ({domain}), so a domain's keys share a slot
//     in a Redis Cluster and a script may touch them together.
//   - Redis failing never stops mail. Every call has a short timeout; the
//     first failure marks Redis down (a warning, greyrelay_cluster_redis_up
//     0) and until a background PING succeeds again every call returns at
//     once: reads find nothing, writes are dropped, leases are granted (the
//     node's own delivery.max_per_destination still holds). Sharing resumes
//     when Redis answers again.
//   - A lease granted while Redis was away is kept by the node, and so is
//     every other: the first renewal after Redis answers again registers
//     the ones Redis lacks (granted meanwhile, or lost with a Redis that
//     restarted empty) while the domain's limit allows, and takes back the
//     rest; their connections close at their next message boundary. So
//     within one renewal period after Redis returns every open connection
//     is counted again or closing, and the limit holds again once the
//     messages in flight end.
//   - Releasing a slot publishes the domain on one channel in the same
//     script; every node subscribes once and a node whose domain waits
//     for a slot tries again at once. The engine's poll after a second
//     covers what no release announces (a dead node's expired lease).
//   - A throttled destination's learned pace holds across the nodes: each
//     paced start is reserved one gap after the domain's last one, on
//     Redis's clock (in a Lua script), so three nodes together start no
//     faster than the pace; the gap is the asking node's current one, so
//     a pace that has just become faster applies to the next start. With Redis down each
//     node paces on its own.
//   - Nodes register themselves (name, admin URL, version, start time) under
//     a key with a TTL refreshed by the same background loop. Node names
//     must be unique: each heartbeat returns the entry it replaced, and an
//     entry another process wrote since the last heartbeat means a second
//     live node with this name. That is logged as an error once per
//     conflict, counted (greyrelay_cluster_node_name_conflicts_total) and
//     written into the entry (conflict_with) for `greyrelay cluster
//     status` and the status page. A restart finds its previous run's
//     entry only at its first heartbeat, which is therefore no conflict
//     (registry.go).
//   - The suppression list (suppress.go) and user_limits counts (usage.go)
//     are shared too: each node keeps its own copy, which it checks, and
//     exchanges it with Redis every few seconds, so checking a recipient or
//     a sender never waits for Redis.
//
// The Redis client is go-redis's UniversalClient: one address is a single
// server, several a Redis Cluster, and master_name selects Sentinel.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/config"
)

// Options configure New.
type Options struct {
	Config   config.Cluster
	Node     Node // this node's registry entry
	Logger   *zap.Logger
	Registry prometheus.Registerer
	// Store keeps the shared state; nil means the Redis that
	// Config.Redis names (NewRedis).
	Store Store
}

// Node is one node's entry in the registry.
type Node struct {
	Name     string    `json:"name"`
	AdminURL string    `json:"admin_url"`
	Version  string    `json:"version"`
	Started  time.Time `json:"started"`
	Seen     time.Time `json:"seen"`
	Queued   int       `json:"queued"` // recipients waiting, at the last heartbeat
	// Instance names the process that wrote the entry (set by New); an
	// entry from a version before it has none.
	Instance string `json:"instance,omitempty"`
	// IDTag is the tag in the low bits of this node's queue IDs (IDTag,
	// six hex digits: the end of every ID it hands out); an entry from a
	// version before tags has none.
	IDTag string `json:"id_tag,omitempty"`
	// ConflictWith is the admin URL of another running process that
	// writes this node name's entry too, while the writer sees one.
	ConflictWith string `json:"conflict_with,omitempty"`
}

// Cluster is a node's connection to the shared state. Its methods are safe
// for concurrent use and never block longer than cluster.redis.timeout.
type Cluster struct {
	store   Store
	cfg     config.Cluster
	node    Node
	log     *zap.Logger
	up      atomic.Bool
	queued  atomic.Int64
	m       clusterMetrics
	leaseMu sync.Mutex
	leases  map[string]*lease // lease member → the slot
	seq     atomic.Uint64
	// instance tells this run's leases from those of any other process,
	// even one with the same node name (a restart, a misconfiguration).
	instance string
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
	freed    chan string // Freed
	unlisten context.CancelFunc
	listened chan struct{}
	reg      registry // the heartbeat's memory, the loop's alone
}

type clusterMetrics struct {
	up        prometheus.Gauge
	commands  *prometheus.CounterVec
	conflicts prometheus.Counter
}

// New connects (lazily: go-redis dials on first use) and starts the
// background loop that pings, renews leases and refreshes the registry.
func New(opt Options) (*Cluster, error) {
	st := opt.Store
	if st == nil {
		var err error
		if st, err = NewRedis(opt.Config.Redis); err != nil {
			return nil, err
		}
	}
	c := &Cluster{store: st, cfg: opt.Config, node: opt.Node, log: opt.Logger,
		leases: map[string]*lease{}, stop: make(chan struct{}), done: make(chan struct{}),
		instance: rand.Text()[:12], freed: make(chan string, 64), listened: make(chan struct{})}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	c.node.Instance = c.instance
	c.node.IDTag = fmt.Sprintf("%06x", IDTag(c.node.Name))
	c.m = clusterMetrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{Name: "greyrelay_cluster_redis_up",
			Help: "1 while the shared Redis answers, 0 while the node works on local knowledge alone."}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "greyrelay_cluster_redis_commands_total",
			Help: "Redis round trips by purpose (load, publish, acquire, release, pace, renew, heartbeat, ping, suspensions, suppress, usage)."}, []string{"op"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "greyrelay_cluster_node_name_conflicts_total",
			Help: "Heartbeats that found this node's registry entry written by another running process with the same cluster.node_name since the previous heartbeat."}),
	}
	if opt.Registry != nil {
		for _, col := range []prometheus.Collector{c.m.up, c.m.commands, c.m.conflicts} {
			if err := opt.Registry.Register(col); err != nil {
				return nil, fmt.Errorf("cluster: metrics: %w", err)
			}
		}
	}
	c.ping()
	go c.loop()
	lctx, cancel := context.WithCancel(context.Background())
	c.unlisten = cancel
	go c.listen(lctx)
	return c, nil
}

// Close stops the background loop, releases this node's leases and
// removes its registry entry if this run wrote it last (best effort), and
// closes the client.
func (c *Cluster) Close() error {
	c.once.Do(func() { close(c.stop) })
	<-c.done
	c.unlisten()
	<-c.listened
	if c.up.Load() {
		ctx, cancel := c.ctx()
		c.leaseMu.Lock()
		for member, l := range c.leases {
			c.store.Drop(ctx, l.key, member)
		}
		clear(c.leases)
		c.leaseMu.Unlock()
		c.store.Unregister(ctx, c.node.Name, c.instance)
		cancel()
	}
	return c.store.Close()
}

// Up reports whether Redis answered the last call.
func (c *Cluster) Up() bool { return c.up.Load() }

// SetQueued tells the registry how many recipients wait on this node.
func (c *Cluster) SetQueued(n int) { c.queued.Store(int64(n)) }

func (c *Cluster) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.cfg.Redis.Timeout)
}

// count records one round trip for op.
func (c *Cluster) count(op string) { c.m.commands.WithLabelValues(op).Inc() }

// failed marks Redis down after a failed call.
func (c *Cluster) failed(op string, err error) bool {
	if err == nil {
		return false
	}
	if c.up.Swap(false) {
		c.m.up.Set(0)
		c.log.Warn("cluster: Redis unreachable; going on with local knowledge and local limits",
			zap.String("op", op), zap.Error(err))
	}
	return true
}

// ping checks Redis and marks it up when it answers.
func (c *Cluster) ping() {
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("ping")
	if err := c.store.Ping(ctx); err != nil {
		c.failed("ping", err)
		return
	}
	if !c.up.Swap(true) {
		c.m.up.Set(1)
		c.log.Info("cluster: Redis answers; sharing destination knowledge and limits")
	}
}

// loop pings while Redis is down; while it is up it renews leases and the
// registry entry every lease_ttl/3, and at once when a ping finds Redis
// back: the leases granted meanwhile count again from then on.
func (c *Cluster) loop() {
	defer close(c.done)
	tick := time.NewTicker(max(c.cfg.LeaseTTL/3, 100*time.Millisecond))
	defer tick.Stop()
	for {
		if !c.up.Load() {
			c.ping()
		}
		if c.up.Load() {
			c.renew()
			c.heartbeat()
		}
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
	}
}

// Nodes lists the registered nodes (those whose entry has not expired).
func (c *Cluster) Nodes(ctx context.Context) ([]Node, error) { return nodes(ctx, c.store) }

// ListNodes connects to the Redis r names only to list the registered
// nodes (`greyrelay cluster status`): it registers nothing itself.
func ListNodes(ctx context.Context, r config.Redis) ([]Node, error) {
	st, err := NewRedis(r)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	return nodes(ctx, st)
}

func nodes(ctx context.Context, st Store) ([]Node, error) {
	entries, err := st.Nodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: nodes: %w", err)
	}
	var out []Node
	for _, b := range entries {
		var n Node
		if json.Unmarshal(b, &n) == nil {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// newLeaseID names one lease of this node.
func (c *Cluster) newLeaseID() string {
	return c.node.Name + "/" + c.instance + "/" + strconv.FormatUint(c.seq.Add(1), 36)
}
