package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// waitLog waits until the relay logged a line with msg for queue id.
func (r *testRelay) waitLog(msg, id string, timeout time.Duration) {
	r.t.Helper()
	relaytest.Eventually(r.t, timeout, fmt.Sprintf("%q for %s", msg, id), func() error {
		for _, e := range r.logEntries() {
			if e.str("msg") == msg && e.str("queue_id") == id {
				return nil
			}
		}
		return fmt.Errorf("not logged yet")
	})
}

// postponedBySuspension is the log line of a recipient a suspension
// keeps from its attempt.
const postponedBySuspension = "delivery postponed: the operator suspended the destination"

// TestDomainSuspendResume: `greyrelay destinations suspend` stops delivery
// to a domain, given in any spelling, without touching its queue: new mail
// to it is queued and waits without an attempt, other domains go on, the
// suspension shows in destinations, queue show and list, the status page
// and the metrics, and it survives a restart. resume sends the waiting
// mail at once, each recipient on its first attempt.
func TestDomainSuspendResume(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	held := n.sink("ok.test", peers.SinkOptions{})
	other := n.sink("other.test", peers.SinkOptions{})
	r := n.relay()
	must := func(cmd string, args ...string) string {
		t.Helper()
		res := r.cli(cmd, args...)
		if res.Code != 0 {
			t.Fatalf("greyrelay %s %v: %s", cmd, args, res)
		}
		return res.Stdout
	}
	says := func(what, out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s lacks %q:\n%s", what, w, out)
			}
		}
	}
	send := func(to string) string {
		return r.send(peers.SwaksMessage{From: "a@src.test", To: []string{to}, Data: message("a@src.test", to, "suspend "+to)})
	}

	says("suspend", must("destinations", "suspend", "-reason", "maintenance window", "OK.Test."),
		"delivery to ok.test stops until `greyrelay destinations resume ok.test`")
	for _, bad := range [][]string{{"suspend", "-for", "2x", "ok.test"}, {"suspend", "not a domain"}, {"suspend"}} {
		if res := r.cli("destinations", bad...); res.Code == 0 {
			t.Errorf("greyrelay destinations %v: want a refusal, got %s", bad, res)
		}
	}
	first := send("u1@ok.test")
	r.waitLog(postponedBySuspension, first, 20*time.Second)
	_ = send("x@other.test")
	other.WaitFor(t, 1, 20*time.Second) // only the suspended domain waits

	says("queue show", must("queue", "show", first), "suspended until resumed (maintenance window)")
	says("queue list", must("queue", "list", "-domain", "ok.test"), "suspended until resumed")
	says("destinations", must("destinations"), "ok.test", "suspended until resumed (maintenance window)")
	if code, page := r.Get(t, "/"); code != 200 || !strings.Contains(page, "ok.test: suspended until resumed (maintenance window)") {
		t.Errorf("status page (%d) does not show the suspension:\n%s", code, page)
	}
	if v := gauge(r, "greyrelay_suspended_destinations"); v != 1 {
		t.Errorf("greyrelay_suspended_destinations = %v, want 1", v)
	}

	// A restart keeps it: the next message waits too.
	r.Restart(t)
	says("destinations after a restart", must("destinations", "ok.test"), "suspended until resumed")
	second := send("u2@ok.test")
	r.waitLog(postponedBySuspension, second, 20*time.Second)
	if got := len(held.Messages()); got != 0 {
		t.Fatalf("ok.test received %d messages while suspended", got)
	}

	// Another suspension, with an end, shows when it ends.
	says("suspend -for", must("destinations", "suspend", "-for", "2d", "later.test"), "delivery to later.test stops until ")
	says("destinations later.test", must("destinations", "later.test"), "suspended, resumes in 1d23h") // 2d from the moment it was made

	says("resume", must("destinations", "resume", "ok.test"), "resume: delivery to ok.test goes on; 2 recipient(s) made due")
	held.WaitFor(t, 2, 20*time.Second)
	for _, id := range []string{first, second} {
		atts := r.waitAttempts(id, "delivered", 20*time.Second)
		if len(atts) != 1 || atts[0].num("attempt") != 1 {
			t.Errorf("%s: attempts %v, want one, the first (a suspension makes none)", id, outcomes(atts))
		}
	}
	if res := r.cli("destinations", "ok.test"); strings.Contains(res.Stdout, "suspended") {
		t.Errorf("ok.test still shown suspended after resume: %s", res)
	}

	// docs/operations.md's block, as written: suspend, look, resume.
	out := runOperatorRecipe(t, r, recipeBlocks(t, "TestDomainSuspendResume")[0].Text, "ok.test")
	says("the operations recipe", out, "delivery to ok.test stops", "resume: delivery to ok.test goes on")
}

// TestClusterSuspendReachesEveryNode: a suspension made on node A stops
// node B's delivery to the domain too (through the shared Redis), B shows
// it, and A's resume lets B's waiting mail go.
func TestClusterSuspendReachesEveryNode(t *testing.T) {
	peers.Require(t, "swaks", "redis-server")
	t.Parallel()
	n := newMailNet(t)
	rds := peers.StartRedis(t, "")
	dest := n.sink("dest.test", peers.SinkOptions{})
	a := n.clusterNode(rds.Addr)
	b := n.clusterNode(rds.Addr)
	if res := a.cli("destinations", "suspend", "-reason", "migration", "dest.test"); res.Code != 0 {
		t.Fatalf("suspend on A: %s", res)
	}
	relaytest.Eventually(t, 15*time.Second, "B shows A's suspension", func() error {
		if res := b.cli("destinations", "dest.test"); !strings.Contains(res.Stdout, "suspended until resumed (migration)") {
			return fmt.Errorf("%s", res)
		}
		return nil
	})
	id := b.send(peers.SwaksMessage{From: "a@src.test", To: []string{"u@dest.test"}, Data: message("a@src.test", "u@dest.test", "cluster suspend")})
	b.waitLog(postponedBySuspension, id, 20*time.Second)
	if got := len(dest.Messages()); got != 0 {
		t.Fatalf("dest.test received %d messages while suspended", got)
	}
	if res := a.cli("destinations", "resume", "dest.test"); res.Code != 0 {
		t.Fatalf("resume on A: %s", res)
	}
	dest.WaitFor(t, 1, 20*time.Second)
	b.waitAttempts(id, "delivered", 20*time.Second)
}

// runOperatorRecipe runs the lines of a docs block as an operator types them,
// against r (GREYRELAY_CONFIG names its configuration), with example.org
// standing for domain; each must succeed. It returns their output.
func runOperatorRecipe(t *testing.T, r *testRelay, block, domain string) string {
	t.Helper()
	bin := t.TempDir()
	if err := os.Symlink(peers.Binary(t), filepath.Join(bin, "greyrelay")); err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		line = strings.ReplaceAll(line, "example.org", domain)
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = r.Dir
		cmd.Env = append(peers.CleanEnv(), "PATH="+bin+":"+os.Getenv("PATH"), "GREYRELAY_CONFIG="+r.ConfigPath)
		out, err := cmd.CombinedOutput()
		fmt.Fprintf(&all, "$ %s\n%s", line, out)
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
	}
	return all.String()
}
