package delivery

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/metrics"
	"github.com/greyrelay/greyrelay/relay/mx"
)

// pipeMX is a go-smtp server reached through net.Pipe, so that an engine
// and its peers run together inside a testing/synctest bubble: a pipe
// blocks durably, where a TCP socket would keep the fake clock from
// moving while a connection sits idle. It is the engine's Dialer4: every
// dial, whatever the address, opens a connection to it; rcpt answers each
// RCPT (nil accepts) on the bubble's clock and may keep state, under the
// server's lock.
type pipeMX struct {
	srv   *smtp.Server
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once

	mu   sync.Mutex
	rcpt func(host, from, to string, now time.Time) *smtp.SMTPError
	log  []pipeRcpt

	// dataDelay is how long the server takes over a message's data (set
	// before the first connection): a transaction's length on the fake
	// clock, where the rest takes no time.
	dataDelay time.Duration
	// rcptDelay is how long it takes over each RCPT before answering
	// (set before the first connection), outside the server's lock.
	rcptDelay time.Duration
}

// pipeRcpt is one RCPT the server answered.
type pipeRcpt struct {
	at       time.Time
	host     string // the address dialed
	from, to string
	ok       bool
}

// startPipeMX starts the server; stop it with close before the bubble ends.
func startPipeMX(rcpt func(host, from, to string, now time.Time) *smtp.SMTPError) *pipeMX {
	p := &pipeMX{conns: make(chan net.Conn), done: make(chan struct{}), rcpt: rcpt}
	p.srv = smtp.NewServer(pipeBackend{p})
	p.srv.Domain = "mx.pipe.test"
	p.srv.ErrorLog = log.New(io.Discard, "", 0)
	go func() { _ = p.srv.Serve(pipeListener{p}) }()
	return p
}

// DialContext is smtpclient.Dialer: a new pipe to the server, which
// learns the address dialed (greylisters and rate limiters are per host).
func (p *pipeMX) DialContext(ctx context.Context, _, addr string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case p.conns <- hostConn{s, addr}:
		return c, nil
	case <-p.done:
		return nil, errors.New("pipe MX closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (p *pipeMX) close() {
	p.once.Do(func() { close(p.done) })
	_ = p.srv.Close()
}

// rcpts returns the RCPTs answered so far.
func (p *pipeMX) rcpts() []pipeRcpt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]pipeRcpt(nil), p.log...)
}

// hostConn is the server's end of a pipe, with the address dialed.
type hostConn struct {
	net.Conn
	host string
}

type pipeListener struct{ p *pipeMX }

func (l pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.p.conns:
		return c, nil
	case <-l.p.done:
		return nil, net.ErrClosed
	}
}
func (l pipeListener) Close() error   { l.p.once.Do(func() { close(l.p.done) }); return nil }
func (l pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 25} }

type pipeBackend struct{ p *pipeMX }

func (b pipeBackend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	host := ""
	if hc, ok := c.Conn().(hostConn); ok {
		host, _, _ = strings.Cut(hc.host, ":")
	}
	return &pipeSession{p: b.p, host: host}, nil
}

type pipeSession struct {
	p    *pipeMX
	host string
	from string
}

func (s *pipeSession) Mail(from string, _ *smtp.MailOptions) error { s.from = from; return nil }

func (s *pipeSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	time.Sleep(s.p.rcptDelay)
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	now := time.Now()
	var err *smtp.SMTPError
	if s.p.rcpt != nil {
		err = s.p.rcpt(s.host, s.from, to, now)
	}
	s.p.log = append(s.p.log, pipeRcpt{at: now, host: s.host, from: s.from, to: to, ok: err == nil})
	if err != nil {
		return err
	}
	return nil
}

func (s *pipeSession) Data(r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	time.Sleep(s.p.dataDelay)
	return err
}
func (s *pipeSession) Reset()        {}
func (s *pipeSession) Logout() error { return nil }

// pipeEngine is an engine with configs/default.yaml's settings (only what
// a loopback test needs is changed: the hostname, private destinations,
// routes), on a queue of its own, delivering through p. Call it inside
// synctest.Test; stop ends it.
type pipeEngine struct {
	q      *queue.Queue
	eng    *Engine
	cancel context.CancelFunc
	done   chan error
}

// startPipeEngine routes each domain of routes to its "ip:port" and starts
// the engine; mod, if not nil, adjusts the configuration.
func startPipeEngine(t *testing.T, p *pipeMX, routes map[string]string, rnd func() float64, mod func(*config.Config), opts ...func(*Options)) *pipeEngine {
	t.Helper()
	const yaml = "hostname: relay.test\ndelivery:\n  source_ipv4: 127.0.0.2\n  allow_private_destinations: true\n"
	cfg, err := config.Load(config.Source{Default: configs.Default, File: []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Delivery.Routes = routes
	if mod != nil {
		mod(cfg)
	}
	q, err := queue.Open(filepath.Join(t.TempDir(), "q.db"), queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := classifier.New(nil)
	o := Options{Config: cfg, Queue: q, Classifier: cl,
		Router:  &mx.Router{Routes: routes, IPv4: true, AllowPrivate: true},
		Dialer4: p, Logger: zap.NewNop(), Metrics: metrics.New(prometheus.NewRegistry()),
		Now: time.Now, Rand: rnd}
	for _, f := range opts {
		f(&o)
	}
	eng, err := New(o)
	if err != nil {
		q.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pe := &pipeEngine{q: q, eng: eng, cancel: cancel, done: make(chan error, 1)}
	go func() { pe.done <- eng.Run(ctx) }()
	return pe
}

// send queues a message from from to each of to, due now.
func (pe *pipeEngine) send(t *testing.T, from string, to ...string) {
	t.Helper()
	m := queue.NewMessage{From: from, Arrival: time.Now(), Body: []byte("Subject: t\r\n\r\nt\r\n")}
	for _, a := range to {
		_, domain, _ := strings.Cut(a, "@")
		m.To = append(m.To, queue.NewRecipient{Addr: a, Domain: domain})
	}
	if _, err := pe.q.Enqueue(m); err != nil {
		t.Fatal(err)
	}
}

func (pe *pipeEngine) stop(t *testing.T) {
	t.Helper()
	pe.cancel()
	if err := <-pe.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	pe.q.Close()
}
