package cluster

import (
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// paceScript reserves a domain's next paced transaction start: KEYS[1]
// holds the earliest instant (microseconds, Redis's clock) the next start
// may take, ARGV[1] the interval in microseconds. It returns how long the
// caller waits for the start it reserved. This is a token bucket holding
// one token, refilled once per interval (GCRA): starts across every node
// are at least the interval apart, and an idle domain starts at once.
var paceScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local iv = tonumber(ARGV[1])
local nxt = tonumber(redis.call('GET', KEYS[1]) or '0')
local at = math.max(now, nxt)
redis.call('SET', KEYS[1], string.format('%d', at + iv), 'PX', math.floor((at + iv - now) / 1000) + 1000)
return at - now
`)

// paceKey is the domain's next free paced start.
func paceKey(domain string) string { return "greyrelay:{" + strings.ToLower(domain) + "}:pace" }

// Pace reserves the next start of a transaction to domain under a
// cluster-wide pace of one start per interval, and returns how long the
// caller must wait for it. ok is false with Redis down or
// cluster.destination_limits local: the caller paces on its own.
func (c *Cluster) Pace(domain string, interval time.Duration) (wait time.Duration, ok bool) {
	if c.cfg.DestinationLimits == LimitsLocal || !c.up.Load() || interval <= 0 {
		return 0, false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("pace")
	us, err := paceScript.Run(ctx, c.rdb, []string{paceKey(domain)}, interval.Microseconds()).Int64()
	if c.failed("pace", err) {
		return 0, false
	}
	return time.Duration(us) * time.Microsecond, true
}
