package peers

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// SinkOptions configures a Sink. The zero value accepts every message.
type SinkOptions struct {
	// Domain is the name in the greeting and EHLO reply; default "sink.test".
	Domain string

	// Mail, Rcpt and Data script the replies. attempt counts from 1: per
	// sender address for Mail, per recipient address for Rcpt (both
	// case-insensitive, over all connections), and per DATA that reached
	// the sink for Data. A nil func or a nil result accepts.
	Mail func(from string, attempt int) *smtp.SMTPError
	Rcpt func(rcpt string, attempt int) *smtp.SMTPError
	Data func(rcpts []string, attempt int) *smtp.SMTPError

	// TLS, if set, is offered with STARTTLS (or, with ImplicitTLS, spoken
	// from the first byte, as on port 465).
	TLS         *tls.Config
	ImplicitTLS bool

	// Users enables AUTH PLAIN for these username/password pairs. AUTH is
	// offered only under TLS unless InsecureAuth is set.
	Users        map[string]string
	InsecureAuth bool

	// Configure, if set, adjusts the go-smtp server before it starts
	// (EnableDSN, EnableSMTPUTF8, MaxRecipients, MaxMessageBytes...).
	Configure func(*smtp.Server)
}

// Received is one SMTP transaction as the sink saw it: from an accepted
// MAIL to the end of DATA (or to RSET/QUIT, when Data is nil).
type Received struct {
	Conn        int    // connection number on this sink, from 1
	ClientIP    string // the peer's IP: what a greylister keys on
	HELO        string // the EHLO/HELO argument
	TLS         bool   // the transaction ran under TLS
	User        string // the AUTH username, "" without AUTH
	From        string
	MailOptions smtp.MailOptions // parsed MAIL parameters (SIZE, BODY, RET, ENVID, SMTPUTF8, AUTH...)
	Rcpts       []string         // accepted recipients, in order
	RcptOptions []smtp.RcptOptions
	Rejected    []string        // recipients the script refused
	Data        []byte          // the message exactly as received, after dot-unstuffing; nil if DATA never completed
	SHA256      string          // hex SHA-256 of Data
	Reply       *smtp.SMTPError // the sink's answer to the final dot; nil is 250
}

// Sink is a recording SMTP server: a fake MX or smarthost whose every
// transaction, and every command on the wire, a test can inspect.
type Sink struct {
	Addr string // host:port it listens on

	opts SinkOptions
	srv  *smtp.Server
	ln   net.Listener

	mu       sync.Mutex
	conns    int
	txs      []*Received
	commands map[string]int
	mails    map[string]int
	rcpts    map[string]int
	datas    int
	changed  chan struct{} // closed (and replaced) on every new record
	closed   sync.Once
}

// StartSink listens on addr ("" means 127.0.0.1 on a free port) and serves
// until Close or the end of the test.
func StartSink(t testing.TB, addr string, opts SinkOptions) *Sink {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if opts.ImplicitTLS && opts.TLS == nil {
		t.Fatalf("peers: sink: ImplicitTLS needs TLS")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("peers: sink: %v", err)
	}
	s := &Sink{Addr: ln.Addr().String(), opts: opts, ln: ln, commands: map[string]int{},
		mails: map[string]int{}, rcpts: map[string]int{}, changed: make(chan struct{})}
	s.srv = smtp.NewServer(smtp.BackendFunc(s.newSession))
	s.srv.Domain = cmp.Or(opts.Domain, "sink.test")
	s.srv.ReadTimeout, s.srv.WriteTimeout = time.Minute, time.Minute
	s.srv.ErrorLog = log.New(io.Discard, "", 0) // a client hanging up is not news
	s.srv.AllowInsecureAuth = opts.InsecureAuth || opts.ImplicitTLS
	wl := &wireListener{Listener: ln, sink: s}
	if opts.ImplicitTLS {
		wl.tls = opts.TLS
	} else {
		s.srv.TLSConfig = opts.TLS
	}
	if opts.Configure != nil {
		opts.Configure(s.srv)
	}
	go func() { _ = s.srv.Serve(wl) }()
	t.Cleanup(s.Close)
	return s
}

