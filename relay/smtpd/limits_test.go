package smtpd

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

func TestLimits_ConnectionCaps(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.MaxConnections = 3
	cfg.Limits.MaxConnectionsPerIP = 2
	e := startServer(t, cfg)
	a := dialFrom(t, e.addr(0), "127.0.0.1")
	a.expect("220 ")
	b := dialFrom(t, e.addr(0), "127.0.0.1")
	b.expect("220 ")
	x := dialFrom(t, e.addr(0), "127.0.0.1")
	x.expect("421 4.7.0 Too many connections from your address")
	x.expectClosed()
	d := dialFrom(t, e.addr(0), "127.0.0.2")
	d.expect("220 ")
	y := dialFrom(t, e.addr(0), "127.0.0.3")
	y.expect("421 4.7.0 Too many connections")
	y.expectClosed()
	// A closed connection frees its place.
	a.cmd("QUIT", "221 ")
	a.expectClosed()
	deadline := time.Now().Add(5 * time.Second)
	for {
		z := dialFrom(t, e.addr(0), "127.0.0.3")
		if l := z.reply(); strings.HasPrefix(l[0], "220 ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("place not freed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLimits_DataTimeoutCloses: a stalled body gets 451 4.4.2 and
// the connection closes; what the client sends later is never a command.
func TestLimits_DataTimeoutCloses(t *testing.T) {
	cfg := trustedConfig(t)
	cfg.Limits.CommandTimeout = 300 * time.Millisecond
	e := startServer(t, cfg)
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "250 ")
	c.cmd("DATA", "354 ")
	c.write("Subject: x\r\n\r\npart")
	c.expect("451 4.4.2")
	c.write("\r\nMAIL FROM:<smuggled@x.example>\r\n")
	c.expectClosed()
	if len(e.q.messages()) != 0 {
		t.Fatal("message enqueued")
	}
}

// TestLimits_MinDataRate: the DATA deadline moves with the data. A client
// above min_data_rate may take longer than command_timeout in all; one
// below it is cut off.
func TestLimits_MinDataRate(t *testing.T) {
	cfg := trustedConfig(t)
	cfg.Limits.CommandTimeout = 300 * time.Millisecond
	cfg.Limits.MinDataRate = 1000 // 1 ms of credit per octet
	e := startServer(t, cfg)

	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "250 ")
	c.cmd("DATA", "354 ")
	line := strings.Repeat("f", 198) + "\r\n" // 200 ms of credit per 100 ms
	for range 8 {
		c.write(line)
		time.Sleep(100 * time.Millisecond)
	}
	c.write(".\r\n")
	c.expect("250 ")

	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "250 ")
	c.cmd("DATA", "354 ")
	start := time.Now()
	done := make(chan struct{})
	go func() { // 10 octets (10 ms of credit) every 100 ms
		defer close(done)
		for range 30 {
			if _, err := c.conn.Write([]byte("slow drip\n")); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	c.expect("451 4.4.2")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("slow client kept for %v", d)
	}
	<-done
	if len(e.q.messages()) != 1 {
		t.Fatalf("%d messages", len(e.q.messages()))
	}
}

// TestLimits_JunkCommands: NOOP/RSET/VRFY/HELP cannot hold a
// connection forever; accepting a message restarts the count.
func TestLimits_JunkCommands(t *testing.T) {
	cfg := trustedConfig(t)
	cfg.Limits.MaxJunkCommands = 3
	e := startServer(t, cfg)
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("NOOP", "250 ")
	c.cmd("VRFY x", "252 ")
	c.cmd("RSET", "250 ")
	if got := c.sendMessage("a@x.example", []string{"b@y.example"}, "x\r\n"); !strings.HasPrefix(got, "250 ") {
		t.Fatal(got)
	}
	c.cmd("RSET", "250 ")
	c.cmd("HELP", "502 ")
	c.cmd("NOOP", "250 ")
	c.cmd("NOOP", "250 ") // one past the limit is answered, then 421
	c.expect("421 4.7.0 Too many commands without mail")
	c.expectClosed()
}

// TestLimits_SessionLifetime: the connection ends after session_lifetime
// even though the client stays within command_timeout.
func TestLimits_SessionLifetime(t *testing.T) {
	cfg := trustedConfig(t)
	cfg.Limits.SessionLifetime = 500 * time.Millisecond
	e := startServer(t, cfg)
	c := dial(t, e.addr(0))
	c.hello()
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		c.cmd("MAIL FROM:<a@x.example>", "250 ")
		c.cmd("RSET", "250 ")
		time.Sleep(50 * time.Millisecond)
	}
	c.expect("421 4.4.2")
	c.expectClosed()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("closed after %v", d)
	}
}

// TestLimits_BDAT covers a refused BDAT chunk (discarded, never run as
// commands, which go-smtp before v0.25.1 did) and a BDAT message, with stray line ends normalised.
func TestLimits_BDAT(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	chunk := "MAIL FROM:<smuggled@x.example>\r\n"
	c.write(fmt.Sprintf("BDAT %d LAST\r\n%s", len(chunk), chunk))
	c.expect("502 5.5.1")
	c.cmd("RCPT TO:<b@y.example>", "502 5.5.1") // no MAIL was run
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "250 ")
	c.write("BDAT 8\r\nSubject:")
	c.expect("250 ")
	chunk = " x\n\nbo\rdy"
	c.write(fmt.Sprintf("BDAT %d LAST\r\n%s", len(chunk), chunk))
	c.expect("250 2.0.0 OK queued as")
	m := e.q.messages()
	if len(m) != 1 || string(bodyOf(m[0].Body)) != "Subject: x\r\n\r\nbo dy\r\n" {
		t.Fatalf("messages %+v", m)
	}
}

