package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// proxiedNodes starts n relays on distinct loopback addresses whose only
// listener expects a PROXY header from HAProxy (which connects from
// 127.0.0.1), and a real HAProxy balancing round robin over them with
// send-proxy-v2 and health checks.
func proxiedNodes(t *testing.T, net_ *mailNet, n int, overrides ...string) ([]*testRelay, *peers.HAProxy) {
	t.Helper()
	var nodes []*testRelay
	var backends []string
	for range n {
		ip := net_.host("")
		ov := append([]string{
			fmt.Sprintf(`listeners=[{address: "%s", mode: smtp, proxy_protocol: true}]`, peers.FreeAddr(t, ip)),
			"proxy_protocol.trusted=[127.0.0.1/32]",
		}, overrides...)
		r := peers.StartRelay(t, net_.relayYAML(ip, ov...))
		nodes = append(nodes, &testRelay{Relay: r, t: t, IP: ip})
		backends = append(backends, r.SMTPAddr)
	}
	return nodes, peers.StartHAProxy(t, peers.HAProxyConfig{Backends: backends})
}

// TestProxyProtocolBehindHAProxy puts three relays behind a real HAProxy
// (send-proxy-v2, round robin, health checks). Relay policy sees the real
// client: a trusted client relays through every node and its Received
// header names it, while a client outside trusted_networks is refused at
// RCPT although HAProxy itself (127.0.0.1) connects from a loopback
// address. A forged PROXY header sent straight to a node from an address
// that is no balancer gets no banner, and health checks are not logged as
// errors.
func TestProxyProtocolBehindHAProxy(t *testing.T) {
	peers.Require(t, "haproxy", "swaks")
	t.Parallel()
	mn := newMailNet(t)
	sink := mn.sink("dest.test", peers.SinkOptions{})
	friend, stranger := mn.host(""), mn.host("")
	nodes, lb := proxiedNodes(t, mn, 3, fmt.Sprintf("trusted_networks=[%s/32]", friend))

	const n = 6
	for i := range n {
		nodes[0].send(peers.SwaksMessage{Server: lb.Addr, LocalIP: friend, From: "a@src.test",
			To: []string{fmt.Sprintf("b%d@dest.test", i)}})
	}
	msgs := sink.WaitFor(t, n, 60*time.Second)
	for _, m := range msgs {
		if !strings.Contains(string(m.Data), "["+friend+"]") {
			t.Errorf("Received does not name the client %s:\n%s", friend, m.Data)
		}
	}
	for _, node := range nodes {
		if !strings.Contains(node.Log(), `"client":"`+friend) {
			t.Errorf("node %s took no connection from %s: round robin did not reach it", node.IP, friend)
		}
	}

	out, code := peers.SwaksMessage{Server: lb.Addr, LocalIP: stranger, From: "a@src.test",
		To: []string{"c@dest.test"}}.Send(t)
	if code != 24 || !strings.Contains(out, "554 5.7.1") {
		t.Errorf("a client outside trusted_networks behind HAProxy: swaks exit %d, want 24 (554 5.7.1 at RCPT):\n%s", code, out)
	}

	// A forged header straight to a node, from an address that is no balancer.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(stranger)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", nodes[1].SMTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "PROXY TCP4 %s 127.0.0.1 40000 25\r\n", friend)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	var ne net.Error
	if len(b) > 0 || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("forged PROXY header from %s: got %q, %v; want the connection closed without a banner", stranger, b, err)
	}

	for _, node := range nodes {
		for _, line := range strings.Split(node.Log(), "\n") {
			if strings.Contains(line, `"level":"error"`) || strings.Contains(line, "no valid PROXY header") {
				t.Errorf("node %s logged: %s", node.IP, line)
			}
		}
	}
}
