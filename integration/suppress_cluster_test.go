package integration

// The suppression list shared by two real nodes through a real Redis: a
// real Postfix's 550 5.1.1 on node A makes node B refuse the address;
// removal and an entry's end hold on both; with Redis killed each node's
// list keeps working (no 4xx or 5xx beyond the suppression itself), and
// when Redis comes back empty the entries made meanwhile reach the other
// node without the earlier ones being lost.

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// suppressedAddrs lists r's suppression list's addresses.
func (r *testRelay) suppressedAddrs() []string {
	r.t.Helper()
	var out struct {
		Entries []struct {
			Address string    `json:"address"`
			Expires time.Time `json:"expires"`
		} `json:"entries"`
	}
	if code := r.api("/api/suppressions", &out); code != 200 {
		r.t.Fatalf("GET /api/suppressions: %d", code)
	}
	var as []string
	for _, e := range out.Entries {
		as = append(as, e.Address)
	}
	slices.Sort(as)
	return as
}

// waitSuppressed waits until r's list holds (want) or lacks (!want) addr.
func (r *testRelay) waitSuppressed(addr string, want bool, timeout time.Duration) {
	r.t.Helper()
	relaytest.Eventually(r.t, timeout, fmt.Sprintf("node %s: %s suppressed %v", r.IP, addr, want), func() error {
		if got := slices.Contains(r.suppressedAddrs(), addr); got != want {
			return fmt.Errorf("suppressed: %v, list %v", got, r.suppressedAddrs())
		}
		return nil
	})
}

// swaksTo sends one message to addr through r; it returns swaks's output
// and exit status.
func (r *testRelay) swaksTo(addr string) (string, int) {
	r.t.Helper()
	m := peers.SwaksMessage{Server: r.SMTPAddr, From: "app@src.test", To: []string{addr}, Data: message("app@src.test", addr, "cluster suppression")}
	return m.Send(r.t)
}

func TestClusterSharesSuppressions(t *testing.T) {
	peers.Require(t, "postfix", "swaks", "redis-server")
	t.Parallel()
	n := newMailNet(t)
	rds := peers.StartRedis(t, "")
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	n.postfix("dest.test", peers.PostfixConfig{DeliverTo: final.Addr, KnownRecipients: []string{"known@dest.test"}})
	a := n.clusterNode(rds.Addr)
	b := n.clusterNode(rds.Addr)

	// Postfix's 550 5.1.1 on node A suppresses the address on both.
	id := a.send(peers.SwaksMessage{From: "app@src.test", To: []string{"unknown@dest.test"}, Data: message("app@src.test", "unknown@dest.test", "first")})
	a.waitAttempts(id, "failed", 30*time.Second)
	b.waitSuppressed("unknown@dest.test", true, 20*time.Second)
	if out, code := b.swaksTo("Unknown@dest.test"); code == 0 || !strings.Contains(out, "550 5.1.1 <Unknown@dest.test>: Recipient address suppressed since") ||
		!strings.Contains(out, "User unknown in relay recipient table") {
		t.Errorf("node B, to the address node A suppressed: swaks exit %d\n%s", code, out)
	}

	// Removed on node B, it is tried again from node A.
	if res := b.cli("suppression", "remove", "unknown@dest.test"); res.Code != 0 {
		t.Fatalf("suppression remove on node B: %v", res)
	}
	a.waitSuppressed("unknown@dest.test", false, 20*time.Second)

	// An operator's entry with a short life ends on both nodes.
	if res := a.cli("suppression", "add", "-ttl", "6s", "brief@dest.test"); res.Code != 0 {
		t.Fatalf("suppression add on node A: %v", res)
	}
	b.waitSuppressed("brief@dest.test", true, 20*time.Second)
	if out, code := b.swaksTo("brief@dest.test"); code == 0 || !strings.Contains(out, "suppressed since") {
		t.Errorf("node B, to node A's operator entry: swaks exit %d\n%s", code, out)
	}
	b.waitSuppressed("brief@dest.test", false, 20*time.Second)
	a.waitSuppressed("brief@dest.test", false, 5*time.Second)

	if res := b.cli("suppression", "add", "before@dest.test"); res.Code != 0 {
		t.Fatalf("suppression add on node B: %v", res)
	}
	a.waitSuppressed("before@dest.test", true, 20*time.Second)

	// Redis goes away: each list keeps working, and mail is taken as before.
	rds.Kill()
	relaytest.Eventually(t, 20*time.Second, "nodes see Redis down", func() error {
		for _, r := range []*testRelay{a, b} {
			if v := gauge(r, "greyrelay_cluster_redis_up"); v != 0 {
				return fmt.Errorf("node %s: greyrelay_cluster_redis_up %v", r.IP, v)
			}
		}
		return nil
	})
	if res := a.cli("suppression", "add", "during@dest.test"); res.Code != 0 {
		t.Fatalf("suppression add on node A with Redis down: %v", res)
	}
	for _, r := range []*testRelay{a, b} {
		if out, code := r.swaksTo("before@dest.test"); code == 0 || !strings.Contains(out, "550 5.1.1") {
			t.Errorf("node %s, Redis down, to a suppressed address: swaks exit %d\n%s", r.IP, code, out)
		}
		if out, code := r.swaksTo("known@dest.test"); code != 0 {
			t.Errorf("node %s, Redis down, to a deliverable address: swaks exit %d\n%s", r.IP, code, out)
		}
	}
	if out, code := a.swaksTo("during@dest.test"); code == 0 || !strings.Contains(out, "550 5.1.1") {
		t.Errorf("node A, Redis down, to its own new entry: swaks exit %d\n%s", code, out)
	}

	// Redis comes back empty (no persistence): the nodes' lists fill it
	// again, and the entry made meanwhile reaches node B.
	rds.Start()
	b.waitSuppressed("during@dest.test", true, 30*time.Second)
	for _, r := range []*testRelay{a, b} {
		r.waitSuppressed("before@dest.test", true, 5*time.Second)
	}
	if out, code := b.swaksTo("during@dest.test"); code == 0 || !strings.Contains(out, "suppressed since") {
		t.Errorf("node B after Redis came back, to node A's entry made while it was away: swaks exit %d\n%s", code, out)
	}
	final.WaitFor(t, 2, 30*time.Second)
	for _, r := range []*testRelay{a, b} {
		for line := range strings.Lines(r.Log()) {
			if strings.Contains(line, `"level":"error"`) {
				t.Errorf("node %s logged: %s", r.IP, line)
			}
		}
	}
}
