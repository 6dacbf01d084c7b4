package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/greyrelay/greyrelay/relay/cluster/clustertest"
	"github.com/greyrelay/greyrelay/relay/config"
)

// loggedNode is a node whose log lines are kept.
type loggedNode struct {
	*Cluster
	logs *observer.ObservedLogs
}

// startNode connects a node with this name and admin URL to st (lease_ttl
// 1s: a heartbeat every 333 ms).
func startNode(t *testing.T, st Store, name, adminURL string) loggedNode {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	c, err := New(Options{Node: Node{Name: name, AdminURL: adminURL}, Logger: zap.New(core),
		Registry: prometheus.NewRegistry(), Store: st, Config: config.Cluster{
			Redis:             config.Redis{Timeout: 500 * time.Millisecond},
			DestinationLimits: LimitsShared, LeaseTTL: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return loggedNode{c, logs}
}

// crash stops n's loop the way a killed process stops: no more
// heartbeats, the registry entry left to expire.
func (n loggedNode) crash() {
	n.stop <- struct{}{}
	<-n.done
}

// heartbeats counts n's heartbeat round trips so far.
func (n loggedNode) heartbeats() int {
	return int(testutil.ToFloat64(n.m.commands.WithLabelValues("heartbeat")))
}

// await polls cond until it holds or 10 s pass.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
	}
}

// levelCount counts n's log lines at level whose message contains text.
func (n loggedNode) levelCount(level zapcore.Level, text string) int {
	return n.logs.Filter(func(e observer.LoggedEntry) bool {
		return e.Level == level && strings.Contains(e.Message, text)
	}).Len()
}

func TestNodeNameConflict(t *testing.T) {
	const conflictMsg, warnMsg = "another running process uses this node name", "replaced a fresh registry entry"
	tests := []struct {
		name string
		// first is the process that runs before ours, given our name;
		// then stays it running, crashes (its entry left fresh) or stops
		// cleanly before ours starts.
		firstName, firstURL, then string
		wantConflict, wantWarn    bool
	}{
		{name: "same name, both running", firstName: "n", firstURL: "http://10.0.0.2:8025", then: "runs",
			wantConflict: true, wantWarn: true},
		{name: "same name and admin URL, both running", firstName: "n", firstURL: "http://10.0.0.1:8025", then: "runs",
			wantConflict: true},
		{name: "restart after a crash", firstName: "n", firstURL: "http://10.0.0.1:8025", then: "crashes"},
		{name: "queue moved to another host after a crash", firstName: "n", firstURL: "http://10.0.0.2:8025", then: "crashes",
			wantWarn: true},
		{name: "restart after a clean stop", firstName: "n", firstURL: "http://10.0.0.1:8025", then: "stops"},
		{name: "distinct names", firstName: "other", firstURL: "http://10.0.0.2:8025", then: "runs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := clustertest.NewMemory()
				first := startNode(t, st, tt.firstName, tt.firstURL)
				await(t, "the first node's heartbeat", func() bool { return first.heartbeats() >= 1 })
				switch tt.then {
				case "crashes":
					first.crash()
				case "stops":
					first.Close()
				}
				ours := startNode(t, st, "n", "http://10.0.0.1:8025")
				if tt.wantConflict {
					// Long enough for the two heartbeats' order to swap at
					// times: still one error per conflict.
					await(t, "conflicts counted", func() bool { return testutil.ToFloat64(ours.m.conflicts) >= 6 })
				} else {
					await(t, "six heartbeats", func() bool { return ours.heartbeats() >= 6 })
				}
				nodes := []loggedNode{ours}
				if tt.then == "runs" {
					nodes = append(nodes, first) // the first sees the conflict as well
				}
				for _, n := range nodes {
					conflicts := testutil.ToFloat64(n.m.conflicts)
					if got := n.levelCount(zapcore.ErrorLevel, conflictMsg); (conflicts > 0) != tt.wantConflict || got != map[bool]int{true: 1}[tt.wantConflict] {
						t.Errorf("%s: %v conflicts counted, %d errors logged; want conflict %v, logged once", n.node.AdminURL, conflicts, got, tt.wantConflict)
					}
				}
				if got := ours.levelCount(zapcore.WarnLevel, warnMsg); got != map[bool]int{true: 1}[tt.wantWarn] {
					t.Errorf("%d warnings about a replaced entry, want %v", got, tt.wantWarn)
				}
				if tt.wantConflict {
					e := ours.logs.FilterMessageSnippet(conflictMsg).All()[0].ContextMap()
					if e["other_admin_url"] != tt.firstURL || e["admin_url"] != "http://10.0.0.1:8025" ||
						!strings.Contains(ours.logs.FilterMessageSnippet(conflictMsg).All()[0].Message, "cluster.node_name") {
						t.Errorf("the error names %v and %v, want both admin URLs and the remedy", e["admin_url"], e["other_admin_url"])
					}
				}
			})
		})
	}
}

