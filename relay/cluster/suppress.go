package cluster

import (
	"crypto/rand"

	"github.com/greyrelay/greyrelay/relay/suppress"
)

// The suppression list's shared copy (suppress.Shared): every entry, a
// log of changes that each node follows, and an epoch that a Redis which
// lost its state lacks (relay/suppress, shared.go).

// suppressionLogLen is about how many changes the log keeps: a node that
// falls further behind (down for a long while) reads every entry instead.
const suppressionLogLen = 10000

// suppressionBatch is the most changes one Sync applies.
const suppressionBatch = 1000

// firstID is the log position before any change.
const firstID = "0-0"

// PublishSuppression implements suppress.Shared.
func (c *Cluster) PublishSuppression(key string, v []byte) bool {
	if !c.up.Load() {
		return false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("suppress")
	return !c.failed("suppress", c.store.SuppressionPut(ctx, key, v))
}

// SuppressionChanges implements suppress.Shared.
func (c *Cluster) SuppressionChanges(after string) (suppress.Changes, bool) {
	if !c.up.Load() {
		return suppress.Changes{}, false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("suppressions")
	from := after
	if from == "" {
		from = firstID
	}
	epoch, log, err := c.store.SuppressionLog(ctx, newEpoch(), from, suppressionBatch+1)
	if c.failed("suppressions", err) {
		return suppress.Changes{}, false
	}
	ch := suppress.Changes{Epoch: epoch, Last: after}
	if len(log) == 0 || log[0].ID != after {
		ch.Gap = true
		return ch, true
	}
	for _, e := range log[1:] {
		ch.Last = e.ID
		if e.Key != "" {
			ch.List = append(ch.List, suppress.Change{Key: e.Key, Value: e.Value})
		}
	}
	return ch, true
}

// SuppressionSnapshot implements suppress.Shared.
func (c *Cluster) SuppressionSnapshot() (suppress.Snapshot, bool) {
	if !c.up.Load() {
		return suppress.Snapshot{}, false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("suppressions")
	epoch, last, all, err := c.store.SuppressionSnapshot(ctx, newEpoch())
	if c.failed("suppressions", err) {
		return suppress.Snapshot{}, false
	}
	return suppress.Snapshot{Epoch: epoch, Last: last, Entries: all}, true
}

// ForgetSuppression implements suppress.Shared.
func (c *Cluster) ForgetSuppression(key string, v []byte) bool {
	if !c.up.Load() {
		return false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("suppress")
	return !c.failed("suppress", c.store.SuppressionForget(ctx, key, v))
}

func newEpoch() string { return rand.Text() }
