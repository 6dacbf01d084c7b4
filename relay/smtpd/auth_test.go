package smtpd

import (
	"bytes"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
)

func authEnv(t *testing.T, cfg *config.Config, opts ...envOpt) *testEnv {
	return startServer(t, cfg, append([]envOpt{withUsers(testUsers(t))}, opts...)...)
}

func TestAuth_PlainAndLogin(t *testing.T) {
	e := authEnv(t, testConfig(t))
	c := dial(t, e.addr(0))
	ehlo := c.hello()
	// A loopback listener offers AUTH without TLS.
	if !strings.Contains(strings.Join(ehlo, "\n"), "AUTH PLAIN LOGIN") {
		t.Fatalf("AUTH not advertised: %q", ehlo)
	}
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 2.0.0")
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "503 5.5.1")
	got := c.sendMessage("anyone@example.org", []string{"user@target.example"}, "Subject: x\r\n\r\nx\r\n")
	if !strings.HasPrefix(got, "250 2.0.0 OK queued as ") {
		t.Fatalf("DATA: %q", got)
	}
	m := e.q.messages()[0]
	if m.AuthUser != "alice" || !bytes.Contains(m.Body, []byte("with ESMTPA")) || bytes.Contains(m.Body, []byte("alice")) {
		t.Errorf("message %+v %q", m, m.Body)
	}

	// RFC 4954 §4: no initial response, then an empty challenge.
	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN", "334 ")
	c.cmd(plainAuth("alice", "alice", "alice-pw"), "235 2.0.0")

	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH LOGIN", "334 VXNlcm5hbWU6")
	c.cmd(b64("alice"), "334 UGFzc3dvcmQ6")
	c.cmd(b64("alice-pw"), "235 2.0.0")

	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH LOGIN "+b64("alice"), "334 UGFzc3dvcmQ6")
	c.cmd(b64("alice-pw"), "235 2.0.0")

	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH CRAM-MD5", "504 5.5.4")
	c.cmd("AUTH LOGIN", "334 ")
	c.cmd("*", "501 5.0.0")
	c.cmd("AUTH PLAIN "+b64("alice\x00alice-pw"), "501 5.5.2")
}

func TestAuth_FailuresPerConnection(t *testing.T) {
	e := authEnv(t, testConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "wrong"), "535 5.7.8 Authentication credentials invalid")
	c.cmd("AUTH PLAIN "+plainAuth("", "mallory", "alice-pw"), "535 5.7.8 Authentication credentials invalid")
	// Third failure: authorization identity differs from the authentication
	// identity (an impersonation attempt), and the per-connection limit.
	c.cmd("AUTH PLAIN "+plainAuth("bob", "alice", "alice-pw"), "421 4.7.0")
	c.expectClosed()
	for _, l := range e.logs.All() {
		for _, v := range l.ContextMap() {
			s, _ := v.(string)
			if strings.Contains(s, "alice-pw") || strings.Contains(s, "wrong") || strings.Contains(s, "mallory") ||
				strings.Contains(s, plainAuth("", "alice", "wrong")) {
				t.Errorf("AUTH data logged: %v", l.ContextMap())
			}
		}
	}
}

// TestAuth_LockoutPerAddressAndUser: failures lock one user from one
// address; the address as a whole is only slowed (every AUTH reply to it
// waits auth_delay, right or wrong), so other users behind it (a NAT)
// still log in.
func TestAuth_LockoutPerAddressAndUser(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.MaxAuthFailuresPerUser = 4
	cfg.Limits.MaxAuthFailuresPerIP = 6
	cfg.Limits.AuthDelay = 300 * time.Millisecond
	var now atomic.Int64
	now.Store(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	e := authEnv(t, cfg, func(o *Options) { o.Now = func() time.Time { return time.Unix(0, now.Load()) } })
	bad := "AUTH PLAIN " + plainAuth("", "alice", "wrong")
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd(bad, "535 5.7.8")
	c.cmd(bad, "535 5.7.8")
	c = dial(t, e.addr(0))
	c.hello()
	c.cmd(bad, "535 5.7.8")
	c.cmd(bad, "421 4.7.0") // the fourth for alice from this address
	c.expectClosed()
	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "421 4.7.0") // even the right password
	c.expectClosed()
	// Another user from the same address is not locked, nor slowed yet.
	timed := func(c *client, user, pw, want string) time.Duration {
		t.Helper()
		start := time.Now()
		c.cmd("AUTH PLAIN "+plainAuth("", user, pw), want)
		return time.Since(start)
	}
	c = dial(t, e.addr(0))
	c.hello()
	timed(c, "bob", "bob-pw", "235 ")
	// Two more failures (for a user that does not exist) put the address
	// over its ceiling: replies to it now wait, whoever they are for.
	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "carol", "x"), "535 5.7.8")
	c.cmd("AUTH PLAIN "+plainAuth("", "carol", "x"), "535 5.7.8")
	c = dial(t, e.addr(0))
	c.hello()
	if d := timed(c, "bob", "bob-pw", "235 "); d < cfg.Limits.AuthDelay {
		t.Errorf("AUTH from an address over its ceiling answered after %v, want at least %v", d, cfg.Limits.AuthDelay)
	}
	c = dial(t, e.addr(0))
	c.hello()
	if d := timed(c, "bob", "wrong", "535 "); d < cfg.Limits.AuthDelay {
		t.Errorf("a failure answered after %v, want at least %v like a success", d, cfg.Limits.AuthDelay)
	}
	// Another address is not affected at all.
	c = dialFrom(t, e.addr(0), "127.0.0.2")
	c.hello()
	if d := timed(c, "alice", "alice-pw", "235 "); d >= cfg.Limits.AuthDelay {
		t.Errorf("another address was slowed (%v)", d)
	}
	// An hour later alice may log in from the first address again.
	now.Add(int64(time.Hour))
	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
}

