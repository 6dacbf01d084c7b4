package cluster

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// sharedTTL is how long a shared destination record lives without being
// written again: longer than any retry lifetime, so a learned delay
// outlives the episodes that taught it, yet a domain nobody mails any more
// does not stay in Redis for ever.
const sharedTTL = 30 * 24 * time.Hour

// record is the shared part of a queue.Destination: what another node's
// first message to the domain should know (the greylisting window, the
// throttle and its learned pace, dead hosts). Per-node counters and probes
// stay local. The pace goes whole: the gap between starts is its interval
// doubled for each refusal since the last accepted message, so a node
// given the interval without the refusals would start faster than the
// node that was refused.
type record struct {
	Greylists    bool          `json:"greylists,omitempty"`
	LearnedDelay time.Duration `json:"learned_delay,omitempty"`
	GreylistLow  time.Duration `json:"greylist_low,omitempty"`
	// GreylistLearned: when the window (GreylistLow, LearnedDelay) last
	// changed; the window learned last wins (delivery's adoptShared).
	GreylistLearned time.Time            `json:"greylist_learned,omitzero"`
	PaceInterval    time.Duration        `json:"pace_interval,omitempty"`
	PaceBase        time.Duration        `json:"pace_base,omitempty"`
	PaceRefusals    int                  `json:"pace_refusals,omitempty"`
	PaceRefused     time.Time            `json:"pace_refused,omitzero"`
	LastGreylisted  time.Time            `json:"last_greylisted,omitzero"`
	ThrottleLevel   int                  `json:"throttle_level,omitempty"`
	ThrottledUntil  time.Time            `json:"throttled_until,omitzero"`
	DeadHosts       map[string]time.Time `json:"dead_hosts,omitempty"`
	LastReply       queue.Reply          `json:"last_reply,omitzero"`
	// An MX host's record ("[address]"): a reply without a greylisting
	// text that behaved like greylisting there, with its evidence.
	GreyLike        string    `json:"grey_like,omitempty"`
	GreyLikePassed  int       `json:"grey_like_passed,omitempty"`
	GreyLikeRefused int       `json:"grey_like_refused,omitempty"`
	Updated         time.Time `json:"updated"`
	Node            string    `json:"node"`
}

