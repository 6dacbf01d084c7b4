package cluster

import (
	"strings"
	"time"
)

// Pace finds the next start of a transaction to domain under a
// cluster-wide pace of one start per interval, reserves it if it comes
// within ahead, and returns how long the caller must wait for it (a wait
// longer than ahead is not reserved: ask again then). ok is false with
// Redis down or cluster.destination_limits local: the caller paces on
// its own.
func (c *Cluster) Pace(domain string, interval, ahead time.Duration) (wait time.Duration, ok bool) {
	if c.cfg.DestinationLimits == LimitsLocal || !c.up.Load() || interval <= 0 {
		return 0, false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("pace")
	wait, err := c.store.Pace(ctx, strings.ToLower(domain), interval, ahead)
	if c.failed("pace", err) {
		return 0, false
	}
	return wait, true
}
