package smtpd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/crypto/bcrypt"

	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// fakeQueue records what was enqueued (a copy: Queue.Enqueue must not
// keep the body). fail makes Enqueue fail; gate, if
// set, makes Enqueue wait for a value before committing, and waiting, if
// set, is sent a value once Enqueue is waiting there.
type fakeQueue struct {
	mu      sync.Mutex
	msgs    []queue.NewMessage
	fail    error
	gate    chan struct{}
	waiting chan struct{}
}

func (q *fakeQueue) Enqueue(m queue.NewMessage) (queue.ID, error) {
	q.mu.Lock()
	gate, fail, waiting := q.gate, q.fail, q.waiting
	q.mu.Unlock()
	if gate != nil {
		if waiting != nil {
			waiting <- struct{}{}
		}
		<-gate
	}
	if fail != nil {
		return 0, fail
	}
	m.Body = bytes.Clone(m.Body) // the server reuses its buffer once we return
	q.mu.Lock()
	defer q.mu.Unlock()
	q.msgs = append(q.msgs, m)
	return queue.ID(len(q.msgs)), nil
}

func (q *fakeQueue) messages() []queue.NewMessage {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]queue.NewMessage(nil), q.msgs...)
}

// testConfig is the embedded default with test-sized values. Clients are
// untrusted: only 127.0.0.99 is trusted, and tests connect from 127.0.0.1.
func testConfig(t testing.TB) *config.Config {
	t.Helper()
	cfg, err := config.Load(config.Source{Default: configs.Default})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Hostname = "relay.test"
	cfg.Listeners = []config.Listener{{Address: "127.0.0.1:0", Mode: config.ModeSMTP}}
	cfg.TrustedNetworks = []string{"127.0.0.99/32"}
	cfg.Queue.Path = filepath.Join(t.TempDir(), "q", "queue.db")
	cfg.Limits.CommandTimeout = 5 * time.Second
	cfg.Limits.MaxMessageBytes = 100000
	return cfg
}

type testEnv struct {
	t    testing.TB
	srv  *Server
	q    *fakeQueue
	logs *observer.ObservedLogs
	disk atomic.Uint64
	// statfs counts the free-space measurements.
	statfs atomic.Int64
}

type envOpt func(*Options)

func withUsers(u *Users) envOpt { return func(o *Options) { o.Users = u } }

// startServer runs a server for the test and shuts it down afterwards.
func startServer(t testing.TB, cfg *config.Config, opts ...envOpt) *testEnv {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	e := &testEnv{t: t, q: &fakeQueue{}, logs: logs}
	e.disk.Store(1 << 40)
	o := Options{Config: cfg, Queue: e.q, Logger: zap.New(core),
		DiskFree: func(string) (uint64, error) { e.statfs.Add(1); return e.disk.Load(), nil }}
	for _, f := range opts {
		f(&o)
	}
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		// go-smtp recovers panics in session methods and reports them
		// through ErrorLog, which logs them at error level.
		for _, entry := range logs.FilterMessage("go-smtp").All() {
			if entry.Level >= zap.ErrorLevel {
				t.Errorf("server logged a panic: %v", entry.ContextMap())
			}
		}
	})
	return e
}

func (e *testEnv) addr(i int) string { return e.srv.Addrs()[i].String() }

// client is a transcript-style SMTP client: it sends lines and asserts the
// replies, enhanced codes included.
type client struct {
	t    testing.TB
	conn net.Conn
	r    *bufio.Reader
}

func dial(t testing.TB, addr string) *client {
	t.Helper()
	return dialFrom(t, addr, "")
}

// dialFrom dials from a given loopback source address ("" for any).
func dialFrom(t testing.TB, addr, src string) *client {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return &client{t: t, conn: c, r: bufio.NewReader(c)}
}

