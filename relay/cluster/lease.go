package cluster

import (
	"strings"

	"github.com/redis/go-redis/v9"
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

// renewScript extends the leases (ARGV) still held in KEYS[1].
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return 1
`)

// leaseKey is the domain's set of connection leases.
func leaseKey(domain string) string { return "greyrelay:{" + strings.ToLower(domain) + "}:leases" }

// Acquire asks for one of limit connection slots to domain across the
// cluster. It returns a release function and true when the slot is this
// node's; false when every slot is held. With Redis down it grants the
// slot (the node's own limit still holds) and release does nothing.
func (c *Cluster) Acquire(domain string, limit int) (release func(), ok bool) {
	if c.cfg.DestinationLimits == LimitsLocal || !c.up.Load() {
		return func() {}, true
	}
	key, member := leaseKey(domain), c.newLeaseID()
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("acquire")
	got, err := acquireScript.Run(ctx, c.rdb, []string{key}, limit, member, c.cfg.LeaseTTL.Milliseconds()).Int()
	if c.failed("acquire", err) {
		return func() {}, true
	}
	if got != 1 {
		return nil, false
	}
	c.leaseMu.Lock()
	c.leases[member] = key
	c.leaseMu.Unlock()
	return func() { c.release(key, member) }, true
}

func (c *Cluster) release(key, member string) {
	c.leaseMu.Lock()
	delete(c.leases, member)
	c.leaseMu.Unlock()
	if !c.up.Load() {
		return // it expires on its own
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("release")
	c.failed("release", c.rdb.ZRem(ctx, key, member).Err())
}

// renew extends every lease this node holds, one script per domain, all in
// one pipeline.
func (c *Cluster) renew() {
	c.leaseMu.Lock()
	byKey := map[string][]any{}
	for member, key := range c.leases {
		byKey[key] = append(byKey[key], member)
	}
	c.leaseMu.Unlock()
	if len(byKey) == 0 {
		return
	}
	ctx, cancel := c.ctx()
	defer cancel()
	pipe := c.rdb.Pipeline()
	for key, members := range byKey {
		renewScript.Eval(ctx, pipe, []string{key}, append([]any{c.cfg.LeaseTTL.Milliseconds()}, members...)...)
	}
	c.count("renew")
	_, err := pipe.Exec(ctx)
	c.failed("renew", err)
}

// Destination limit scopes (cluster.destination_limits).
const (
	LimitsShared = "shared" // delivery.max_per_destination holds across all nodes
	LimitsLocal  = "local"  // it holds per node
)