// Load returns the shared record of domain as a queue.Destination holding
// only the shared fields (without the pace under
// cluster.destination_limits local), its PaceRun the sum of the other
// nodes' runs (othersRun); ok is false if there is none or Redis is down.
func (c *Cluster) Load(domain string) (queue.Destination, bool) {
	if !c.up.Load() {
		return queue.Destination{}, false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("load")
	b, err := c.store.Record(ctx, strings.ToLower(domain))
	if c.failed("load", err) || b == nil {
		return queue.Destination{}, false
	}
	var r record
	if json.Unmarshal(b, &r) != nil {
		return queue.Destination{}, false
	}
	d := queue.Destination{Domain: domain, Greylists: r.Greylists, LearnedDelay: r.LearnedDelay,
		GreylistLow: r.GreylistLow, GreylistLearned: r.GreylistLearned, PaceInterval: r.PaceInterval, PaceBase: r.PaceBase, PaceRefusals: r.PaceRefusals,
		PaceRefused: r.PaceRefused, LastGreylisted: r.LastGreylisted, ThrottleLevel: r.ThrottleLevel, ThrottledUntil: r.ThrottledUntil,
		DeadHosts: r.DeadHosts, LastReply: r.LastReply, Updated: r.Updated,
		GreyLike: r.GreyLike, GreyLikePassed: r.GreyLikePassed, GreyLikeRefused: r.GreyLikeRefused}
	if c.cfg.DestinationLimits == LimitsLocal {
		// Each node paces on its own: another node's pace measures what
		// the destination allows that node, and its refusals are not
		// this node's. Adopted, they added up: every node's refusals
		// doubled the gap of all, and a node that was never refused
		// since its last accepted message waited out the others' gap
		// (minutes, where its own pace said a few seconds).
		d.PaceInterval, d.PaceBase, d.PaceRefusals, d.PaceRefused = 0, 0, 0, time.Time{}
	} else if opening(d) {
		// Only an opening's end uses the runs: no second read otherwise.
		d.PaceRun = c.othersRun(ctx, domain)
	}
	return d, true
}

// runSpan is how old a run of accepted messages may be and still count
// (backoff's paceRunSpan): an older one says little about the burst that
// filled a destination's window.
const runSpan = 10 * time.Minute

// run is one node's run of accepted messages to a domain before it first
// refused (queue.Destination's PaceRun and PaceRunStart).
type run struct {
	N     int       `json:"n"`
	Start time.Time `json:"start"`
}

// opening reports whether d's pace is in its opening: refused, with no
// rate learned yet (backoff.Pace: an interval without a base). Only
// then are the nodes' runs written and read.
func opening(d queue.Destination) bool { return d.PaceInterval > 0 && d.PaceBase <= 0 }

// runKeep is how long the nodes' runs to a domain are kept after the
// last was written: an opening's probes may go on for an hour (backoff's
// longest gap) after the runs that filled the window.
const runKeep = time.Hour + runSpan

// othersRun is the sum of the other nodes' runs to domain in the latest
// burst: those that began within runSpan of the latest run's start (any
// node's, this one's too), so that runs of an earlier episode still kept
// do not count. Each node counts only the messages it sent, so the node
// whose probe ends a throttling destination's opening, taking the rate
// from its own run alone, took a third of the rate for three nodes that
// filled the window together (backoff.Pace.OnAccepted).
func (c *Cluster) othersRun(ctx context.Context, domain string) int {
	c.count("runs")
	m, err := c.store.Runs(ctx, strings.ToLower(domain))
	if c.failed("runs", err) {
		return 0
	}
	runs := map[string]run{}
	var latest time.Time
	for node, b := range m {
		var r run
		if json.Unmarshal(b, &r) != nil || r.N <= 0 {
			continue
		}
		runs[node] = r
		if r.Start.After(latest) {
			latest = r.Start
		}
	}
	n := 0
	for node, r := range runs {
		if node != c.node.Name && !r.Start.Before(latest.Add(-runSpan)) {
			n += r.N
		}
	}
	return n
}

// Publish stores the shared part of d, which this node just changed,
// unless the store holds a record learned later (Store.SetRecord compares
// their versions: the later refusal that slowed the pace first, Updated
// second): a node publishes once its commit is decided, which may come
// after another node published something newer, and a node that has not
// heard of another's refusal yet learns nothing that should undo it.
// Otherwise the later record replaces the earlier one whole; every writer
// merged the shared record when it loaded the domain, so it rarely drops
// anything another node learned.
func (c *Cluster) Publish(d queue.Destination) {
	if !c.up.Load() {
		return
	}
	r := record{Greylists: d.Greylists, LearnedDelay: d.LearnedDelay, LastGreylisted: d.LastGreylisted,
		GreylistLow: d.GreylistLow, GreylistLearned: d.GreylistLearned, PaceInterval: d.PaceInterval, PaceBase: d.PaceBase, PaceRefusals: d.PaceRefusals,
		PaceRefused: d.PaceRefused, ThrottleLevel: d.ThrottleLevel, ThrottledUntil: d.ThrottledUntil, DeadHosts: d.DeadHosts,
		LastReply: d.LastReply, Updated: d.Updated, Node: c.node.Name,
		GreyLike: d.GreyLike, GreyLikePassed: d.GreyLikePassed, GreyLikeRefused: d.GreyLikeRefused}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	ctx, cancel := c.ctx()
	defer cancel()
	c.count("publish")
	c.failed("publish", c.store.SetRecord(ctx, strings.ToLower(d.Domain), b,
		d.PaceRefused, d.Updated, sharedTTL))
	if d.PaceRun > 0 && opening(d) && c.cfg.DestinationLimits != LimitsLocal {
		// The run that filled the window: the others add it to theirs.
		if b, err := json.Marshal(run{N: d.PaceRun, Start: d.PaceRunStart}); err == nil {
			c.count("setrun")
			c.failed("setrun", c.store.SetRun(ctx, strings.ToLower(d.Domain), c.node.Name, b, runKeep))
		}
	}
}
