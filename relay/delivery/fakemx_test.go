package delivery

import (
	"crypto/tls"
	"net"
	"strconv"
	"testing"

	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// startMX starts a relaytest.FakeMX on ip:port; every MX of a test listens
// on the harness's port (delivery.port is one port for all of them), each
// at its own address from relaytest.Loopback.
func startMX(t *testing.T, ip string, port int, o relaytest.MXOptions) *relaytest.FakeMX {
	t.Helper()
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
