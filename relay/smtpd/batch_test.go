package smtpd

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
)

// recConn is a net.Conn that records every write(2) the server would make
// and answers reads from a fixed input.
type recConn struct {
	net.Conn // nil: unused methods panic
	mu       sync.Mutex
	writes   []string
	under    []time.Time // the write deadline of each write
	in       []byte
	failNext error // the next Write fails with it
	deadline time.Time
	closed   bool
}

func (r *recConn) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.failNext; err != nil {
		r.failNext = nil
		return 1, err // part of it went out
	}
	r.writes = append(r.writes, string(b))
	r.under = append(r.under, r.deadline)
	return len(b), nil
}

func (r *recConn) Read(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.in) == 0 {
		return 0, io.EOF // the client is done, as a closing socket says
	}
	n := copy(b, r.in)
	r.in = r.in[n:]
	return n, nil
}

func (r *recConn) SetWriteDeadline(t time.Time) error {
	r.mu.Lock()
	r.deadline = t
	r.mu.Unlock()
	return nil
}

func (r *recConn) SetReadDeadline(time.Time) error { return nil }

func (r *recConn) SetDeadline(t time.Time) error { return r.SetWriteDeadline(t) }

func (r *recConn) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	return nil
}

func (r *recConn) RemoteAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

func (r *recConn) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.writes...)
}

// newRecConn admits a recConn through a real server's limiter.
func newRecConn(t *testing.T) (*conn, *recConn) {
	t.Helper()
	srv, err := New(Options{Config: testConfig(t), Queue: &fakeQueue{}})
	if err != nil {
		t.Fatal(err)
	}
	rc := &recConn{in: []byte("NOOP\r\n")}
	c, refusal := srv.lim.admit(rc, false)
	if c == nil {
		t.Fatal(refusal)
	}
	return c, rc
}

func TestBatch_FlushPoints(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flush func(c *conn)
	}{
		{"read", func(c *conn) { c.Read(make([]byte, 10)) }},
		{"close", func(c *conn) { c.Close() }},
		{"earlier write deadline", func(c *conn) { c.SetWriteDeadline(time.Now()) }},
		{"earlier deadline", func(c *conn) { c.SetDeadline(time.Now()) }},
	} {
		c, rc := newRecConn(t)
		c.Write([]byte("250 a\r\n"))
		c.Write([]byte("250 b\r\n"))
		c.SetWriteDeadline(time.Now().Add(time.Hour)) // later than the session lifetime
		c.Write([]byte("354 c\r\n"))
		if got := rc.got(); len(got) != 0 {
			t.Fatalf("%s: written before a flush point: %q", tc.name, got)
		}
		tc.flush(c)
		if got := rc.got(); len(got) != 1 || got[0] != "250 a\r\n250 b\r\n354 c\r\n" {
			t.Errorf("%s: writes %q, want the three replies in one", tc.name, got)
		}
	}
}

// TestBatch_Deadlines: a write goes out under the deadline last set
// before it; one brought forward first sends what was written before it,
// under the deadline then in force.
func TestBatch_Deadlines(t *testing.T) {
	c, rc := newRecConn(t)
	now := time.Now()
	t1, t2, t3 := now.Add(time.Minute), now.Add(2*time.Minute), now.Add(time.Second)
	c.SetWriteDeadline(t1)
	c.Write([]byte("a"))
	c.SetWriteDeadline(t2) // later: "a" may take until t2
	c.Write([]byte("b"))
	c.SetWriteDeadline(t3) // earlier: "ab" goes out under t2 first
	c.Write([]byte("c"))
	c.SetDeadline(time.Time{}) // none: later than any, nothing is sent
	c.Write([]byte("d"))
	c.Read(make([]byte, 1))
	got := rc.got()
	if len(got) != 2 || got[0] != "ab" || got[1] != "cd" {
		t.Fatalf("writes %q", got)
	}
	if !rc.under[0].Equal(t2) || !rc.under[1].IsZero() {
		t.Errorf("written under %v, want %v and none", rc.under, t2)
	}
}

func TestBatch_Limit(t *testing.T) {
	c, rc := newRecConn(t)
	line := strings.Repeat("x", 1000)
	for range 4 {
		c.Write([]byte(line))
	}
	if got := rc.got(); len(got) != 0 {
		t.Fatalf("%d writes below the limit", len(got))
	}
	c.Write([]byte(line)) // 5000 octets: the first four go out
	if got := rc.got(); len(got) != 1 || len(got[0]) != 4000 {
		t.Fatalf("writes %d", len(got))
	}
	big := strings.Repeat("y", 2*batchLimit) // a TLS record: written as is
	c.Write([]byte(big))
	if got := rc.got(); len(got) != 3 || got[1] != line || got[2] != big {
		t.Fatalf("%d writes", len(got))
	}
}

// TestBatch_StickyWriteError: once part of a batch is lost nothing may
// follow it, and the next read reports the connection finished.
func TestBatch_StickyWriteError(t *testing.T) {
	c, rc := newRecConn(t)
	boom := errors.New("boom")
	rc.failNext = boom
	c.Write([]byte("250 a\r\n"))
	if _, err := c.Read(make([]byte, 10)); !errors.Is(err, boom) {
		t.Fatalf("read after a failed flush: %v", err)
	}
	if _, err := c.Write([]byte("250 b\r\n")); !errors.Is(err, boom) {
		t.Fatalf("write after a failed flush: %v", err)
	}
	if _, err := c.Read(make([]byte, 10)); !errors.Is(err, boom) {
		t.Fatalf("second read: %v", err)
	}
	if got := rc.got(); len(got) != 0 {
		t.Fatalf("written after the error: %q", got)
	}
	if !rc.closed {
		t.Error("not closed after the reply that followed the error")
	}
}

