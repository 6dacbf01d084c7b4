package relaytest

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// MXOptions configures a FakeMX. The zero value is a plain server that
// accepts every command.
type MXOptions struct {
	Domain string      // the name in the greeting; default "mx.test"
	TLS    *tls.Config // offer STARTTLS with this configuration
	// ImplicitTLS speaks TLS (with the TLS configuration) from the first
	// byte, as on port 465 (RFC 8314), instead of offering STARTTLS.
	ImplicitTLS bool
	DSN         bool // advertise DSN (RFC 3461)
	// RequireTLS advertises REQUIRETLS (RFC 8689), which go-smtp offers
	// over TLS only.
	RequireTLS bool
	Users      map[string]string // AUTH PLAIN users and passwords; nil offers no AUTH
	Script     Script            // the replies to MAIL, RCPT and the final dot
	// Configure, when set, adjusts the go-smtp server last (limits,
	// timeouts, SMTPUTF8).
	Configure func(*smtp.Server)
	// WrapConn, when set, wraps each accepted connection (the plaintext
	// one, inside implicit TLS); n is the connection's index. A test
	// peer watches the raw dialogue with it.
	WrapConn func(c net.Conn, n int) net.Conn
	// NoTranscript keeps no transcript (Transcript returns ""): for
	// servers that receive many or large messages.
	NoTranscript bool
}

// Script answers a transaction's commands; tx is the index of the
// transaction at this server (0 first), to answer a retry differently from
// the first attempt. A nil function or a nil error accepts; Reply writes
// the reply as it appears in a transcript. A function may block, to hold a
// client inside a command until the test lets it go.
type Script struct {
	Mail func(tx int) error
	Rcpt func(tx int, to string) error
	Data func(tx int) error
}

// Reply is the error that makes a Script answer with line, written as in
// a transcript: "450 4.2.1 mailbox busy" (the enhanced status code may be
// left out). It panics on a line that is not a reply, which is a mistake
// in the test itself.
func Reply(line string) error {
	code, rest, _ := strings.Cut(line, " ")
	n, err := strconv.Atoi(code)
	if err != nil || len(code) != 3 || n < 200 || n > 599 { // RFC 5321 §4.2: three digits
		panic(fmt.Sprintf("relaytest: %q is not an SMTP reply", line))
	}
	e := &smtp.SMTPError{Code: n, EnhancedCode: smtp.NoEnhancedCode, Message: rest}
	if enh, text, _ := strings.Cut(rest, " "); isEnhanced(enh, code[0]) {
		for i, f := range strings.Split(enh, ".") {
			e.EnhancedCode[i], _ = strconv.Atoi(f)
		}
		e.Message = text
	}
	return e
}

// isEnhanced reports whether s is an RFC 3463 status code of the reply's
// class: class "." subject "." detail.
func isEnhanced(s string, class byte) bool {
	f := strings.Split(s, ".")
	if len(f) != 3 || len(f[0]) != 1 || f[0][0] != class {
		return false
	}
	for _, p := range f[1:] {
		if _, err := strconv.Atoi(p); err != nil || len(p) > 3 {
			return false
		}
	}
	return true
}

// Tx is one transaction (one MAIL) seen by a FakeMX.
type Tx struct {
	Conn      int       // index of the connection at this server
	Client    string    // the client's IP address
	Helo      string    // the EHLO/HELO name
	TLS       bool      // the transaction ran over TLS
	User      string    // the user that authenticated on the connection, "" without AUTH
	At        time.Time // when MAIL arrived
	From      string
	MailOpts  smtp.MailOptions
	MailErr   error              // the script's answer to MAIL; nil accepted it
	Tried     []string           // RCPT TO, in order
	Accepted  []string           // the recipients the script accepted
	Refused   []string           // the recipients the script refused
	RcptOpts  []smtp.RcptOptions // the options of each accepted RCPT
	Notify    []string           // NOTIFY of each accepted RCPT, comma-separated
	DataCalls int                // how often the client reached the message data
	Body      []byte             // the message as received, whatever the answer; nil until the data is complete
	DataErr   error              // the script's answer to the final dot; nil accepted it
	Data      string             // the accepted message
	Delivered bool               // the data was accepted
}

// FakeMX is a scripted go-smtp server on one loopback address. It records
// every connection's client address, every transaction, every AUTH
// attempt and the whole dialogue, and asks its Script for the reply to
// each MAIL, RCPT and final dot.
type FakeMX struct {
	addr        netip.AddrPort
	script      Script
	users       map[string]string
	implicitTLS bool

	srv     *smtp.Server
	ln      net.Listener
	closing sync.Once

	mu         sync.Mutex
	changed    chan struct{}  // closed (and replaced) at each connection and command recorded
	conns      []string       // client IP of each accepted connection
	byAddr     map[string]int // client "ip:port" → connection index
	txs        []*Tx
	auths      []string // every AUTH attempt as "user:password"
	authed     []string // the users that authenticated
	transcript bytes.Buffer
}

