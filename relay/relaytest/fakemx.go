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
	DSN    bool        // advertise DSN (RFC 3461)
	// RequireTLS advertises REQUIRETLS (RFC 8689), which go-smtp offers
	// over TLS only.
	RequireTLS bool
	Users      map[string]string // AUTH PLAIN users and passwords; nil offers no AUTH
	Script     Script            // the replies to MAIL, RCPT and the final dot
	// Configure, when set, adjusts the go-smtp server last (limits,
	// timeouts, SMTPUTF8).
	Configure func(*smtp.Server)
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
	At        time.Time // when MAIL arrived
	From      string
	MailOpts  smtp.MailOptions
	Tried     []string           // RCPT TO, in order
	Accepted  []string           // the recipients the script accepted
	RcptOpts  []smtp.RcptOptions // the options of each accepted RCPT
	Notify    []string           // NOTIFY of each accepted RCPT, comma-separated
	DataCalls int                // how often the client reached the message data
	Data      string             // the accepted message
	Delivered bool               // the data was accepted
}

// FakeMX is a scripted go-smtp server on one loopback address. It records
// every connection's client address, every transaction, every AUTH
// attempt and the whole dialogue, and asks its Script for the reply to
// each MAIL, RCPT and final dot.
type FakeMX struct {
	addr   netip.AddrPort
	script Script
	users  map[string]string

	mu         sync.Mutex
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
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("relaytest: fake MX on %s: %v", addr, err)
	}
	f := &FakeMX{addr: ln.Addr().(*net.TCPAddr).AddrPort(), script: o.Script, users: o.Users, byAddr: map[string]int{}}
	srv := smtp.NewServer(f)
	srv.Domain = o.Domain
	if srv.Domain == "" {
		srv.Domain = "mx.test"
	}
	srv.TLSConfig = o.TLS
	srv.EnableDSN = o.DSN
	srv.EnableREQUIRETLS = o.RequireTLS
	srv.Debug = transcriptWriter{f}
	srv.ErrorLog = log.New(io.Discard, "", 0)
	if o.Configure != nil {
		o.Configure(srv)
	}
	go func() { _ = srv.Serve(&countingListener{Listener: ln, f: f}) }()
	t.Cleanup(func() { _ = srv.Close() })
	return f
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
		out[i] = *tx
		out[i].Tried = append([]string(nil), tx.Tried...)
		out[i].Accepted = append([]string(nil), tx.Accepted...)
		out[i].RcptOpts = append([]smtp.RcptOptions(nil), tx.RcptOpts...)
		out[i].Notify = append([]string(nil), tx.Notify...)
	}
	return out
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

// countingListener records each accepted connection's client address.
type countingListener struct {
	net.Listener
	f *FakeMX
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
func (f *FakeMX) NewSession(c *smtp.Conn) (smtp.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &fakeSession{f: f, c: c, conn: f.byAddr[c.Conn().RemoteAddr().String()]}, nil
}

type fakeSession struct {
	f    *FakeMX
	c    *smtp.Conn
	conn int
	cur  *Tx
	n    int
}

func (s *fakeSession) Mail(from string, opts *smtp.MailOptions) error {
	_, isTLS := s.c.TLSConnectionState()
	s.f.mu.Lock()
	s.cur = &Tx{Conn: s.conn, Client: s.f.conns[s.conn], Helo: s.c.Hostname(), TLS: isTLS, At: time.Now(), From: from}
	if opts != nil {
		s.cur.MailOpts = *opts
	}
	s.n = len(s.f.txs)
	s.f.txs = append(s.f.txs, s.cur)
	s.f.mu.Unlock()
	if s.f.script.Mail != nil {
		return s.f.script.Mail(s.n)
	}
	return nil
}

func (s *fakeSession) Rcpt(to string, opts *smtp.RcptOptions) error {
	s.f.mu.Lock()
	s.cur.Tried = append(s.cur.Tried, to)
	s.f.mu.Unlock()
	if s.f.script.Rcpt != nil {
		if err := s.f.script.Rcpt(s.n, to); err != nil {
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
		return err
	}
	if s.f.script.Data != nil {
		if err := s.f.script.Data(n); err != nil {
			return err
		}
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	cur.Data, cur.Delivered = string(b), true
	return nil
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
	return sasl.NewPlainServer(func(_, user, pass string) error {
		s.f.mu.Lock()
		defer s.f.mu.Unlock()
		s.f.auths = append(s.f.auths, user+":"+pass)
		if want, ok := s.f.users[user]; !ok || want != pass {
			return errors.New("bad credentials")
		}
		s.f.authed = append(s.f.authed, user)
		return nil
	}), nil
}
