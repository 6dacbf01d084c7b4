package smtpd

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
)

// proxyConfig has one smtp listener behind a load balancer at 127.0.0.1.
// Relay is allowed from 127.0.0.99 only.
func proxyConfig(t *testing.T) *startedProxy {
	t.Helper()
	cfg := testConfig(t)
	cfg.Listeners[0].ProxyProtocol = true
	cfg.ProxyProtocol.Trusted = []string{"127.0.0.1/32"}
	cfg.ProxyProtocol.HeaderTimeout = time.Second
	cfg.Limits.MaxConnectionsPerIP = 1
	return &startedProxy{e: startServer(t, cfg)}
}

type startedProxy struct{ e *testEnv }

// header formats a PROXY header naming client (v1 or v2), or a v2 LOCAL
// header when client is "".
func header(t *testing.T, version byte, client string) string {
	t.Helper()
	h := &proxyproto.Header{Version: version, Command: proxyproto.LOCAL}
	if client != "" {
		h = proxyproto.HeaderProxyFromAddrs(version,
			&net.TCPAddr{IP: net.ParseIP(client), Port: 40000},
			&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 25})
	}
	b, err := h.Format()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestProxyProtocolClientAddress(t *testing.T) {
	tests := []struct {
		name       string
		header     string
		wantClient string
		wantRCPT   string // reply to a remote recipient: relay policy sees the client
	}{
		{"v1 trusted client", "v1:127.0.0.99", "127.0.0.99", "250"},
		{"v2 trusted client", "v2:127.0.0.99", "127.0.0.99", "250"},
		{"v2 outside client", "v2:192.0.2.7", "192.0.2.7", "554 5.7.1"},
		{"v1 outside client", "v1:198.51.100.1", "198.51.100.1", "554 5.7.1"},
		{"v2 LOCAL is the balancer", "local", "127.0.0.1", "554 5.7.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := proxyConfig(t)
			c := dialFrom(t, p.e.addr(0), "127.0.0.1")
			switch kind, ip, _ := strings.Cut(tt.header, ":"); kind {
			case "v1":
				c.write(header(t, 1, ip))
			case "v2":
				c.write(header(t, 2, ip))
			default:
				c.write(header(t, 2, ""))
			}
			c.expect("220")
			c.send("EHLO client.test")
			c.expect("250")
			c.send("MAIL FROM:<a@client.test>")
			c.expect("250")
			c.send("RCPT TO:<b@remote.test>")
			c.expect(tt.wantRCPT)
			if tt.wantRCPT != "250" {
				return
			}
			c.send("DATA")
			c.expect("354")
			c.write("Subject: x\r\n\r\nbody\r\n.\r\n")
			c.expect("250")
			msgs := p.e.q.messages()
			if len(msgs) != 1 || msgs[0].ClientAddr != tt.wantClient {
				t.Fatalf("queued %d messages, client %+v; want client %s", len(msgs), msgs, tt.wantClient)
			}
			if !strings.Contains(string(msgs[0].Body), "["+tt.wantClient+"]") {
				t.Errorf("Received does not name %s:\n%s", tt.wantClient, msgs[0].Body)
			}
		})
	}
}

// A connection refused by a PROXY listener gets no banner: the first read
// ends with EOF or a reset.
func TestProxyProtocolRefused(t *testing.T) {
	tests := []struct {
		name, src, send string
	}{
		{"header from an untrusted address", "127.0.0.2", "v2"},
		{"plain SMTP from the balancer's address", "127.0.0.1", "EHLO x\r\n"},
		{"garbage header", "127.0.0.1", "PROXY TCP4 nonsense\r\n"},
		{"no header at all", "127.0.0.1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := proxyConfig(t)
			c := dialFrom(t, p.e.addr(0), tt.src)
			switch tt.send {
			case "v2":
				c.write(header(t, 2, "127.0.0.99"))
			case "":
			default:
				c.write(tt.send)
			}
			c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, err := io.ReadAll(c.conn)
			var ne net.Error
			if len(b) > 0 || errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("got %q, %v; want the connection closed without a banner", b, err)
			}
		})
	}
}

