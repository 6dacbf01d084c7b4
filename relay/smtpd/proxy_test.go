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
