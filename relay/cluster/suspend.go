package cluster

import (
	"encoding/json"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// suspendKey is the hash of the operator's suspensions, one field per
// canonical domain. One key keeps the whole set one read
// (delivery.SuspensionStore: every node reads it every few seconds).
const suspendKey = "greyrelay:suspended"

// suspension is a queue.Suspension as the hash stores it.
type suspension struct {
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until,omitzero"`
	Node   string    `json:"node,omitempty"`
}

// Suspensions returns every shared suspension; ok is false while Redis is
// away.
func (c *Cluster) Suspensions() ([]queue.Suspension, bool) {
	if !c.up.Load() {
		return nil, false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("suspensions")
	m, err := c.rdb.HGetAll(ctx, suspendKey).Result()
	if c.failed("suspensions", err) {
		return nil, false
	}
	out := make([]queue.Suspension, 0, len(m))
	for domain, v := range m {
		var s suspension
		if json.Unmarshal([]byte(v), &s) != nil {
			continue
		}
		out = append(out, queue.Suspension{Domain: domain, Reason: s.Reason, Since: s.Since, Until: s.Until, Node: s.Node})
	}
	return out, true
}

// PutSuspension shares s; false when Redis is away.
func (c *Cluster) PutSuspension(s queue.Suspension) bool {
	if !c.up.Load() {
		return false
	}
	b, err := json.Marshal(suspension{Reason: s.Reason, Since: s.Since, Until: s.Until, Node: s.Node})
	if err != nil {
		return false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("suspend")
	return !c.failed("suspend", c.rdb.HSet(ctx, suspendKey, s.Domain, b).Err())
}

// DeleteSuspension removes the shared suspension of domain; false when
// Redis is away.
func (c *Cluster) DeleteSuspension(domain string) bool {
	if !c.up.Load() {
		return false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("resume")
	return !c.failed("resume", c.rdb.HDel(ctx, suspendKey, domain).Err())
}
