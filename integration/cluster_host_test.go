package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestClusterSharesGreylistPerHost: what is learned about greylisting
// belongs to the MX host and reaches the other nodes through a real
// Redis. Two domains share one MX (a real Postfix behind a real
// postgrey); node A learns the greylister's delay from one.test, node B,
// which never mailed either domain, waits past that window's lower bound
// before its first retry to two.test: it took the host's record
// ("[address]") from Redis. On its own B would retry after 3 s and be
// greylisted again.
func TestClusterSharesGreylistPerHost(t *testing.T) {
	peers.Require(t, "postfix", "postgrey", "swaks", "redis-server")
	t.Parallel()
	n := newMailNet(t)
	rds := peers.StartRedis(t, "")
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	grey := peers.StartPostgrey(t, "", 8*time.Second)
	pf := n.postfix("one.test", peers.PostfixConfig{DeliverTo: final.Addr, Postgrey: grey,
		RelayDomains: []string{"one.test", "two.test"}})
	n.dns.MX("two.test", 10, "mx.one.test") // the same host
	mxIP, _, _ := net.SplitHostPort(pf.Listen)
	quick := []string{"retry.greylist_first_retry=3s", "retry.greylist_second_retry=3s"}
	a := n.clusterNode(rds.Addr, quick...)
	b := n.clusterNode(rds.Addr, quick...)

	id1 := a.send(peers.SwaksMessage{From: "a@src.test", To: []string{"r1@one.test"}, Data: message("a@src.test", "r1@one.test", "learn")})
	final.WaitFor(t, 1, 40*time.Second)
	a.waitAttempts(id1, "delivered", 5*time.Second)
	// The attempt's log line comes before the queue's writer commits the
	// host's record the API reads: wait for the record, not a sleep.
	var low time.Duration
	relaytest.Eventually(t, 10*time.Second, "node A's record of the MX host", func() error {
		h, ok := hostRecord(a, mxIP)
		low = time.Duration(h.GreylistLowSeconds * float64(time.Second))
		if !ok || h.LearnedDelaySeconds < grey.Delay.Seconds() || low <= 3*time.Second {
			return fmt.Errorf("node A's record of the MX host [%s]: %+v (found %v), want a window around postgrey's %v above the 3s retries", mxIP, h, ok, grey.Delay)
		}
		return nil
	})

	id2 := b.send(peers.SwaksMessage{From: "a@src.test", To: []string{"r2@two.test"}, Data: message("a@src.test", "r2@two.test", "adopt")})
	final.WaitFor(t, 2, 2*grey.Delay+30*time.Second)
	atts := b.waitAttempts(id2, "delivered", 5*time.Second)
	if len(atts) < 2 || len(atts) > 3 || atts[0].str("reason") != "greylisted" {
		t.Fatalf("node B: want a greylisting deferral, perhaps a refused probe, then delivery, got %v", outcomes(atts))
	}
	if gap := atts[1].time("time").Sub(atts[0].time("time")); gap < low {
		t.Errorf("node B retried %v after the greylisting, before the host's lower bound %v that A learned (on its own it retries after 3s)", gap, low)
	}
	if _, ok := hostRecord(b, mxIP); !ok {
		t.Errorf("node B lists no record of the MX host [%s]", mxIP)
	}
}

// hostRecord returns r's record of the MX address ip ("[ip]"), from the
// destinations list.
func hostRecord(r *testRelay, ip string) (apiDestination, bool) {
	r.t.Helper()
	var d apiDestinations
	r.api("/api/destinations", &d)
	for _, x := range d.Destinations {
		if x.Domain == "["+ip+"]" {
			return x, true
		}
	}
	return apiDestination{}, false
}
