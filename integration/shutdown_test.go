package integration

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// TestStopWhileResolverSilent: SIGTERM stops the relay at once while a
// delivery waits for a resolver that does not answer. The DNS client
// ended a query only at its own 10 s timeout, not when the stop cancelled
// it, so the relay took up to 10 s to exit (Docker's default stop grace,
// after which it is killed; TestRequireTLS's DSN to an unresolvable
// sender made every one of its stops take 9.8 s, and under load some
// took longer than the test harness's 10 s).
func TestStopWhileResolverSilent(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	ip := n.host("")
	silent, err := net.ListenPacket("udp", net.JoinHostPort(n.host(""), "0")) // reads queries, answers none
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	asked := make(chan struct{})
	go func() {
		buf := make([]byte, 2048)
		for {
			k, _, err := silent.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dns.Msg
			if m.Unpack(buf[:k]) == nil && len(m.Question) == 1 && strings.EqualFold(m.Question[0].Name, "quiet.test.") {
				close(asked)
				for {
					if _, _, err := silent.ReadFrom(buf); err != nil {
						return
					}
				}
			}
		}
	}()
	r := &testRelay{Relay: peers.StartRelay(t, n.relayYAML(ip, "delivery.resolver="+silent.LocalAddr().String())), t: t, IP: ip}
	r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"b@quiet.test"}})
	select {
	case <-asked:
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not look up quiet.test")
	}
	start := time.Now()
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the relay took %v to stop on SIGTERM while a lookup waited, want well under 10 s", took.Round(time.Millisecond))
	}
}
