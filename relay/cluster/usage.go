package cluster

// AddUsage shares the user_limits counts (smtpd.UsageStore): every node
// adds what it counted and reads the sum, so that an identity's quota
// holds for the cluster, and a restarted node finds its counts.
func (c *Cluster) AddUsage(id string, add map[int64][2]int64, since int64) (map[int64][2]int64, bool) {
	if !c.up.Load() {
		return nil, false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("usage")
	got, err := c.store.AddUsage(ctx, id, add, since)
	if c.failed("usage", err) {
		return nil, false
	}
	return got, true
}
