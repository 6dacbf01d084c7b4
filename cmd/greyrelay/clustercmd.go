package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/admin/admincli"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
	"github.com/greyrelay/greyrelay/relay/cluster"
)

// clusterCmd runs `greyrelay cluster status`: the nodes registered in the
// shared Redis, read from Redis itself so that it works while any node is
// down. Like `config check` finding an error, a node name that two running
// processes share is a configuration problem: the command prints
// everything, then exits with status 2, so that a script or a monitoring
// check notices without parsing the output.
func clusterCmd(args []string, stdout, stderr io.Writer) error {
	const usage = "usage: greyrelay cluster status [-config FILE] [-json]"
	path := ""
	if len(args) >= 2 && (args[0] == "-config" || args[0] == "--config") {
		path, args = args[1], args[2:] // where the command line's -config is put (configFirst)
	}
	if len(args) == 0 || args[0] != "status" {
		return &exitError{2, errors.New(usage)}
	}
	fs := flag.NewFlagSet("cluster status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return &exitError{2, err}
	}
	if fs.NArg() > 0 {
		return &exitError{2, errors.New(usage)}
	}
	nodes, err := clusterNodes(path, stderr, "cluster.redis.addresses is empty: this node is on its own")
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(map[string]any{"nodes": nodes})
	} else {
		err = printNodes(stdout, nodes)
	}
	if err != nil {
		return err
	}
	return nameConflicts(nodes)
}

// nameConflicts is the status-2 error naming every node name that two
// running processes share, and every queue ID tag that two nodes share,
// or nil when there is none.
func nameConflicts(nodes []cluster.Node) error {
	var names []string
	for _, n := range nodes {
		if n.ConflictWith != "" {
			names = append(names, n.Name)
		}
	}
	var errs []string
	if len(names) > 0 {
		errs = append(errs, "node name(s) used by two running processes: "+strings.Join(names, ", "))
	}
	for tag, names := range sharedTags(nodes) {
		errs = append(errs, fmt.Sprintf("nodes %s share the queue ID tag %s", strings.Join(names, " and "), tag))
	}
	if len(errs) == 0 {
		return nil
	}
	slices.Sort(errs)
	return &exitError{2, fmt.Errorf("cluster status: %s", strings.Join(errs, "; "))}
}

// sharedTags maps each queue ID tag that several nodes use to their
// names. Tags come from hashing node names (cluster.IDTag), so two names
// may meet: their nodes could then hand out the same queue ID.
func sharedTags(nodes []cluster.Node) map[string][]string {
	by := map[string][]string{}
	for _, n := range nodes {
		if n.IDTag != "" {
			by[n.IDTag] = append(by[n.IDTag], n.Name)
		}
	}
	maps.DeleteFunc(by, func(_ string, names []string) bool { return len(names) < 2 })
	return by
}

// printNodes writes the registry as a table, then a line for each node
// name that two running processes share: the registry can hold only one
// of them, so the table alone would hide the other.
func printNodes(w io.Writer, nodes []cluster.Node) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tID TAG\tADMIN\tVERSION\tQUEUED\tUP SINCE\tLAST SEEN")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s ago\n", n.Name, cmp.Or(n.IDTag, "-"), n.AdminURL, n.Version, n.Queued,
			n.Started.Format(time.RFC3339), time.Since(n.Seen).Round(time.Second))
	}
	fmt.Fprintf(tw, "%d node(s)\n", len(nodes))
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range nodes {
		if n.ConflictWith != "" {
			fmt.Fprintf(w, "CONFLICT: node name %s is used by two running processes (admin %s and %s): give each node its own cluster.node_name\n",
				n.Name, n.AdminURL, n.ConflictWith)
		}
	}
	for tag, names := range sharedTags(nodes) {
		fmt.Fprintf(w, "CONFLICT: nodes %s share the queue ID tag %s (their names hash alike) and may hand out the same queue IDs: rename one of them\n",
			strings.Join(names, " and "), tag)
	}
	return nil
}