// StartMX starts a FakeMX listening on addr ("ip:port", port 0 for any);
// it stops when the test ends.
func StartMX(t testing.TB, addr string, o MXOptions) *FakeMX {
	t.Helper()
	if o.ImplicitTLS && o.TLS == nil {
		t.Fatalf("relaytest: fake MX: ImplicitTLS needs TLS")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("relaytest: fake MX on %s: %v", addr, err)
	}
	f := &FakeMX{addr: ln.Addr().(*net.TCPAddr).AddrPort(), script: o.Script, users: o.Users, byAddr: map[string]int{},
		ln: ln, changed: make(chan struct{}), implicitTLS: o.ImplicitTLS}
	srv := smtp.NewServer(f)
	f.srv = srv
	srv.Domain = o.Domain
	if srv.Domain == "" {
		srv.Domain = "mx.test"
	}
	cl := &countingListener{Listener: ln, f: f, wrap: o.WrapConn}
	if o.ImplicitTLS {
		cl.tls = o.TLS
	} else {
		srv.TLSConfig = o.TLS
	}
	srv.EnableDSN = o.DSN
	srv.EnableREQUIRETLS = o.RequireTLS
	if !o.NoTranscript {
		srv.Debug = transcriptWriter{f}
	}
	srv.ErrorLog = log.New(io.Discard, "", 0) // a client hanging up is not news
	if o.Configure != nil {
		o.Configure(srv)
	}
	go func() { _ = srv.Serve(cl) }()
	t.Cleanup(f.Close)
	return f
}

// Close stops the server and drops its connections; it is also called
// when the test ends.
func (f *FakeMX) Close() {
	f.closing.Do(func() {
		_ = f.srv.Close()
		_ = f.ln.Close() // in case Serve has not taken it yet
	})
}

// Changed returns a channel that is closed at the next connection or
// command the server records: a test waiting for a transaction checks,
// then waits on the channel it took before checking.
func (f *FakeMX) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// signal wakes those waiting on Changed; f.mu is held.
func (f *FakeMX) signal() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Addr is the address the server listens on.
func (f *FakeMX) Addr() netip.AddrPort { return f.addr }

// Connections returns the client IP of every connection so far.
func (f *FakeMX) Connections() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.conns...)
}

// Transactions returns copies of the transactions so far.
func (f *FakeMX) Transactions() []Tx {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Tx, len(f.txs))
	for i, tx := range f.txs {
		out[i] = tx.copy()
	}
	return out
}

// Tx returns a copy of transaction n (0 first).
func (f *FakeMX) Tx(n int) Tx {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.txs[n].copy()
}

// copy copies tx deeply enough that the server's later changes do not
// show; f.mu is held.
func (tx *Tx) copy() Tx {
	c := *tx
	c.Tried = append([]string(nil), tx.Tried...)
	c.Accepted = append([]string(nil), tx.Accepted...)
	c.Refused = append([]string(nil), tx.Refused...)
	c.RcptOpts = append([]smtp.RcptOptions(nil), tx.RcptOpts...)
	c.Notify = append([]string(nil), tx.Notify...)
	if tx.MailOpts.Auth != nil {
		a := *tx.MailOpts.Auth
		c.MailOpts.Auth = &a
	}
	return c
}

// Delivered returns the transactions that ended in accepted data.
func (f *FakeMX) Delivered() []Tx {
	var out []Tx
	for _, tx := range f.Transactions() {
		if tx.Delivered {
			out = append(out, tx)
		}
	}
	return out
}

// Auths returns every AUTH attempt so far as "user:password".
func (f *FakeMX) Auths() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.auths...)
}

// Authed returns the users that authenticated, in order.
func (f *FakeMX) Authed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.authed...)
}

// Transcript returns the dialogue so far, both directions interleaved as
// go-smtp's debug output writes them.
func (f *FakeMX) Transcript() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.transcript.String()
}

// transcriptWriter appends go-smtp's debug output to the transcript.
type transcriptWriter struct{ f *FakeMX }

func (w transcriptWriter) Write(b []byte) (int, error) {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	return w.f.transcript.Write(b)
}

