package cluster

import (
	"context"
	"strings"

	"go.uber.org/zap"
)

// lease is one connection slot this node holds.
type lease struct {
	key    string        // the domain, lower-cased: the Store's name for its leases
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
	key, member := strings.ToLower(domain), c.newLeaseID()
	l := &lease{key: key, domain: domain, limit: limit, lost: make(chan struct{})}
	if c.up.Load() {
		ctx, cancel := c.ctx()
		defer cancel()
		c.count("acquire")
		got, err := c.store.Acquire(ctx, key, member, limit, c.cfg.LeaseTTL)
		if !c.failed("acquire", err) && !got {
			return nil, nil, false
		}
		// Granted, or Redis failed: the renewal registers it (again).
	}
	c.leaseMu.Lock()
	c.leases[member] = l
	c.leaseMu.Unlock()
	return func() { c.release(member, l) }, l.lost, true
}

// release gives a slot back. A slot that was still held is announced in
// the same round trip, so nodes waiting for one try again at once instead
// of at their next poll.
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
	c.failed("release", c.store.Release(ctx, l.key, member))
}

// renew extends every lease this node holds, all domains in one round
// trip, and registers those Redis lacks while the limit allows. The ones
// it has no room for are taken back (their lost channel closes). A lease
// released while the renewal ran and added by it is removed again, so
// the race leaves no slot held for nobody.
func (c *Cluster) renew() {
	c.leaseMu.Lock()
	held := map[string]map[string]int{}
	for member, l := range c.leases {
		if held[l.key] == nil {
			held[l.key] = map[string]int{}
		}
		held[l.key][member] = l.limit
	}
	c.leaseMu.Unlock()
	if len(held) == 0 {
		return
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("renew")
	added, refused, err := c.store.Renew(ctx, c.cfg.LeaseTTL, held)
	if c.failed("renew", err) {
		return
	}
	var stale []string // added, but released meanwhile
	c.leaseMu.Lock()
	for key, members := range added {
		for _, m := range members {
			if c.leases[m] == nil {
				stale = append(stale, key, m)
			}
		}
	}
	for _, members := range refused {
		for _, m := range members {
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
		c.failed("release", c.store.Drop(ctx, stale[i], stale[i+1]))
	}
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
// Redis subscription reconnects by itself after Redis comes back.
func (c *Cluster) listen(ctx context.Context) {
	defer close(c.listened)
	c.store.Subscribe(ctx, func(domain string) {
		select {
		case c.freed <- domain:
		default:
		}
	})
}
