package cluster

import (
	"context"
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
	return func() { c.release(domain, key, member) }, true
}

func (c *Cluster) release(domain, key, member string) {
	c.leaseMu.Lock()
	delete(c.leases, member)
	c.leaseMu.Unlock()
	if !c.up.Load() {
		return // it expires on its own
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("release")
	c.failed("release", releaseScript.Run(ctx, c.rdb, []string{key}, member, freedChannel, strings.ToLower(domain)).Err())
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