// countingListener records each accepted connection's client address,
// and wraps the connection in implicit TLS and then in wrap.
type countingListener struct {
	net.Listener
	f    *FakeMX
	tls  *tls.Config
	wrap func(net.Conn, int) net.Conn
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
	l.f.mu.Lock()
	n := len(l.f.conns)
	l.f.byAddr[c.RemoteAddr().String()] = n
	l.f.conns = append(l.f.conns, host)
	l.f.signal()
	l.f.mu.Unlock()
	if l.tls != nil {
		c = tls.Server(c, l.tls)
	}
	if l.wrap != nil {
		c = l.wrap(c, n)
	}
	return c, nil
}

// NewSession implements smtp.Backend.
func (f *FakeMX) NewSession(c *smtp.Conn) (smtp.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &fakeSession{f: f, c: c, conn: f.byAddr[c.Conn().RemoteAddr().String()]}, nil
}

type fakeSession struct {
	f    *FakeMX
	c    *smtp.Conn
	conn int
	user string // authenticated
	cur  *Tx
	n    int
}

func (s *fakeSession) Mail(from string, opts *smtp.MailOptions) error {
	_, isTLS := s.c.TLSConnectionState()
	s.f.mu.Lock()
	s.cur = &Tx{Conn: s.conn, Client: s.f.conns[s.conn], Helo: s.c.Hostname(), TLS: isTLS || s.f.implicitTLS,
		User: s.user, At: time.Now(), From: from}
	if opts != nil {
		s.cur.MailOpts = *opts
		if opts.Auth != nil {
			a := *opts.Auth
			s.cur.MailOpts.Auth = &a
		}
	}
	s.n = len(s.f.txs)
	s.f.txs = append(s.f.txs, s.cur)
	s.f.signal()
	s.f.mu.Unlock()
	if s.f.script.Mail == nil {
		return nil
	}
	err := s.f.script.Mail(s.n)
	if err != nil {
		s.f.mu.Lock()
		s.cur.MailErr = err
		s.f.signal()
		s.f.mu.Unlock()
	}
	return err
}

func (s *fakeSession) Rcpt(to string, opts *smtp.RcptOptions) error {
	s.f.mu.Lock()
	s.cur.Tried = append(s.cur.Tried, to)
	s.f.signal()
	s.f.mu.Unlock()
	if s.f.script.Rcpt != nil {
		if err := s.f.script.Rcpt(s.n, to); err != nil {
			s.f.mu.Lock()
			s.cur.Refused = append(s.cur.Refused, to)
			s.f.signal()
			s.f.mu.Unlock()
			return err
		}
	}
	var ro smtp.RcptOptions
	if opts != nil {
		ro = *opts
	}
	notify := make([]string, len(ro.Notify))
	for i, n := range ro.Notify {
		notify[i] = string(n)
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.cur.Accepted = append(s.cur.Accepted, to)
	s.cur.RcptOpts = append(s.cur.RcptOpts, ro)
	s.cur.Notify = append(s.cur.Notify, strings.Join(notify, ","))
	s.f.signal()
	return nil
}

func (s *fakeSession) Data(r io.Reader) error {
	// go-smtp may run Data (for BDAT) beside the session's command loop,
	// whose Reset drops s.cur: hold on to this transaction.
	cur, n := s.cur, s.n
	s.f.mu.Lock()
	cur.DataCalls++
	s.f.mu.Unlock()
	b, err := io.ReadAll(r)
	if err != nil {
		return err // go-smtp's own (message too large, connection lost)
	}
	if b == nil {
		b = []byte{}
	}
	s.f.mu.Lock()
	cur.Body = b
	s.f.mu.Unlock()
	if s.f.script.Data != nil {
		err = s.f.script.Data(n)
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if cur.DataErr = err; err == nil {
		cur.Data, cur.Delivered = string(b), true
	}
	s.f.signal()
	return err
}

func (s *fakeSession) Reset()        { s.cur = nil }
func (s *fakeSession) Logout() error { return nil }

// AuthMechanisms implements smtp.AuthSession.
func (s *fakeSession) AuthMechanisms() []string {
	if s.f.users == nil {
		return nil
	}
	return []string{sasl.Plain}
}

// Auth implements smtp.AuthSession.
func (s *fakeSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(identity, user, pass string) error {
		s.f.mu.Lock()
		defer s.f.mu.Unlock()
		s.f.auths = append(s.f.auths, user+":"+pass)
		// An authorization identity other than the user's own asks to
		// act as someone else (RFC 4616 §2), which no user here may.
		if want, ok := s.f.users[user]; !ok || want != pass || identity != "" && identity != user {
			return errors.New("bad credentials")
		}
		s.f.authed = append(s.f.authed, user)
		s.user = user
		return nil
	}), nil
}
