package smtpd

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/metrics"
)

func TestNew_Refuses(t *testing.T) {
	q := &fakeQueue{}
	if _, err := New(Options{Queue: q}); err == nil {
		t.Error("nil Config accepted")
	}
	if _, err := New(Options{Config: testConfig(t)}); err == nil {
		t.Error("nil Queue accepted")
	}
	for _, tc := range []struct {
		want   string
		mutate func(*config.Config)
	}{
		{"max_recipients", func(c *config.Config) { c.Limits.MaxRecipients = 0 }},
		{"max_message_bytes", func(c *config.Config) { c.Limits.MaxMessageBytes = 0 }},
		{"command_timeout", func(c *config.Config) { c.Limits.CommandTimeout = 0 }},
		{"min_data_rate", func(c *config.Config) { c.Limits.MinDataRate = 0 }},
		{"max_junk_commands", func(c *config.Config) { c.Limits.MaxJunkCommands = 0 }},
		{"bare_cr", func(c *config.Config) { c.BareCR = "keep" }},
		// Several unset limits: the first in a fixed order is named, every time.
		{"max_message_bytes", func(c *config.Config) {
			c.Limits.MaxRecipients, c.Limits.MaxMessageBytes, c.Limits.MinDataRate = 0, 0, 0
		}},
		{"max_message_bytes", func(c *config.Config) {
			c.Limits.MaxRecipients, c.Limits.MaxMessageBytes, c.Limits.MinDataRate = 0, 0, 0
		}},
		{"max_message_bytes", func(c *config.Config) {
			c.Limits.MaxRecipients, c.Limits.MaxMessageBytes, c.Limits.MinDataRate = 0, 0, 0
		}},
		{"max_message_bytes", func(c *config.Config) {
			c.Limits.MaxRecipients, c.Limits.MaxMessageBytes, c.Limits.MinDataRate = 0, 0, 0
		}},
		{"needs users", func(c *config.Config) { c.Listeners[0].Mode = config.ModeSubmission }},
		{"/nonexistent", func(c *config.Config) { c.Listeners[0].TLSCert, c.Listeners[0].TLSKey = "/nonexistent", "/nonexistent" }},
		{"trusted_networks", func(c *config.Config) { c.TrustedNetworks = []string{"bogus"} }},
	} {
		cfg := testConfig(t)
		tc.mutate(cfg)
		if _, err := New(Options{Config: cfg, Queue: q}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
	cfg := testConfig(t)
	cfg.Listeners[0].Mode = config.ModeSubmission
	if _, err := New(Options{Config: cfg, Queue: q, Users: testUsers(t)}); err == nil || !strings.Contains(err.Error(), "needs tls_cert") {
		t.Errorf("submission without TLS: %v", err)
	}
}

func TestStart_NamesTheAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := testConfig(t)
	cfg.Listeners = append(cfg.Listeners, config.Listener{Address: busy.Addr().String(), Mode: config.ModeSMTP})
	srv, err := New(Options{Config: cfg, Queue: &fakeQueue{}})
	if err != nil {
		t.Fatal(err)
	}
	err = srv.Start()
	if err == nil || !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Fatalf("Start: %v", err)
	}
	if len(srv.Addrs()) != 0 {
		t.Error("listeners left bound")
	}
}

func TestServer_AddrsAndMetrics(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	cfg := testConfig(t)
	cfg.Listeners = append(cfg.Listeners, config.Listener{Address: "127.0.0.1:0", Mode: config.ModeSMTP})
	e := startServer(t, cfg, withUsers(testUsers(t)), func(o *Options) { o.Metrics = m })
	if len(e.srv.Addrs()) != 2 || e.addr(0) == e.addr(1) {
		t.Fatalf("Addrs %v", e.srv.Addrs())
	}
	c := dial(t, e.addr(1))
	c.hello()
	if got := testutil.ToFloat64(m.ConnectionsIn); got != 1 {
		t.Errorf("ConnectionsIn %v", got)
	}
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "bad"), "535 ")
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "554 5.7.1")
	c.cmd("QUIT", "221 ")
	c.expectClosed()
	if got := testutil.ToFloat64(m.AuthFailures); got != 1 {
		t.Errorf("AuthFailures %v", got)
	}
	if got := testutil.ToFloat64(m.Rejected.WithLabelValues("5xx", "relay")); got != 1 {
		t.Errorf("Rejected relay %v", got)
	}
	waitFor(t, "ConnectionsIn back to 0", func() bool { return testutil.ToFloat64(m.ConnectionsIn) == 0 })
}

// TestLimits_BDATChunkTimeout: a stalled BDAT chunk gets 451 4.4.2 (not
// go-smtp's 554 5.0.0 with the error text) and the connection closes.
func TestLimits_BDATChunkTimeout(t *testing.T) {
	cfg := trustedConfig(t)
	cfg.Limits.CommandTimeout = 300 * time.Millisecond
	e := startServer(t, cfg)
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "250 ")
	c.write(fmt.Sprintf("BDAT %d LAST\r\n%s", 100, "only part"))
	c.expect("451 4.4.2")
	c.expectClosed()
	if len(e.q.messages()) != 0 {
		t.Fatal("message stored")
	}
}