// TestNodeNameConflictShownAndOver: while two processes share a name, the
// registry entry says so (for greyrelay cluster status); once one stops
// the other says the conflict is over and the entry is clean again.
func TestNodeNameConflictShownAndOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		a, b := startNode(t, st, "n", "http://a:8025"), startNode(t, st, "n", "http://b:8025")
		await(t, "the entry names the conflict", func() bool {
			ns, err := a.Nodes(context.Background())
			return err == nil && len(ns) == 1 && ns[0].ConflictWith != "" && ns[0].ConflictWith != ns[0].AdminURL
		})
		b.Close()
		await(t, "the conflict over", func() bool { return a.levelCount(zapcore.InfoLevel, "conflict is over") == 1 })
		await(t, "a clean entry of node a", func() bool {
			ns, err := a.Nodes(context.Background())
			return err == nil && len(ns) == 1 && ns[0].AdminURL == "http://a:8025" && ns[0].ConflictWith == "" &&
				ns[0].Instance == a.instance
		})
	})
}

// TestCloseKeepsAnotherProcessEntry: a stopping process deletes the
// registry entry only if it wrote it last, not that of the process that
// took over its name (its queue moved to another host).
func TestCloseKeepsAnotherProcessEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		entry := func() Node {
			var n Node
			json.Unmarshal(st.Entry("n"), &n)
			return n
		}
		old := startNode(t, st, "n", "http://old:8025")
		await(t, "the old node's entry", func() bool { return entry().Instance == old.instance })
		old.crash()
		moved := startNode(t, st, "n", "http://new:8025")
		await(t, "the new node's entry", func() bool { return entry().Instance == moved.instance })
		old.Close()
		if got := entry(); got.Instance != moved.instance {
			t.Errorf("after the old process closed, the entry is %+v; want the new node's", got)
		}
		moved.Close()
		if b := st.Entry("n"); b != nil {
			t.Errorf("the node's own entry left after Close: %s", b)
		}
	})
}

// TestNodeNameConflictWithOldVersion: a process of a version that wrote
// no instance into its entry, running with our name, is a conflict too.
func TestNodeNameConflictWithOldVersion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := clustertest.NewMemory()
		ours := startNode(t, st, "n", "http://new:8025")
		old := `{"name":"n","admin_url":"http://old:8025","version":"1.0","started":"2026-01-02T03:04:05Z","seen":"%s","queued":3}`
		await(t, "conflicts counted", func() bool {
			// The old process's heartbeat, between two of ours.
			st.SetEntry("n", fmt.Appendf(nil, old, time.Now().UTC().Format(time.RFC3339Nano)), 3*time.Second)
			return testutil.ToFloat64(ours.m.conflicts) >= 2
		})
		e := ours.logs.FilterMessageSnippet("another running process uses this node name").All()
		if len(e) != 1 || e[0].ContextMap()["other_admin_url"] != "http://old:8025" {
			t.Errorf("logged %+v, want one error naming http://old:8025", e)
		}
	})
}
