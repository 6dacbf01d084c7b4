package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// clusterSUT is several greyrelay nodes behind one HAProxy: the load goes
// to HAProxy, and the system is drained when every node's queue is.
type clusterSUT struct {
	name  string
	addr  string
	nodes []*greyrelay
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

var redisCommandsRe = regexp.MustCompile(`(?m)^greyrelay_cluster_redis_commands_total\{op="(load|publish|acquire|release)"\} (\S+)$`)

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
	rounds := fs.Int("rounds", 1, "rounds of the three setups")
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
		for _, setup := range clusterSetups {
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
	saveJSON(c.jsonPath, "cluster", all)
	return ctx.Err()
}

// clusterSetups are what `bench cluster` compares. "local limits" shares
// destination knowledge through Redis but keeps delivery.max_per_destination
// per node, which tells the cost of sharing from the effect of a limit
// that now holds for the three nodes together.
var clusterSetups = []string{"1 node", "3 nodes, HAProxy", "3 nodes, HAProxy, Redis, local limits", "3 nodes, HAProxy, Redis"}

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
	if cs != nil {
		before = cs.redisCommands()
	}
	res, err := measure(ctx, s, sk, roundSpec{Load: spec, DrainTimeout: 10 * time.Minute})
	note := ""
	if cs != nil && res.Accepted > 0 {
		note = fmt.Sprintf("%.3f Redis round trips per message (load, publish, acquire, release)", (cs.redisCommands()-before)/float64(res.Accepted))
	}
	return res, note, err
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
	var redisAddr string
	if redis {
		redisAddr = peers.StartRedis(t, "").Addr
	}
	cs := &clusterSUT{name: "greyrelay"}
	var backends []string
	for i := range 3 {
		addr, err := freeAddr(ipGreyrelay)
		if err != nil {
			return nil, err
		}
		o := grOptions{Routes: routes, ProxyListener: addr, Extra: map[string]any{}}
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