// addrConn is a net.Conn that claims to come from addr.
type addrConn struct {
	net.Conn
	addr net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.addr }

// TestLimits_IPv6Prefix: the per-client connection cap counts IPv6
// clients by their limits.ipv6_prefix_length prefix, so a host cannot
// dodge it by picking a new address from its /64 for every connection.
func TestLimits_IPv6Prefix(t *testing.T) {
	for _, tc := range []struct {
		bits      int
		second    string
		wantAdmit bool
	}{
		{64, "2001:db8:0:1::2", false},      // same /64
		{64, "2001:db8:0:1:ffff::9", false}, // same /64
		{64, "2001:db8:0:2::1", true},       // next /64
		{128, "2001:db8:0:1::2", true},      // every address its own
		{48, "2001:db8:0:2::1", false},      // same /48
		{64, "192.0.2.1", true},
	} {
		cfg := testConfig(t)
		cfg.Limits.MaxConnectionsPerIP = 1
		cfg.Limits.IPv6PrefixLength = tc.bits
		srv, err := New(Options{Config: cfg, Queue: &fakeQueue{}})
		if err != nil {
			t.Fatal(err)
		}
		from := func(ip string) net.Conn {
			a, b := net.Pipe()
			t.Cleanup(func() { a.Close(); b.Close() })
			return addrConn{Conn: a, addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 4000}}
		}
		if c, why := srv.lim.admit(from("2001:db8:0:1::1"), false); c == nil {
			t.Fatalf("first connection refused: %s", why)
		}
		c, why := srv.lim.admit(from(tc.second), false)
		if (c != nil) != tc.wantAdmit {
			t.Errorf("/%d, then %s: admitted %v (%s), want %v", tc.bits, tc.second, c != nil, why, tc.wantAdmit)
		}
		if !tc.wantAdmit && !strings.Contains(why, "from your address") {
			t.Errorf("refusal %q", why)
		}
	}
}

// TestAdmission_ReservedSlots: strangers (neither trusted nor
// authenticated) cannot take the reserved share of max_connections; a
// trusted client still gets in when they hold all of theirs, and a
// stranger that authenticates leaves the strangers' share.
func TestAdmission_ReservedSlots(t *testing.T) {
	cfg := testConfig(t) // trusted: 127.0.0.99
	cfg.Limits.MaxConnections = 10
	cfg.Limits.MaxConnectionsPerIP = 10
	cfg.Limits.ReservedConnectionsPercent = 20 // strangers: 8
	e := authEnv(t, cfg)
	var strangers []*client
	for i := range 8 {
		c := dialFrom(t, e.addr(0), fmt.Sprintf("127.0.0.%d", 1+i%4))
		c.expect("220 ")
		strangers = append(strangers, c)
	}
	x := dialFrom(t, e.addr(0), "127.0.0.5")
	x.expect("421 4.7.0 Too many connections")
	x.expectClosed()
	trusted := dialFrom(t, e.addr(0), "127.0.0.99")
	trusted.hello()
	if got := trusted.sendMessage("app@example.org", []string{"x@target.example"}, "Subject: x\r\n\r\nx\r\n"); !strings.HasPrefix(got, "250 ") {
		t.Fatalf("trusted client with the strangers' share full: %q", got)
	}
	// A stranger authenticates: its connection moves to the reserved
	// share, and another stranger fits in again.
	strangers[0].cmd("EHLO client.example", "250 ")
	strangers[0].cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
	y := dialFrom(t, e.addr(0), "127.0.0.6")
	y.expect("220 ")
	// The whole server is now full (8 strangers, 2 privileged): even a
	// trusted client waits.
	z := dialFrom(t, e.addr(0), "127.0.0.99")
	z.expect("421 4.7.0 Too many connections")
}

// TestAdmission_StressTimeout: once the open connections reach
// stress_percent of max_connections, idle strangers are cut after
// stress_command_timeout (421 4.4.2, as go-smtp says on an idle timeout),
// including those already waiting; trusted and authenticated sessions
// keep command_timeout.
func TestAdmission_StressTimeout(t *testing.T) {
	cfg := testConfig(t) // trusted: 127.0.0.99
	cfg.Limits.MaxConnections = 10
	cfg.Limits.MaxConnectionsPerIP = 10
	cfg.Limits.StressPercent = 50 // from 5 connections
	cfg.Limits.CommandTimeout = 10 * time.Second
	cfg.Limits.StressCommandTimeout = 300 * time.Millisecond
	e := authEnv(t, cfg)
	trusted := dialFrom(t, e.addr(0), "127.0.0.99")
	trusted.hello()
	authed := dialFrom(t, e.addr(0), "127.0.0.1")
	authed.hello()
	authed.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
	idle := dialFrom(t, e.addr(0), "127.0.0.2")
	idle.hello()
	// Below stress, an idle stranger keeps command_timeout.
	time.Sleep(2 * cfg.Limits.StressCommandTimeout) // must not be cut: there is no event to wait for
	idle.cmd("NOOP", "250 ")
	// Two more strangers: five connections, stress.
	more := []*client{dialFrom(t, e.addr(0), "127.0.0.3"), dialFrom(t, e.addr(0), "127.0.0.4")}
	for _, c := range append(more, idle) {
		if c != idle {
			c.expect("220 ")
		}
		c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		c.expect("421 4.4.2")
		c.expectClosed()
	}
	trusted.cmd("NOOP", "250 ")
	authed.cmd("NOOP", "250 ")
}