// Close stops the sink and drops its connections.
func (s *Sink) Close() {
	s.closed.Do(func() {
		_ = s.srv.Close()
		_ = s.ln.Close() // in case Serve has not registered it yet
	})
}

// Messages returns the transactions whose DATA the sink accepted, in order.
func (s *Sink) Messages() []Received {
	return s.snapshot(func(r *Received) bool { return r.Data != nil && r.Reply == nil })
}

// Transactions returns every transaction (accepted MAIL) seen, in order,
// including refused and abandoned ones.
func (s *Sink) Transactions() []Received {
	return s.snapshot(func(*Received) bool { return true })
}

// Commands returns how many times each command verb (upper case: "EHLO",
// "MAIL", "RCPT", "DATA", "BDAT", "RSET", "QUIT"...) arrived on the wire,
// including commands go-smtp refused by itself. Commands after STARTTLS are
// encrypted on the wire and not counted; Transactions still records them.
func (s *Sink) Commands() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]int, len(s.commands))
	for k, v := range s.commands {
		m[k] = v
	}
	return m
}

// Connections returns how many connections the sink has accepted.
func (s *Sink) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// WaitFor waits until the sink has accepted at least n messages and returns
// them; after timeout it fails the test, listing what it did see.
func (s *Sink) WaitFor(t testing.TB, n int, timeout time.Duration) []Received {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if msgs := s.Messages(); len(msgs) >= n {
			return msgs
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("peers: sink %s: %d messages after %v, want %d\n%s", s.Addr, len(s.Messages()), timeout, n, s.describe())
			return nil
		}
	}
}

// describe summarises the transactions for a failure message.
func (s *Sink) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "connections: %d, commands: %v\n", s.Connections(), s.Commands())
	for _, r := range s.Transactions() {
		fmt.Fprintf(&b, "  conn %d from %s: MAIL <%s> RCPT %v refused %v, %d data bytes, reply %v\n",
			r.Conn, r.ClientIP, r.From, r.Rcpts, r.Rejected, len(r.Data), r.Reply)
	}
	return b.String()
}

func (s *Sink) snapshot(keep func(*Received) bool) []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Received
	for _, r := range s.txs {
		if keep(r) {
			c := *r
			c.Rcpts = append([]string(nil), r.Rcpts...)
			c.RcptOptions = append([]smtp.RcptOptions(nil), r.RcptOptions...)
			c.Rejected = append([]string(nil), r.Rejected...)
			out = append(out, c)
		}
	}
	return out
}

// signal wakes WaitFor; s.mu must be held.
func (s *Sink) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Sink) noteConn() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns++
	s.signal()
	return s.conns
}

func (s *Sink) noteCommand(verb string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commands[verb]++
	s.signal()
}

func (s *Sink) newSession(c *smtp.Conn) (smtp.Session, error) {
	sess := &sinkSession{sink: s, conn: c}
	if w := wireOf(c.Conn()); w != nil {
		sess.id = w.id
		sess.tls = w.implicitTLS
	}
	if _, ok := c.TLSConnectionState(); ok {
		sess.tls = true
	}
	if host, _, err := net.SplitHostPort(c.Conn().RemoteAddr().String()); err == nil {
		sess.ip = host
	}
	return sess, nil
}

// wireOf finds our wireConn below go-smtp's connection (which is a
// *tls.Conn after STARTTLS).
func wireOf(c net.Conn) *wireConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	w, _ := c.(*wireConn)
	return w
}

// sinkSession is one go-smtp session (one connection, or the part of it
// after STARTTLS).
type sinkSession struct {
	sink *Sink
	conn *smtp.Conn
	id   int
	ip   string
	tls  bool
	user string
	tx   *Received // the open transaction, if any
}