// queueListCluster runs `queue list` on every node registered in the
// shared Redis, through each node's admin API with this configuration's
// token (the nodes share one): a section per node, or with -json one
// object per node and line ({"node", "admin_url", "list"}).
func queueListCluster(args, rest []string, local *adminclient.Client, stdout, stderr io.Writer) error {
	path := ""
	if len(args) >= 2 && (args[0] == "-config" || args[0] == "--config") {
		path = args[1]
	}
	nodes, err := clusterNodes(path, nil, "queue list -cluster: cluster.redis.addresses is empty")
	if err != nil {
		return err
	}
	asJSON := slices.Contains(rest, "-json")
	var failed []string
	for _, n := range nodes {
		c := &adminclient.Client{Base: n.AdminURL, Token: local.Token, HTTP: local.HTTP}
		var buf bytes.Buffer
		if err := admincli.RunQueue(rest, c, &buf, stderr); err != nil {
			fmt.Fprintf(stderr, "node %s (%s): %v\n", n.Name, n.AdminURL, err)
			failed = append(failed, n.Name)
			continue
		}
		if asJSON {
			line, err := json.Marshal(map[string]any{"node": n.Name, "admin_url": n.AdminURL, "list": json.RawMessage(buf.Bytes())})
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s\n", line)
			continue
		}
		fmt.Fprintf(stdout, "== node %s (%s)\n%s\n", n.Name, n.AdminURL, buf.Bytes())
	}
	if len(failed) > 0 {
		return fmt.Errorf("queue list -cluster: no answer from %v", failed)
	}
	return nil
}

// queueShowCluster runs `queue show` on every node registered in the
// shared Redis and prints the answer of each node that holds the message
// (one: a queue ID ends with its node's tag; only an ID from before
// tags, a plain count, may be held by several, so each answer is labelled):
// a section per node, or with -json one object per node and line
// ({"node", "admin_url", "show"}).
func queueShowCluster(args, rest []string, local *adminclient.Client, stdout, stderr io.Writer) error {
	path := ""
	if len(args) >= 2 && (args[0] == "-config" || args[0] == "--config") {
		path = args[1]
	}
	nodes, err := clusterNodes(path, nil, "queue show -cluster: cluster.redis.addresses is empty")
	if err != nil {
		return err
	}
	asJSON := slices.Contains(rest, "-json")
	var misses []string
	found := 0
	for _, n := range nodes {
		c := &adminclient.Client{Base: n.AdminURL, Token: local.Token, HTTP: local.HTTP}
		var buf bytes.Buffer
		if err := admincli.RunQueue(rest, c, &buf, io.Discard); err != nil {
			misses = append(misses, fmt.Sprintf("node %s: %v", n.Name, err))
			continue
		}
		found++
		if asJSON {
			line, err := json.Marshal(map[string]any{"node": n.Name, "admin_url": n.AdminURL, "show": json.RawMessage(buf.Bytes())})
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s\n", line)
			continue
		}
		fmt.Fprintf(stdout, "== node %s (%s)\n%s\n", n.Name, n.AdminURL, buf.Bytes())
	}
	if found == 0 {
		return fmt.Errorf("queue show -cluster: no node shows it (%s)", strings.Join(misses, "; "))
	}
	return nil
}

// clusterNodes loads the configuration at path (saying which on stderr,
// if not nil) and lists the nodes registered in its shared Redis; without
// cluster.redis it fails with status 2 and the message alone.
func clusterNodes(path string, stderr io.Writer, alone string) ([]cluster.Node, error) {
	cfg, _, err := loadConfig(path, stderr)
	if err != nil {
		return nil, err
	}
	if len(cfg.Cluster.Redis.Addresses) == 0 {
		return nil, &exitError{2, errors.New(alone)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cluster.RouteRedisLogs(zap.NewNop()) // the caller's error says it once
	return cluster.ListNodes(ctx, cfg.Cluster.Redis)
}
