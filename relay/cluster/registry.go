package cluster

import (
	"encoding/json"
	"time"

	"go.uber.org/zap"
)

// registry is what the heartbeat remembers between two of its writes. Only
// the background loop touches it.
type registry struct {
	wrote bool // this run has written its entry at least once
	// took is the entry this run's first heartbeat replaced when another
	// process had written it: the same bytes found again later are that
	// entry restored (a Sentinel failover to a replica that lagged), not
	// a new write.
	took string
	// other is the last entry another process wrote between two of this
	// run's heartbeats, and last when that was seen; zero while there is
	// no conflict.
	other Node
	last  time.Time
}

// heartbeat refreshes this node's registry entry and looks at the entry it
// replaced to notice another running process with the same node name.
func (c *Cluster) heartbeat() {
	now := time.Now().UTC()
	n := c.node
	n.Seen, n.Queued = now, int(c.queued.Load())
	if !c.reg.last.IsZero() {
		n.ConflictWith = c.reg.other.AdminURL
	}
	b, err := json.Marshal(n)
	if err != nil {
		return
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("heartbeat")
	prev, err := c.store.Heartbeat(ctx, n.Name, b, 3*c.cfg.LeaseTTL)
	if c.failed("heartbeat", err) {
		return
	}
	c.replaced(string(prev), now)
}

// replaced judges the entry a heartbeat replaced.
//
// Two processes with one node name overwrite each other's entry: the
// registry shows one of them at a time and commands that address nodes
// by name (queue show -cluster) reach whichever wrote last. Every
// heartbeat sees what it replaced, so an entry of another instance found
// by any heartbeat after this run's first was written since our last one:
// a second live process, reported as an error. The first heartbeat cannot
// tell: an entry still fresh (it lives 3×lease_ttl) may be a previous run
// of this very node that crashed, here or on another host that took its
// queue over. That is why serve does not refuse to start on finding one:
// a refusal would turn a crash-restart or a moved queue into an outage of
// up to 3×lease_ttl (or a restart loop), while waiting one heartbeat
// tells a live writer from a dead one without any false alarm.
func (c *Cluster) replaced(prev string, now time.Time) {
	first := !c.reg.wrote
	c.reg.wrote = true
	var p Node
	if prev == "" || json.Unmarshal([]byte(prev), &p) != nil || p.Instance == c.instance {
		c.settle(now)
		return
	}
	if first {
		c.reg.took = prev
		if p.AdminURL != c.node.AdminURL {
			c.log.Warn("cluster: replaced a fresh registry entry of this node name written by another process; "+
				"if it still runs, two nodes share the name and this will be reported within a heartbeat",
				zap.String("node_name", c.node.Name), zap.String("admin_url", c.node.AdminURL),
				zap.String("other_admin_url", p.AdminURL), zap.Time("other_seen", p.Seen))
		}
		return
	}
	if prev == c.reg.took {
		return
	}
	c.m.conflicts.Inc()
	if c.reg.last.IsZero() {
		c.log.Error("cluster: another running process uses this node name: both overwrite one registry entry, "+
			"so cluster status and queue show -cluster see only one of them; give each node its own cluster.node_name",
			zap.String("node_name", c.node.Name), zap.String("admin_url", c.node.AdminURL),
			zap.String("other_admin_url", p.AdminURL), zap.String("other_instance", p.Instance),
			zap.Time("other_started", p.Started), zap.String("other_version", p.Version))
	}
	c.reg.other, c.reg.last = p, now
}

// settle ends a conflict once no other process has written the entry for
// 3×lease_ttl, the lifetime of an entry: a live writer with the same
// configuration writes every lease_ttl/3, so the two heartbeats' order may
// swap now and then without the conflict ending and being logged again.
func (c *Cluster) settle(now time.Time) {
	if c.reg.last.IsZero() || now.Sub(c.reg.last) < 3*c.cfg.LeaseTTL {
		return
	}
	c.log.Info("cluster: no other process has written this node's registry entry for 3×lease_ttl; the node name conflict is over",
		zap.String("node_name", c.node.Name), zap.String("other_admin_url", c.reg.other.AdminURL))
	c.reg.other, c.reg.last = Node{}, time.Time{}
}
