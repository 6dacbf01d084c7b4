package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/cluster"
	"github.com/greyrelay/greyrelay/relay/config"
)

// TestClusterStatusShowsNameConflict runs `greyrelay cluster status`
// against a real Redis where real nodes registered: two running nodes
// with one name are reported with both admin URLs and the remedy, and
// the command exits with status 2 (with -json too), naming the node. So
// are two nodes whose queue ID tags meet.
func TestClusterStatusShowsNameConflict(t *testing.T) {
	peers.Require(t, "redis-server")
	clearEnv(t)
	conflicting := []cluster.Node{{Name: "relay1", AdminURL: "http://10.0.0.1:8025"}, {Name: "relay1", AdminURL: "http://10.0.0.2:8025"}}
	cases := []struct {
		name      string
		nodes     []cluster.Node
		flags     []string
		wantLines []string
		wantNo    string
		wantCode  int
		wantErr   string
	}{
		{"one name, two processes", conflicting, nil,
			[]string{"1 node(s)", "CONFLICT: node name relay1 is used by two running processes", "10.0.0.1:8025", "10.0.0.2:8025",
				"give each node its own cluster.node_name"}, "", 2, "relay1"},
		{"one name, two processes, json", conflicting, []string{"-json"},
			[]string{`"name": "relay1"`, `"conflict_with": "http://10.0.0.`}, "", 2, "relay1"},
		// Names whose queue ID tags (cluster.IDTag) meet: found by trying
		// relay0, relay1... until two 24-bit FNV-1a hashes were equal.
		{"two names, one queue ID tag",
			[]cluster.Node{{Name: "relay11859", AdminURL: "http://10.0.0.1:8025"}, {Name: "relay27924", AdminURL: "http://10.0.0.2:8025"}}, nil,
			[]string{"2 node(s)", "CONFLICT: nodes relay11859 and relay27924 share the queue ID tag 22a192", "rename one of them"},
			"", 2, "share the queue ID tag 22a192"},
		{"distinct names",
			[]cluster.Node{{Name: "relay1", AdminURL: "http://10.0.0.1:8025"}, {Name: "relay2", AdminURL: "http://10.0.0.2:8025"}}, nil,
			[]string{"2 node(s)", "relay1", "relay2", fmt.Sprintf("%06x", cluster.IDTag("relay2"))}, "CONFLICT", 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := peers.StartRedis(t, "").Addr
			path := filepath.Join(t.TempDir(), "greyrelay.yaml")
			if err := os.WriteFile(path, fmt.Appendf(nil, "cluster:\n  redis:\n    addresses: [%q]\n", addr), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, n := range tc.nodes {
				c, err := cluster.New(cluster.Options{Node: n, Config: config.Cluster{LeaseTTL: time.Second,
					DestinationLimits: cluster.LimitsShared, Redis: config.Redis{Addresses: []string{addr}, Timeout: time.Second}}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
			}
			var out string
			var err error
			deadline := time.Now().Add(10 * time.Second)
			for {
				out, _, err = runCmd(t, "", append([]string{"cluster", "status", "-config", path}, tc.flags...)...)
				if code := exitCode(err); code != 0 && code != 2 {
					t.Fatalf("exit %d: %v", code, err)
				}
				if containsAll(out, tc.wantLines) || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond) // the conflict shows from the second heartbeat on
			}
			if !containsAll(out, tc.wantLines) || tc.wantNo != "" && strings.Contains(out, tc.wantNo) {
				t.Errorf("cluster status:\n%s\nwant %q and not %q", out, tc.wantLines, tc.wantNo)
			}
			if code := exitCode(err); code != tc.wantCode || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("cluster status: exit %d (%v), want %d naming %q", code, err, tc.wantCode, tc.wantErr)
			}
		})
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