// reply reads one (possibly multi-line) reply and returns its lines as
// sent. smtpvocab.Parser checks each line, so a malformed reply fails the
// test.
func (c *client) reply() []string {
	c.t.Helper()
	var p smtpvocab.Parser
	var lines []string
	for {
		l, err := c.r.ReadString('\n')
		if err != nil {
			c.t.Fatalf("reading reply after %q: %v", lines, err)
		}
		l = strings.TrimRight(l, "\r\n")
		lines = append(lines, l)
		r, err := p.Add(l)
		if err != nil {
			c.t.Fatalf("malformed reply %q: %v", lines, err)
		}
		if r != nil {
			return lines
		}
	}
}

// expect reads a reply whose last line starts with want.
func (c *client) expect(want string) []string {
	c.t.Helper()
	lines := c.reply()
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, want) {
		c.t.Fatalf("got %q, want %q", lines, want)
	}
	return lines
}

func (c *client) send(line string) {
	c.t.Helper()
	c.write(line + "\r\n")
}

func (c *client) write(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, s); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// cmd sends a command and expects a reply starting with want.
func (c *client) cmd(line, want string) []string {
	c.t.Helper()
	c.send(line)
	return c.expect(want)
}

// hello reads the greeting and says EHLO.
func (c *client) hello() []string {
	c.t.Helper()
	c.expect("220 ")
	return c.cmd("EHLO client.example", "250 ")
}

// expectClosed asserts the server closes the connection without sending
// anything more.
func (c *client) expectClosed() {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(c.r)
	if len(rest) > 0 {
		c.t.Fatalf("unexpected data before close: %q", rest)
	}
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatal("connection not closed")
	}
}

// startTLS upgrades the connection.
func (c *client) startTLS() {
	c.t.Helper()
	c.cmd("STARTTLS", "220 2.0.0")
	tc := tls.Client(c.conn, &tls.Config{InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		c.t.Fatal(err)
	}
	c.conn, c.r = tc, bufio.NewReader(tc)
}

// sendMessage runs one transaction from MAIL to the end of DATA and returns
// the final reply line.
func (c *client) sendMessage(from string, to []string, body string) string {
	c.t.Helper()
	c.cmd("MAIL FROM:<"+from+">", "250 ")
	for _, r := range to {
		c.cmd("RCPT TO:<"+r+">", "250 ")
	}
	c.cmd("DATA", "354 ")
	c.write(body + ".\r\n")
	lines := c.reply()
	return lines[len(lines)-1]
}

func plainAuth(authz, user, pass string) string {
	return base64.StdEncoding.EncodeToString([]byte(authz + "\x00" + user + "\x00" + pass))
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// testUsers: alice may send as any address nobody lists; bob only as listed.
func testUsers(t testing.TB) *Users {
	t.Helper()
	hash := func(pw string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
	u, err := ParseUsers(strings.NewReader("# test users\nalice:" + hash("alice-pw") + "\n\n" +
		"bob:" + hash("bob-pw") + ":bob@example.com,@corp.example\n"))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// writeCert writes a self-signed certificate for relay.test, localhost and
// 127.0.0.1.
func writeCert(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	c := relaytest.NewCert(t, "relay.test", "localhost", "127.0.0.1")
	return c.CertFile, c.KeyFile
}

// strayCRLF reports whether b has a CR or LF outside a CRLF pair.
func strayCRLF(b []byte) bool {
	for i, c := range b {
		switch c {
		case '\r':
			if i+1 >= len(b) || b[i+1] != '\n' {
				return true
			}
		case '\n':
			if i == 0 || b[i-1] != '\r' {
				return true
			}
		}
	}
	return false
}

// bodyOf strips our Received header (its first line and the tab-folded
// continuation lines) from a stored body.
func bodyOf(b []byte) []byte {
	_, rest, _ := bytes.Cut(b, []byte("\r\n"))
	for bytes.HasPrefix(rest, []byte("\t")) {
		_, rest, _ = bytes.Cut(rest, []byte("\r\n"))
	}
	return rest
}
