package delivery

import (
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// startMX starts a relaytest.FakeMX on ip:port; every MX of a test listens
// on the harness's port (delivery.port is one port for all of them), each
// at its own address from relaytest.Loopback.
func startMX(t *testing.T, ip string, port int, o relaytest.MXOptions) *relaytest.FakeMX {
	t.Helper()
	if o.Domain == "" {
		o.Domain = "mx-" + ip
	}
	return relaytest.StartMX(t, net.JoinHostPort(ip, strconv.Itoa(port)), o)
}

// testCert returns a self-signed certificate for name.
func testCert(t *testing.T, name string) tls.Certificate {
	t.Helper()
	pair, _, err := relaytest.SelfSigned(name)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// verbs turns each connection's lines, as a relaytest.Peer records them,
// into their command verbs ("MAIL FROM:<a@b>" is MAIL).
func verbs(conns [][]string) [][]string {
	out := make([][]string, len(conns))
	for i, lines := range conns {
		for _, l := range lines {
			verb, _, _ := strings.Cut(l, " ")
			verb, _, _ = strings.Cut(strings.ToUpper(verb), ":")
			out[i] = append(out[i], verb)
		}
	}
	return out
}

// saw returns how many commands with verb a peer has received.
func saw(p *relaytest.Peer, verb string) int {
	n := 0
	for _, c := range verbs(p.Conns()) {
		for _, v := range c {
			if v == verb {
				n++
			}
		}
	}
	return n
}
