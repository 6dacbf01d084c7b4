package cluster

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// acquireScript takes a connection slot: KEYS[1] is the domain's lease set,
// ARGV the limit, the member and the lease's lifetime in milliseconds.
// Expiry is Redis's own clock, so the nodes' clocks need not agree.
var acquireScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
return 1
`)

// renewScript extends the leases a node holds in KEYS[1] and registers
// again those the set lacks: ARGV[1] is the lifetime in milliseconds, then
// pairs of member and limit. A lease the set lacks was granted while Redis
// was away, or Redis lost it (a restart without persistence, a failover
// to a replica that had not seen it). It is added only while fewer than
// its limit are held, after every lease the set still has is counted, so
// re-registering never pushes a domain past its limit. It returns the
// members added and the members refused (no room).
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local absent = {}
for i = 2, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
  else
    table.insert(absent, i)
  end
end
local added, refused = {}, {}
for _, i in ipairs(absent) do
  if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[i + 1]) then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
    table.insert(added, ARGV[i])
  else
    table.insert(refused, ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return {added, refused}
`)

// releaseScript gives a slot back: KEYS[1] is the domain's lease set, ARGV
// the member, the notification channel and the domain. A slot that was
// still held is announced on the channel in the same round trip, so nodes
// waiting for one try again at once instead of at their next poll.
var releaseScript = redis.NewScript(`
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 1
`)

// freedChannel carries the domain of every released connection slot.
const freedChannel = "greyrelay:freed"

// leaseKey is the domain's set of connection leases.
func leaseKey(domain string) string { return "greyrelay:{" + strings.ToLower(domain) + "}:leases" }

// lease is one connection slot this node holds.
type lease struct {
	key    string        // the domain's lease set
	domain string        // as Acquire was given it
	limit  int           // the limit it was granted under
	lost   chan struct{} // closed when renew found no room for it
}

// Acquire asks for one of limit connection slots to domain across the
// cluster. It returns a release function and true when the slot is this
// node's; false when every slot is held. With Redis down it grants the
// slot (the node's own limit still holds) and keeps it, so that the next
// renewal registers it once Redis answers again.
//
// lost is closed when the slot is taken back: it was granted while Redis
// was away, and when Redis answered again the domain's limit was already
// held by other leases. The holder should close its connection at its
// next message boundary and release the slot. It is never closed for a
// slot Redis granted, nor with cluster.destination_limits local.
func (c *Cluster) Acquire(domain string, limit int) (release func(), lost <-chan struct{}, ok bool) {
	if c.cfg.DestinationLimits == LimitsLocal {
		return func() {}, nil, true
	}
	key, member := leaseKey(domain), c.newLeaseID()
	l := &lease{key: key, domain: domain, limit: limit, lost: make(chan struct{})}
	if c.up.Load() {
		ctx, cancel := c.ctx()
		defer cancel()
		c.count("acquire")
		got, err := acquireScript.Run(ctx, c.rdb, []string{key}, limit, member, c.cfg.LeaseTTL.Milliseconds()).Int()
		if !c.failed("acquire", err) && got != 1 {
			return nil, nil, false
		}
		// Granted, or Redis failed: the renewal registers it (again).
	}
	c.leaseMu.Lock()
	c.leases[member] = l
	c.leaseMu.Unlock()
	return func() { c.release(member, l) }, l.lost, true
}

func (c *Cluster) release(member string, l *lease) {
	c.leaseMu.Lock()
	delete(c.leases, member)
	c.leaseMu.Unlock()
	if !c.up.Load() {
		return // it expires on its own
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("release")
	c.failed("release", releaseScript.Run(ctx, c.rdb, []string{l.key}, member, freedChannel, strings.ToLower(l.domain)).Err())
}

// renew extends every lease this node holds, one script per domain, all in
// one pipeline, and registers those Redis lacks while the limit allows.
// The ones it has no room for are taken back (their lost channel closes).
// A lease released while the pipeline ran and added by it is removed
// again, so the race leaves no slot held for nobody.
func (c *Cluster) renew() {
	c.leaseMu.Lock()
	byKey := map[string][]any{}
	for member, l := range c.leases {
		byKey[l.key] = append(byKey[l.key], member, l.limit)
	}
	c.leaseMu.Unlock()
	if len(byKey) == 0 {
		return
	}
	ctx, cancel := c.ctx()
	defer cancel()
	pipe := c.rdb.Pipeline()
	cmds := make(map[string]*redis.Cmd, len(byKey))
	for key, members := range byKey {
		cmds[key] = renewScript.Eval(ctx, pipe, []string{key}, append([]any{c.cfg.LeaseTTL.Milliseconds()}, members...)...)
	}
	c.count("renew")
	if _, err := pipe.Exec(ctx); c.failed("renew", err) {
		return
	}
	var stale []string // added, but released meanwhile
	c.leaseMu.Lock()
	for key, cmd := range cmds {
		added, refused := renewResult(cmd)
		for _, m := range added {
			if c.leases[m] == nil {
				stale = append(stale, key, m)
			}
		}
		for _, m := range refused {
			if l := c.leases[m]; l != nil {
				delete(c.leases, m)
				close(l.lost)
				c.log.Warn("cluster: a connection opened while Redis was away exceeds the shared limit; closing it after its current message",
					zap.String("domain", l.domain), zap.Int("limit", l.limit))
			}
		}
	}
	c.leaseMu.Unlock()
	for i := 0; i < len(stale); i += 2 {
		c.count("release")
		c.failed("release", c.rdb.ZRem(ctx, stale[i], stale[i+1]).Err())
	}
}

// renewResult reads renewScript's answer: the members added and refused.
func renewResult(cmd *redis.Cmd) (added, refused []string) {
	v, _ := cmd.Slice()
	if len(v) != 2 {
		return nil, nil
	}
	return strs(v[0]), strs(v[1])
}

func strs(v any) []string {
	vs, _ := v.([]any)
	out := make([]string, 0, len(vs))
	for _, x := range vs {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// Destination limit scopes (cluster.destination_limits).
const (
	LimitsShared = "shared" // delivery.max_per_destination holds across all nodes
	LimitsLocal  = "local"  // it holds per node
)

// Freed delivers the domain of each connection slot released by any node
// (this one included), for a node waiting for a slot to try again. A
// notification lost (the buffer full, Redis away, a lease that merely
// expired) only delays the waiter until its next poll.
func (c *Cluster) Freed() <-chan string { return c.freed }

// listen forwards the slot notifications to c.freed until ctx ends; the
// subscription reconnects by itself after Redis comes back.
func (c *Cluster) listen(ctx context.Context) {
	defer close(c.listened)
	ps := c.rdb.Subscribe(ctx, freedChannel)
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			select {
			case c.freed <- m.Payload:
			default:
			}
		}
	}
}
