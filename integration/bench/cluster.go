package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// clusterSUT is several greyrelay nodes behind one HAProxy: the load goes
// to HAProxy, and the system is drained when every node's queue is.
type clusterSUT struct {
	name  string
	addr  string
	nodes []*greyrelay
	redis *peers.Redis // nil: no Redis
}

func (c *clusterSUT) Name() string     { return c.name }
func (c *clusterSUT) SMTPAddr() string { return c.addr }
func (c *clusterSUT) QueueDir() string { return c.nodes[0].QueueDir() }
func (c *clusterSUT) Pids() []int {
	var out []int
	for _, n := range c.nodes {
		out = append(out, n.Pids()...)
	}
	return out
}

func (c *clusterSUT) QueueEmpty() (bool, error) {
	for _, n := range c.nodes {
		if ok, err := n.QueueEmpty(); !ok || err != nil {
			return false, err
		}
	}
	return true, nil
}

func (c *clusterSUT) Stop() error {
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.Stop())
	}
	return errors.Join(errs...)
}

var redisCommandsRe = regexp.MustCompile(`(?m)^greyrelay_cluster_redis_commands_total\{op="(load|publish|acquire|release|pace)"\} (\S+)$`)

// redisCommands sums the nodes' Redis round trips made for delivery work
// (the background ping, renewal and heartbeat aside).
func (c *clusterSUT) redisCommands() float64 {
	var sum float64
	for _, n := range c.nodes {
		_, b, err := n.get("/metrics")
		if err != nil {
			continue
		}
		for _, m := range redisCommandsRe.FindAllSubmatch(b, -1) {
			v, _ := strconv.ParseFloat(string(m[2]), 64)
			sum += v
		}
	}
	return sum
}