// TestBDATClientGoneMidChunk: a client that closes its side in the middle
// of a BDAT LAST chunk has not sent a message. go-smtp copies the chunk
// through an io.LimitReader, which takes the connection's EOF for a normal
// end; the short chunk must not be queued as the whole message.
func TestBDATClientGoneMidChunk(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "250 ")
	c.write(fmt.Sprintf("BDAT %d LAST\r\n%s", 1000, "Subject: cut\r\n\r\nonly part of it"))
	waitFor(t, "the chunk being read", func() bool { return e.srv.inData.Load() > 0 })
	c.conn.(*net.TCPConn).CloseWrite()
	// Read until the server closes: the session is over, so anything it
	// would store is stored. (What it answers a client that is gone does
	// not matter here.)
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c.r); err != nil {
		t.Fatalf("connection not closed: %v", err)
	}
	if n := len(e.q.messages()); n != 0 {
		t.Fatalf("%d messages stored from a chunk cut short", n)
	}
}

func TestEscaping(t *testing.T) {
	if got := printable("a\r\nb\x00ü"); got != `a\r\nb\x00ü` {
		t.Errorf("printable: %q", got)
	}
	if got := printable("plain@example.com"); got != "plain@example.com" {
		t.Errorf("printable: %q", got)
	}
	if got := cleanText("x\r\n250 injected"); got != "x  250 injected" {
		t.Errorf("cleanText: %q", got)
	}
	// C1 controls (here NEL and CSI) and invalid UTF-8 are no safer than C0.
	if got := cleanText("x\u0085y\u009b1m\xff"); got != "x y 1m " {
		t.Errorf("cleanText C1: %q", got)
	}
	// A cut never splits a UTF-8 sequence.
	if got := cleanText(strings.Repeat("a", 399) + "é"); got != strings.Repeat("a", 399) {
		t.Errorf("cleanText cut: %q", got[390:])
	}
	if got := formatReply(toReply(fmt.Errorf("wrapped: %w", reply(552, 5, 3, 4, "big")))); got != "552 5.3.4 big" {
		t.Errorf("wrapped SMTPError: %q", got)
	}
	if got := formatReply(toReply(fmt.Errorf("secret path /var/x"))); got != "451 4.3.0 Local error in processing, try again later" {
		t.Errorf("unknown error: %q", got)
	}
	full := &os.PathError{Op: "write", Path: "/q/queue.db", Err: syscall.ENOSPC}
	if got := formatReply(toReply(fmt.Errorf("commit: %w", full))); got != "452 4.3.1 Insufficient system storage" {
		t.Errorf("disk full during commit: %q", got)
	}
}

func TestAuthLimiter_Bounded(t *testing.T) {
	a := newAuthLimiter(3, 5, time.Hour, 64)
	now := time.Unix(1_700_000_000, 0)
	ip := netip.MustParseAddr("2001:db8::1")
	for range 10 {
		a.fail(ip, "alice", now)
	}
	if n, m := len(a.users[a.key(ip, "alice")]), len(a.addrs[clientKey(ip, 64)]); n != 3 || m != 5 {
		t.Errorf("kept %d timestamps for the pair, %d for the address", n, m)
	}
	if !a.locked(netip.MustParseAddr("2001:db8::ffff"), "alice", now) || !a.slowed(netip.MustParseAddr("2001:db8::ffff"), now) {
		t.Error("same /64 not locked or slowed")
	}
	if a.locked(ip, "bob", now) {
		t.Error("another user locked")
	}
	if a.locked(netip.MustParseAddr("2001:db8:0:1::1"), "alice", now) || a.slowed(netip.MustParseAddr("2001:db8:0:1::1"), now) {
		t.Error("other /64 locked or slowed")
	}
	for i := range 100 {
		a.fail(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), strings.Repeat("x", 10000)+string(rune('a'+i%26)), now)
	}
	for k := range a.users {
		if len(k.name) > maxNameLen+1 {
			t.Fatalf("kept a %d-octet name", len(k.name))
		}
	}
	for i := range maxUserKeys + 10 {
		a.fail(ip, fmt.Sprint("guess", i), now)
	}
	if len(a.users) > maxUserKeys {
		t.Errorf("%d pairs kept, at most %d", len(a.users), maxUserKeys)
	}
	a.fail(ip, "alice", now.Add(2*time.Hour)) // sweeps everything older than the window
	if len(a.addrs) != 1 || len(a.users) != 1 {
		t.Errorf("%d addresses, %d pairs kept after the sweep", len(a.addrs), len(a.users))
	}
}

// The real queue satisfies the interface the server depends on.
var _ Queue = (*queue.Queue)(nil)