func TestAuth_AllowedSenders(t *testing.T) {
	e := authEnv(t, testConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "bob", "bob-pw"), "235 ")
	for from, want := range map[string]string{
		"<bob@example.com>":      "250 ",
		"<BOB@Example.COM>":      "250 ",
		"<anyone@corp.example>":  "250 ",
		"<eve@example.com>":      "553 5.7.1",
		"<bob@sub.corp.example>": "553 5.7.1",
		"<>":                     "553 5.7.1",
	} {
		c.cmd("MAIL FROM:"+from, want)
		c.cmd("RSET", "250 ")
	}
}

func TestAuth_SubmissionRequiresAuth(t *testing.T) {
	cert, key := writeCert(t)
	cfg := testConfig(t)
	cfg.Listeners = []config.Listener{{Address: "127.0.0.1:0", Mode: config.ModeSubmission, TLSCert: cert, TLSKey: key}}
	e := authEnv(t, cfg)
	c := dial(t, e.addr(0))
	c.hello()
	c.startTLS()
	c.cmd("EHLO client.example", "250 ")
	c.cmd("MAIL FROM:<alice@example.com>", "530 5.7.0 Authentication required")
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
	if got := c.sendMessage("alice@example.com", []string{"x@target.example"}, "Subject: x\r\n\r\nx\r\n"); !strings.HasPrefix(got, "250 ") {
		t.Fatal(got)
	}
	body := e.q.messages()[0].Body
	if !bytes.Contains(body, []byte("with ESMTPSA")) || !bytes.Contains(body, []byte("(using TLS 1.3 with cipher ")) {
		t.Errorf("Received: %q", body)
	}
}

// TestAuth_NotBeforeTLSOnPublicListener: on a non-loopback listener AUTH is
// neither advertised nor accepted before STARTTLS (523 5.7.10). Tests may
// only bind loopback, so the listener is configured as if bound elsewhere.
func TestAuth_NotBeforeTLSOnPublicListener(t *testing.T) {
	cert, key := writeCert(t)
	cfg := testConfig(t)
	cfg.Listeners = []config.Listener{{Address: "192.0.2.1:25", Mode: config.ModeSMTP, TLSCert: cert, TLSKey: key}}
	srv, err := New(Options{Config: cfg, Queue: &fakeQueue{}, Users: testUsers(t)})
	if err != nil {
		t.Fatal(err)
	}
	public := &net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 25}
	if srv.newSMTPServer(0, cfg.Listeners[0], &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}).AllowInsecureAuth != true {
		t.Error("loopback listener should allow AUTH without TLS")
	}
	pt := cfg.Listeners[0]
	pt.AllowPlaintextAuth = true
	if !srv.newSMTPServer(0, pt, public).AllowInsecureAuth {
		t.Error("allow_plaintext_auth ignored")
	}
	ss := srv.newSMTPServer(0, cfg.Listeners[0], public)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ss.Serve(&listener{Listener: ln, lim: srv.lim})
	t.Cleanup(func() { ss.Close() })
	c := dial(t, ln.Addr().String())
	if ehlo := c.hello(); strings.Contains(strings.Join(ehlo, "\n"), "AUTH") {
		t.Errorf("AUTH advertised before TLS: %q", ehlo)
	}
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "523 5.7.10")
	c.startTLS()
	if ehlo := c.cmd("EHLO client.example", "250 "); !strings.Contains(strings.Join(ehlo, "\n"), "AUTH PLAIN LOGIN") {
		t.Errorf("AUTH not advertised after TLS: %q", ehlo)
	}
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
}

// TestAuth_LostOnSTARTTLS: go-smtp starts a new session after STARTTLS, so
// an AUTH from before the upgrade does not carry over (authentication
// state must not survive a TLS upgrade).
func TestAuth_LostOnSTARTTLS(t *testing.T) {
	cert, key := writeCert(t)
	cfg := testConfig(t)
	cfg.Listeners[0].TLSCert, cfg.Listeners[0].TLSKey = cert, key
	e := authEnv(t, cfg)
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
	c.startTLS()
	c.cmd("EHLO client.example", "250 ")
	c.cmd("MAIL FROM:<a@example.com>", "250 ")
	c.cmd("RCPT TO:<x@target.example>", "554 5.7.1")
	c.cmd("RSET", "250 ")
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
	c.cmd("MAIL FROM:<a@example.com>", "250 ")
	c.cmd("RCPT TO:<x@target.example>", "250 ")
}

// TestAuth_NotDuringTransaction: RFC 4954 §4 (503). Otherwise a MAIL given
// before AUTH would escape the user's sender rules.
func TestAuth_NotDuringTransaction(t *testing.T) {
	e := authEnv(t, testConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<ceo@victim.example>", "250 ")
	c.cmd("AUTH PLAIN "+plainAuth("", "bob", "bob-pw"), "503 5.5.1")
	c.cmd("RCPT TO:<x@target.example>", "554 5.7.1")
	c.cmd("RSET", "250 ")
	c.cmd("AUTH PLAIN "+plainAuth("", "bob", "bob-pw"), "235 ")
	c.cmd("MAIL FROM:<ceo@victim.example>", "553 5.7.1")
}
