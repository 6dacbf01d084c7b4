package cluster

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// suspension is a queue.Suspension as the hash stores it.
type suspension struct {
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until,omitzero"`
	Node   string    `json:"node,omitempty"`
}

// Suspensions returns every shared suspension; ok is false while the store is
// away.
func (c *Cluster) Suspensions() ([]queue.Suspension, bool) {
	if !c.up.Load() {
		return nil, false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("suspensions")
	m, err := c.store.Suspensions(ctx)
	if c.failed("suspensions", err) {
		return nil, false
	}
	out := make([]queue.Suspension, 0, len(m))
	for domain, v := range m {
		var s suspension
		if json.Unmarshal(v, &s) != nil {
			continue
		}
		out = append(out, queue.Suspension{Domain: domain, Reason: s.Reason, Since: s.Since, Until: s.Until, Node: s.Node})
	}
	return out, true
}

// PutSuspension shares s; false when the store is away.
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
	return !c.failed("suspend", c.store.SetSuspension(ctx, strings.ToLower(s.Domain), b))
}

// DeleteSuspension removes the shared suspension of domain; false when
// the store is away.
func (c *Cluster) DeleteSuspension(domain string) bool {
	if !c.up.Load() {
		return false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("resume")
	return !c.failed("resume", c.store.DeleteSuspension(ctx, strings.ToLower(domain)))
}
