package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// TestClusterComposeFiles checks configs/cluster as docs/cluster.md's "Run several
// nodes" uses it: the compose file has Redis, HAProxy and three nodes on
// their own queue volumes; HAProxy's backends are the nodes' addresses and
// its own address is the one the nodes believe PROXY headers from; each
// node's configuration (the shared file plus its environment) passes
// `greyrelay config check`; `haproxy -c` accepts haproxy.cfg; docs/cluster.md shows
// the node configuration as it is in the file.
func TestClusterComposeFiles(t *testing.T) {
	peers.Require(t, "haproxy")
	t.Parallel()
	const dir = "../configs/cluster"
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Networks    map[string]struct {
				IP string `yaml:"ipv4_address"`
			} `yaml:"networks"`
		} `yaml:"services"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatal(err)
	}
	ip := func(svc string) string { return compose.Services[svc].Networks["relaynet"].IP }
	nodeCfg, err := os.ReadFile(filepath.Join(dir, "greyrelay.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	hap, err := os.ReadFile(filepath.Join(dir, "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	if ip("redis") == "" || !strings.Contains(string(nodeCfg), `"`+ip("redis")+`:6379"`) {
		t.Errorf("the nodes' cluster.redis.addresses do not name the redis service's address %q", ip("redis"))
	}
	if ip("haproxy") == "" || !strings.Contains(string(nodeCfg), "trusted: ["+ip("haproxy")+"/32]") {
		t.Errorf("proxy_protocol.trusted does not name the haproxy service's address %q", ip("haproxy"))
	}

	secrets := t.TempDir()
	for _, f := range []string{"admin_token", "redis_password"} {
		if err := os.WriteFile(filepath.Join(secrets, f), []byte("s3cret-"+f+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var volumes []string
	for _, name := range []string{"node1", "node2", "node3"} {
		svc, ok := compose.Services[name]
		if !ok || svc.Image != "greyrelay" {
			t.Fatalf("service %s missing or not the greyrelay image", name)
		}
		if !strings.Contains(string(hap), " "+ip(name)+":2525 send-proxy-v2 check") {
			t.Errorf("haproxy.cfg has no send-proxy-v2 backend for %s at %s", name, ip(name))
		}
		if svc.Environment["GREYRELAY_CLUSTER_NODE_NAME"] != name {
			t.Errorf("%s: GREYRELAY_CLUSTER_NODE_NAME %q", name, svc.Environment["GREYRELAY_CLUSTER_NODE_NAME"])
		}
		for _, v := range svc.Volumes {
			if strings.HasSuffix(v, ":/var/spool/greyrelay") {
				volumes = append(volumes, v)
			}
		}
		// The queue volume's stand-in: config check writes in the queue's directory.
		env := []string{"GREYRELAY_ADMIN_TOKEN_FILE=" + filepath.Join(secrets, "admin_token"),
			"GREYRELAY_CLUSTER_REDIS_PASSWORD_FILE=" + filepath.Join(secrets, "redis_password"),
			"GREYRELAY_QUEUE_PATH=" + filepath.Join(t.TempDir(), "queue.db")}
		for k, v := range svc.Environment {
			if k != "GREYRELAY_CONFIG" {
				env = append(env, k+"="+v)
			}
		}
		abs, _ := filepath.Abs(filepath.Join(dir, "greyrelay.yaml"))
		if res := runGreyrelay(t, t.TempDir(), "", env, "config", "check", "-config", abs); res.Code != 0 {
			t.Errorf("%s: config check: %s", name, res)
		}
	}
	slices.Sort(volumes)
	if len(slices.Compact(volumes)) != 3 {
		t.Errorf("queue volumes %v: want one of its own per node", volumes)
	}
	if out, err := exec.Command("haproxy", "-c", "-f", filepath.Join(dir, "haproxy.cfg")).CombinedOutput(); err != nil {
		t.Errorf("haproxy -c: %v\n%s", err, out)
	}

	blocks := recipeBlocks(t, "TestClusterComposeFiles")
	if len(blocks) != 1 || blocks[0].Text != string(nodeCfg) {
		t.Errorf("%s's configuration differs from configs/cluster/greyrelay.yaml", blocks[0].File)
	}
}