func (ss *sinkSession) Mail(from string, opts *smtp.MailOptions) error {
	s := ss.sink
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mails[strings.ToLower(from)]++
	if f := s.opts.Mail; f != nil {
		if e := f(from, s.mails[strings.ToLower(from)]); e != nil {
			return e
		}
	}
	r := &Received{Conn: ss.id, ClientIP: ss.ip, HELO: ss.conn.Hostname(), TLS: ss.tls, User: ss.user, From: from}
	if opts != nil {
		r.MailOptions = *opts
		if opts.Auth != nil {
			a := *opts.Auth
			r.MailOptions.Auth = &a
		}
	}
	ss.tx = r
	s.txs = append(s.txs, r)
	s.signal()
	return nil
}

func (ss *sinkSession) Rcpt(to string, opts *smtp.RcptOptions) error {
	s := ss.sink
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.tx == nil {
		return &smtp.SMTPError{Code: 503, EnhancedCode: smtp.EnhancedCode{5, 5, 1}, Message: "MAIL first"}
	}
	s.rcpts[strings.ToLower(to)]++
	if f := s.opts.Rcpt; f != nil {
		if e := f(to, s.rcpts[strings.ToLower(to)]); e != nil {
			ss.tx.Rejected = append(ss.tx.Rejected, to)
			s.signal()
			return e
		}
	}
	ss.tx.Rcpts = append(ss.tx.Rcpts, to)
	var o smtp.RcptOptions
	if opts != nil {
		o = *opts
	}
	ss.tx.RcptOptions = append(ss.tx.RcptOptions, o)
	s.signal()
	return nil
}

func (ss *sinkSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err // go-smtp's own error (message too large...)
	}
	s := ss.sink
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.tx == nil {
		return errors.New("peers: DATA without a transaction")
	}
	s.datas++
	sum := sha256.Sum256(b)
	ss.tx.Data, ss.tx.SHA256 = b, hex.EncodeToString(sum[:])
	if ss.tx.Data == nil {
		ss.tx.Data = []byte{}
	}
	if f := s.opts.Data; f != nil {
		ss.tx.Reply = f(append([]string(nil), ss.tx.Rcpts...), s.datas)
	}
	s.signal()
	if ss.tx.Reply != nil {
		return ss.tx.Reply // not a typed nil: checked above
	}
	return nil
}

func (ss *sinkSession) Reset() {
	ss.sink.mu.Lock()
	ss.tx = nil
	ss.sink.mu.Unlock()
}

func (ss *sinkSession) Logout() error { return nil }

// AuthMechanisms implements smtp.AuthSession: PLAIN when Users is set.
func (ss *sinkSession) AuthMechanisms() []string {
	if len(ss.sink.opts.Users) == 0 {
		return nil
	}
	return []string{sasl.Plain}
}

// Auth implements smtp.AuthSession.
func (ss *sinkSession) Auth(mech string) (sasl.Server, error) {
	if mech != sasl.Plain || len(ss.sink.opts.Users) == 0 {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	return sasl.NewPlainServer(func(identity, username, password string) error {
		want, ok := ss.sink.opts.Users[username]
		if !ok || want != password || (identity != "" && identity != username) {
			return smtp.ErrAuthFailed
		}
		ss.user = username
		return nil
	}), nil
}

// Greylist returns a Rcpt script that refuses each recipient's first tries
// attempts the way Postfix with postgrey does, and accepts later ones.
func Greylist(tries int) func(rcpt string, attempt int) *smtp.SMTPError {
	return func(rcpt string, attempt int) *smtp.SMTPError {
		if attempt > tries {
			return nil
		}
		domain := rcpt[strings.LastIndexByte(rcpt, '@')+1:]
		return &smtp.SMTPError{Code: 450, EnhancedCode: smtp.EnhancedCode{4, 2, 0},
			Message: fmt.Sprintf("<%s>: Recipient address rejected: Greylisted, see http://postgrey.schweikert.ch/help/%s.html", rcpt, domain)}
	}
}