// Per-IP limits count the client the header names, not the balancer.
func TestProxyProtocolPerClientLimit(t *testing.T) {
	p := proxyConfig(t) // max_connections_per_ip: 1
	a := dialFrom(t, p.e.addr(0), "127.0.0.1")
	a.write(header(t, 2, "192.0.2.1"))
	a.expect("220")
	b := dialFrom(t, p.e.addr(0), "127.0.0.1")
	b.write(header(t, 2, "192.0.2.2"))
	b.expect("220")
	again := dialFrom(t, p.e.addr(0), "127.0.0.1")
	again.write(header(t, 2, "192.0.2.1"))
	again.expect("421 4.7.0")
}

// Behind a balancer on loopback, AUTH without TLS is decided by the client
// the PROXY header names: a stranger is neither offered AUTH before
// STARTTLS nor accepted (523 5.7.10), while a loopback client still is.
// Lockouts count the header's address too: a client locked out does not
// lock out another client of the same balancer.
func TestProxyProtocolAuthUsesRealClient(t *testing.T) {
	cert, key := writeCert(t)
	cfg := testConfig(t)
	cfg.Listeners[0].ProxyProtocol = true
	cfg.Listeners[0].TLSCert, cfg.Listeners[0].TLSKey = cert, key
	cfg.ProxyProtocol.Trusted = []string{"127.0.0.1/32"}
	cfg.ProxyProtocol.HeaderTimeout = time.Second
	cfg.Limits.MaxAuthFailures = 10
	cfg.Limits.MaxAuthFailuresPerUser = 2
	e := authEnv(t, cfg)
	open := func(version byte, client string) *client {
		c := dialFrom(t, e.addr(0), "127.0.0.1")
		c.write(header(t, version, client))
		return c
	}
	for _, version := range []byte{1, 2} {
		c := open(version, "203.0.113.9")
		if ehlo := strings.Join(c.hello(), "\n"); strings.Contains(ehlo, "AUTH") {
			t.Errorf("v%d: AUTH offered in clear to 203.0.113.9 behind a loopback balancer:\n%s", version, ehlo)
		}
		c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "523 5.7.10")
		c.startTLS()
		c.cmd("EHLO client.example", "250 ")
		c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")

		local := open(version, "127.0.0.5")
		if ehlo := strings.Join(local.hello(), "\n"); !strings.Contains(ehlo, "AUTH PLAIN LOGIN") {
			t.Errorf("v%d: AUTH not offered to a loopback client:\n%s", version, ehlo)
		}
	}

	// Lockouts: alice is guessed from 203.0.113.9 until locked there.
	c := open(1, "203.0.113.9")
	c.hello()
	c.startTLS()
	c.cmd("EHLO client.example", "250 ")
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "wrong"), "535 ")
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "wrong"), "421 4.7.0")
	c = open(1, "203.0.113.9")
	c.hello()
	c.startTLS()
	c.cmd("EHLO client.example", "250 ")
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "421 4.7.0")
	other := open(2, "203.0.113.10")
	other.hello()
	other.startTLS()
	other.cmd("EHLO client.example", "250 ")
	other.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
}

// The slots kept for trusted clients go by the header's address too: the
// balancer's own address (127.0.0.1) is no more trusted than any other.
func TestProxyProtocolReservedSlots(t *testing.T) {
	cfg := testConfig(t) // trusted: 127.0.0.99
	cfg.Listeners[0].ProxyProtocol = true
	cfg.ProxyProtocol.Trusted = []string{"127.0.0.1/32"}
	cfg.ProxyProtocol.HeaderTimeout = time.Second
	cfg.Limits.MaxConnections = 2
	cfg.Limits.ReservedConnectionsPercent = 50 // strangers: 1
	p := &startedProxy{e: startServer(t, cfg)}
	a := dialFrom(t, p.e.addr(0), "127.0.0.1")
	a.write(header(t, 2, "192.0.2.1"))
	a.expect("220")
	b := dialFrom(t, p.e.addr(0), "127.0.0.1")
	b.write(header(t, 1, "192.0.2.2"))
	b.expect("421 4.7.0 Too many connections")
	c := dialFrom(t, p.e.addr(0), "127.0.0.1")
	c.write(header(t, 1, "127.0.0.99"))
	c.expect("220")
}
