package delivery

import (
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// fakeMX is a scripted go-smtp server on one loopback address. It records
// every connection's client address and every transaction, and asks its
// script (mail, rcpt, data) for the reply to each MAIL, RCPT and final dot. n in
// the script is the index of the transaction at this server (0 first).
type fakeMX struct {
	t    *testing.T
	ip   string
	port int
	srv  *smtp.Server

	mu     sync.Mutex
	conns  []string       // client IP of each accepted connection
	byAddr map[string]int // client "ip:port" → connection index
	txs    []*fakeTx
	mail   func(n int) error
	rcpt   func(n int, to string) error
	data   func(n int) error
	creds  map[string]string // AUTH PLAIN users; nil: no AUTH
	authed []string
}

// fakeTx is one transaction (one MAIL) seen by a fakeMX.
type fakeTx struct {
	conn       int
	client     string
	at         time.Time
	from       string
	tried      []string // RCPT TO, in order
	accepted   []string
	notify     []string // NOTIFY of each accepted RCPT
	data       string
	delivered  bool
	requireTLS bool // MAIL carried REQUIRETLS
}

// fakeOpt configures a fakeMX.
type fakeOpt struct {
	tls        *tls.Config
	dsn        bool              // advertise DSN
	requireTLS bool              // advertise REQUIRETLS (under TLS)
	creds      map[string]string // enable AUTH PLAIN (over TLS)
	mail       func(n int) error
	rcpt       func(n int, to string) error
	data       func(n int) error
}

// startMX starts a fakeMX on ip:port; it stops when the test ends.
func startMX(t *testing.T, ip string, port int, o fakeOpt) *fakeMX {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("fake MX %s:%d: %v", ip, port, err)
	}
	f := &fakeMX{t: t, ip: ip, port: port, byAddr: map[string]int{}, mail: o.mail, rcpt: o.rcpt, data: o.data, creds: o.creds}
	f.srv = smtp.NewServer(f)
	f.srv.Domain = "mx-" + ip
	f.srv.TLSConfig = o.tls
	f.srv.EnableDSN = o.dsn
	f.srv.EnableREQUIRETLS = o.requireTLS
	f.srv.ErrorLog = log.New(io.Discard, "", 0)
	go func() { _ = f.srv.Serve(&countingListener{Listener: ln, f: f}) }()
	t.Cleanup(func() { _ = f.srv.Close() })
	return f
}

// countingListener records each accepted connection's client address.
type countingListener struct {
	net.Listener
	f *fakeMX
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		l.f.mu.Lock()
		l.f.byAddr[c.RemoteAddr().String()] = len(l.f.conns)
		l.f.conns = append(l.f.conns, host)
		l.f.mu.Unlock()
	}
	return c, err
}

// NewSession implements smtp.Backend.
func (f *fakeMX) NewSession(c *smtp.Conn) (smtp.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &fakeSession{f: f, conn: f.byAddr[c.Conn().RemoteAddr().String()]}, nil
}

// connections returns the client IP of every connection so far.
func (f *fakeMX) connections() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.conns...)
}

// transactions returns copies of the transactions so far.
func (f *fakeMX) transactions() []fakeTx {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]fakeTx, len(f.txs))
	for i, tx := range f.txs {
		out[i] = *tx
	}
	return out
}

// delivered returns the transactions that ended in an accepted DATA.
func (f *fakeMX) delivered() []fakeTx {
	var out []fakeTx
	for _, tx := range f.transactions() {
		if tx.delivered {
			out = append(out, tx)
		}
	}
	return out
}

type fakeSession struct {
	f    *fakeMX
	conn int
	cur  *fakeTx
	n    int
}

func (s *fakeSession) Mail(from string, opts *smtp.MailOptions) error {
	s.f.mu.Lock()
	s.cur = &fakeTx{conn: s.conn, client: s.f.conns[s.conn], at: time.Now(), from: from,
		requireTLS: opts != nil && opts.RequireTLS}
	s.n = len(s.f.txs)
	s.f.txs = append(s.f.txs, s.cur)
	script := s.f.mail
	s.f.mu.Unlock()
	if script != nil {
		return script(s.n)
	}
	return nil
}

func (s *fakeSession) Rcpt(to string, opts *smtp.RcptOptions) error {
	s.f.mu.Lock()
	script := s.f.rcpt
	s.cur.tried = append(s.cur.tried, to)
	s.f.mu.Unlock()
	if script != nil {
		if err := script(s.n, to); err != nil {
			return err
		}
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.cur.accepted = append(s.cur.accepted, to)
	notify := ""
	if opts != nil {
		for i, n := range opts.Notify {
			if i > 0 {
				notify += ","
			}
			notify += string(n)
		}
	}
	s.cur.notify = append(s.cur.notify, notify)
	return nil
}

func (s *fakeSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.f.mu.Lock()
	script := s.f.data
	s.f.mu.Unlock()
	if script != nil {
		if err := script(s.n); err != nil {
			return err
		}
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.cur.data, s.cur.delivered = string(b), true
	return nil
}

func (s *fakeSession) Reset()        { s.cur = nil }
func (s *fakeSession) Logout() error { return nil }

// AuthMechanisms implements smtp.AuthSession.
func (s *fakeSession) AuthMechanisms() []string {
	if s.f.creds == nil {
		return nil
	}
	return []string{sasl.Plain}
}

// Auth implements smtp.AuthSession.
func (s *fakeSession) Auth(mech string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		s.f.mu.Lock()
		defer s.f.mu.Unlock()
		if want, ok := s.f.creds[user]; !ok || want != pass {
			return errors.New("bad credentials")
		}
		s.f.authed = append(s.f.authed, user)
		return nil
	}), nil
}

// reply builds a scripted SMTP error reply.
func reply(code int, enhanced [3]int, text string) error {
	return &smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCode(enhanced), Message: text}
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