// TestBatch_GoodbyeBoundsTheBuffer: Shutdown's goodbye is written after
// what was buffered, all within its one-second deadline.
func TestBatch_GoodbyeBoundsTheBuffer(t *testing.T) {
	c, rc := newRecConn(t)
	c.setReplyConn(c)
	c.SetWriteDeadline(time.Now().Add(time.Hour))
	c.Write([]byte("250 a\r\n"))
	c.goodbye("421 4.3.2 Service shutting down")
	if got := rc.got(); len(got) != 1 || got[0] != "250 a\r\n421 4.3.2 Service shutting down\r\n" {
		t.Fatalf("writes %q", got)
	}
	if time.Until(rc.deadline) > time.Second {
		t.Errorf("write deadline %v", time.Until(rc.deadline))
	}
	if !rc.closed {
		t.Error("not closed")
	}
}

// TestBatch_PipelinedGroupOverLoopback: the replies to a pipelined group
// and the replies after it stay in order and complete.
func TestBatch_PipelinedGroupOverLoopback(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.expect("220 ")
	var group strings.Builder
	group.WriteString("EHLO client.example\r\n")
	for i := range 3 {
		group.WriteString("MAIL FROM:<a@x.example>\r\nRCPT TO:<b@y.example>\r\nRCPT TO:<c@y.example>\r\nRSET\r\n")
		if i == 1 {
			group.WriteString("NOOP\r\n")
		}
	}
	group.WriteString("MAIL FROM:<a@x.example>\r\nRCPT TO:<b@y.example>\r\nDATA\r\n")
	c.write(group.String())
	c.expect("250 ")
	for i := range 3 {
		c.expect("250 2.0.0") // MAIL
		c.expect("250 2.0.0") // RCPT
		c.expect("250 2.0.0") // RCPT
		c.expect("250 2.0.0") // RSET
		if i == 1 {
			c.expect("250 2.0.0") // NOOP
		}
	}
	c.expect("250 ")
	c.expect("250 ")
	c.expect("354 ")
	c.write("Subject: x\r\n\r\nx\r\n.\r\nQUIT\r\n")
	c.expect("250 2.0.0 OK queued as")
	c.expect("221 ")
	c.expectClosed()
}

// TestBatch_TLSClose: the last reply over TLS and the close_notify alert
// go out although crypto/tls sets a write deadline of "now" right after
// writing the alert (implicit TLS and STARTTLS, closed by QUIT, by the
// junk limit and by Shutdown).
func TestBatch_TLSClose(t *testing.T) {
	cert, key := writeCert(t)
	cfg := testConfig(t)
	cfg.TrustedNetworks = []string{"127.0.0.0/8"}
	cfg.Limits.MaxJunkCommands = 1
	cfg.Listeners = []config.Listener{
		{Address: "127.0.0.1:0", Mode: config.ModeSubmissions, TLSCert: cert, TLSKey: key},
		{Address: "127.0.0.1:0", Mode: config.ModeSMTP, TLSCert: cert, TLSKey: key},
	}
	e := startServer(t, cfg, withUsers(testUsers(t)))
	implicit := func() *client { c := dialTLS(t, e.addr(0)); c.hello(); return c }
	starttls := func() *client {
		c := dial(t, e.addr(1))
		c.hello()
		c.startTLS()
		c.cmd("EHLO client.example", "250 ")
		return c
	}
	for name, open := range map[string]func() *client{"implicit": implicit, "starttls": starttls} {
		c := open()
		c.cmd("QUIT", "221 ")
		expectCloseNotify(t, name, c)

		c = open()
		c.cmd("NOOP", "250 ")
		c.cmd("NOOP", "250 ")
		c.expect("421 4.7.0")
		expectEOF(t, name, c)
	}
	idle := []*client{implicit(), starttls()}
	shutdownAsync(e, 5*time.Second)
	for _, c := range idle {
		c.expect("421 4.3.2")
		expectEOF(t, "shutdown", c)
	}
}

// expectCloseNotify reads to the end of a TLS stream, which must be the
// peer's close_notify (io.EOF), not a bare TCP close.
func expectCloseNotify(t *testing.T, name string, c *client) {
	t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := c.r.ReadString('\n')
	if err == nil || rest != "" || err.Error() != "EOF" {
		t.Errorf("%s: after the last reply: %q, %v (want a close_notify)", name, rest, err)
	}
}

// expectEOF reads to the end of the stream, which must have nothing more.
func expectEOF(t *testing.T, name string, c *client) {
	t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := c.r.ReadString('\n')
	var ne net.Error
	if rest != "" || err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("%s: after the last reply: %q, %v", name, rest, err)
	}
}

// After a goodbye bounded the writes, the session's own later deadlines
// (go-smtp sets now+WriteTimeout before each reply) must not lift it.
func TestBatch_CutDeadlineStands(t *testing.T) {
	c, rc := newRecConn(t)
	cut := time.Now().Add(time.Second)
	c.out.cutDeadline(cut)
	c.SetWriteDeadline(time.Now().Add(time.Hour))
	c.Write([]byte("250 late\r\n"))
	c.Read(make([]byte, 1))
	if len(rc.under) != 1 || !rc.under[0].Equal(cut) {
		t.Errorf("written under %v, want the cut %v", rc.under, cut)
	}
}
