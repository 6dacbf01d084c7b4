package smtpd

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
)

func tlsConfig(t *testing.T) *config.Config {
	cert, key := writeCert(t)
	cfg := testConfig(t)
	cfg.TrustedNetworks = []string{"127.0.0.0/8"}
	cfg.Listeners[0].TLSCert, cfg.Listeners[0].TLSKey = cert, key
	return cfg
}

func TestTLS_STARTTLS(t *testing.T) {
	e := startServer(t, tlsConfig(t))
	c := dial(t, e.addr(0))
	if ehlo := c.hello(); !strings.Contains(strings.Join(ehlo, "\n"), "STARTTLS") {
		t.Fatalf("STARTTLS not offered: %q", ehlo)
	}
	c.startTLS()
	if ehlo := c.cmd("EHLO client.example", "250 "); strings.Contains(strings.Join(ehlo, "\n"), "STARTTLS") {
		t.Errorf("STARTTLS offered again: %q", ehlo)
	}
	c.cmd("STARTTLS", "502 5.5.1")
	if got := c.sendMessage("a@x.example", []string{"b@y.example"}, "Subject: x\r\n\r\nx\r\n"); !strings.HasPrefix(got, "250 ") {
		t.Fatal(got)
	}
	body := e.q.messages()[0].Body
	if !bytes.Contains(body, []byte("(using TLS 1.3 with cipher TLS_")) || !bytes.Contains(body, []byte("with ESMTPS\r\n")) {
		t.Errorf("Received: %q", body)
	}
}

func TestTLS_NotConfigured(t *testing.T) {
	e := startServer(t, testConfig(t))
	c := dial(t, e.addr(0))
	if ehlo := c.hello(); strings.Contains(strings.Join(ehlo, "\n"), "STARTTLS") {
		t.Errorf("STARTTLS offered without a certificate: %q", ehlo)
	}
	c.cmd("STARTTLS", "502 5.5.1")
}

// TestTLS_CommandInjection is CVE-2011-0411: a command pipelined behind
// STARTTLS in the same segment must not be answered after the handshake.
func TestTLS_CommandInjection(t *testing.T) {
	e := startServer(t, tlsConfig(t), withUsers(testUsers(t)))
	for _, injected := range []string{"RSET", "MAIL FROM:<injected@x.example>", "AUTH PLAIN " + plainAuth("", "alice", "alice-pw")} {
		c := dial(t, e.addr(0))
		c.hello()
		c.write("STARTTLS\r\n" + injected + "\r\n")
		c.expect("220 2.0.0")
		tc := tls.Client(c.conn, &tls.Config{InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		c.conn, c.r = tc, bufio.NewReader(tc)
		lines := c.cmd("EHLO client.example", "250 ")
		if !strings.HasPrefix(lines[0], "250-Hello client.example") {
			t.Errorf("%s: first reply after the handshake is %q", injected, lines)
		}
		// The injected AUTH/MAIL had no effect either: not already
		// authenticated (503), no transaction open (503).
		c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
		c.cmd("MAIL FROM:<a@x.example>", "250 ")
	}
}

func TestTLS_Submissions(t *testing.T) {
	cert, key := writeCert(t)
	cfg := testConfig(t)
	cfg.Listeners = []config.Listener{{Address: "127.0.0.1:0", Mode: config.ModeSubmissions, TLSCert: cert, TLSKey: key}}
	e := startServer(t, cfg, withUsers(testUsers(t)))
	c := dialTLS(t, e.addr(0))
	if ehlo := c.hello(); strings.Contains(strings.Join(ehlo, "\n"), "STARTTLS") {
		t.Errorf("STARTTLS offered under implicit TLS: %q", ehlo)
	}
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
	if got := c.sendMessage("a@x.example", []string{"b@y.example"}, "Subject: x\r\n\r\nx\r\n"); !strings.HasPrefix(got, "250 ") {
		t.Fatal(got)
	}
	// Plaintext on the implicit-TLS port gets no SMTP greeting.
	p := dial(t, e.addr(0))
	p.write("EHLO client.example\r\n")
	p.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(p.r)
	if bytes.Contains(got, []byte("220 ")) || bytes.Contains(got, []byte("250")) {
		t.Errorf("plaintext answered on the TLS port: %q", got)
	}
}