// runCluster is `bench cluster`: the same load against one node, against
// three nodes behind HAProxy (send-proxy-v2, round robin), and against the
// same three nodes sharing destination knowledge and connection limits
// through Redis.
func runCluster(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	c.register(fs)
	n := fs.Int("n", 20000, "messages per round")
	size := fs.Int("size", 4096, "message size")
	sessions := fs.Int("c", 30, "concurrent SMTP sessions")
	rounds := fs.Int("rounds", 1, "rounds of the setups (even rounds in reverse order)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	e, bin, err := c.setup()
	if err != nil {
		return err
	}
	defer e.close()
	machine(os.Stdout, e.root)
	spec := loadSpec{Messages: *n, Size: *size, Sessions: *sessions, Reuse: true, Pipelining: true, Timeout: 15 * time.Minute}
	var all []roundResult
	var notes []string
	for r := 1; r <= *rounds && ctx.Err() == nil; r++ {
		order := slices.Clone(clusterSetups)
		if r%2 == 0 {
			slices.Reverse(order) // alternate: no setup always runs first or last
		}
		for _, setup := range order {
			res, note, err := clusterOnce(ctx, e, bin, setup, spec)
			res.Round, res.SUT, res.Label = r, "greyrelay", setup
			all = append(all, res)
			if note != "" {
				notes = append(notes, fmt.Sprintf("round %d, %s: %s", r, setup, note))
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: cluster %s: %v\n", setup, err)
			}
		}
	}
	fmt.Printf("## cluster %v\n\n", args)
	for _, note := range notes {
		fmt.Printf("- %s\n", note)
	}
	fmt.Println()
	roundsTable(os.Stdout, all)
	fmt.Println()
	clusterRatios(all)
	saveJSON(c.jsonPath, "cluster", all)
	return ctx.Err()
}

// clusterSetups are what `bench cluster` compares. "local limits" shares
// destination knowledge through Redis but keeps delivery.max_per_destination
// per node, which tells the cost of sharing from the effect of a limit
// that now holds for the three nodes together.
//
// "shared 60, local cap 20" shares a limit of three times the per-node
// one with each node capped at the per-node one
// (delivery.max_per_destination_local): the same connections as three
// nodes without Redis, so what it costs is the sharing itself.
var clusterSetups = []string{"1 node", "3 nodes, HAProxy", "3 nodes, HAProxy, Redis, local limits", "3 nodes, HAProxy, Redis",
	"3 nodes, HAProxy, Redis, shared 60, local cap 20"}

// clusterOnce starts the setup on fresh queues, warms it up and measures.
func clusterOnce(ctx context.Context, e *env, bin, setup string, spec loadSpec) (roundResult, string, error) {
	sk, err := startSink(ipSink+":0", false)
	if err != nil {
		return roundResult{}, "", err
	}
	defer sk.close()
	routes := map[string]string{domainHealthy: sk.Addr}
	var s sut
	var cs *clusterSUT
	if setup == "1 node" {
		g, err := startGreyrelay(e, bin, grOptions{Routes: routes})
		if err != nil {
			return roundResult{}, "", err
		}
		s = g
	} else {
		cs, err = startCluster(e, bin, routes, setup)
		if err != nil {
			return roundResult{}, "", err
		}
		s = cs
	}
	defer s.Stop()
	if err := warmup(ctx, s, sk, 500, spec); err != nil {
		return roundResult{}, "", err
	}
	var before float64
	var stats0 map[string]int64
	if cs != nil {
		before = cs.redisCommands()
	}
	if cs != nil && cs.redis != nil {
		stats0, _ = cs.redis.CommandStats()
	}
	res, err := measure(ctx, s, sk, roundSpec{Load: spec, DrainTimeout: 10 * time.Minute})
	note := ""
	if cs != nil && cs.redis != nil && res.Accepted > 0 {
		note = fmt.Sprintf("%.3f round trips per message from the nodes' delivery work (load, publish, acquire, release, pace)",
			(cs.redisCommands()-before)/float64(res.Accepted))
		if stats, err := cs.redis.CommandStats(); err == nil {
			note += "; Redis INFO commandstats: " + commandsPer(stats0, stats, res.Accepted)
		}
	}
	return res, note, err
}

// commandsPer formats the commands Redis ran between two INFO
// commandstats readings per message (commands run inside scripts
// included, the INFO calls themselves left out), busiest first.
func commandsPer(before, after map[string]int64, msgs int) string {
	type kv struct {
		name string
		n    int64
	}
	var list []kv
	var total int64
	for name, n := range after {
		if d := n - before[name]; d > 0 && name != "info" {
			list = append(list, kv{name, d})
			total += d
		}
	}
	slices.SortFunc(list, func(a, b kv) int { return int(b.n - a.n) })
	parts := []string{fmt.Sprintf("%.3f commands per message in all", float64(total)/float64(msgs))}
	for _, e := range list {
		parts = append(parts, fmt.Sprintf("%s %.3f", e.name, float64(e.n)/float64(msgs)))
	}
	return strings.Join(parts, ", ")
}

// clusterRatios prints, for each round, the delivered and accepted rates
// of the Redis setups over the same round's three nodes without Redis:
// rounds alternate the setups, so a ratio within a round compares
// setups that ran under the same load of the shared machine.
func clusterRatios(all []roundResult) {
	byRound := map[int]map[string]roundResult{}
	for _, r := range all {
		if byRound[r.Round] == nil {
			byRound[r.Round] = map[string]roundResult{}
		}
		byRound[r.Round][r.Label] = r
	}
	fmt.Println("| round | setup | delivered/s ratio to \"3 nodes, HAProxy\" | accepted/s ratio |")
	fmt.Println("|---|---|---|---|")
	for round := 1; round <= len(byRound); round++ {
		base, ok := byRound[round]["3 nodes, HAProxy"]
		if !ok || base.DelivRate == 0 || base.AccRate == 0 {
			continue
		}
		for _, setup := range clusterSetups[2:] {
			if r, ok := byRound[round][setup]; ok {
				fmt.Printf("| %d | %s | %.2f | %.2f |\n", round, setup, r.DelivRate/base.DelivRate, r.AccRate/base.AccRate)
			}
		}
	}
	fmt.Println()
}

// startCluster starts three nodes (each with a plain listener for the
// harness's readiness check and a PROXY listener for HAProxy) and
// HAProxy; with redis, a redis-server too, shared by the nodes.
func startCluster(e *env, bin string, routes map[string]string, setup string) (*clusterSUT, error) {
	t := e.tb("cluster")
	redis := setup != "3 nodes, HAProxy"
	limits := "shared"
	if setup == "3 nodes, HAProxy, Redis, local limits" {
		limits = "local"
	}
	cs := &clusterSUT{name: "greyrelay"}
	var redisAddr string
	if redis {
		cs.redis = peers.StartRedis(t, "")
		redisAddr = cs.redis.Addr
	}
	var backends []string
	for i := range 3 {
		addr, err := freeAddr(ipGreyrelay)
		if err != nil {
			return nil, err
		}
		o := grOptions{Routes: routes, ProxyListener: addr, Extra: map[string]any{}}
		if setup == "3 nodes, HAProxy, Redis, shared 60, local cap 20" {
			o.Extra["delivery"] = map[string]any{"max_per_destination": 60, "max_per_destination_local": 20}
		}
		if redis {
			o.Extra["cluster"] = map[string]any{"node_name": fmt.Sprintf("node%d", i+1), "destination_limits": limits,
				"redis": map[string]any{"addresses": []string{redisAddr}}}
		}
		g, err := startGreyrelay(e, bin, o)
		if err != nil {
			return nil, err
		}
		cs.nodes = append(cs.nodes, g)
		backends = append(backends, addr)
	}
	cs.addr = peers.StartHAProxy(t, peers.HAProxyConfig{Backends: backends}).Addr
	return cs, nil
}
