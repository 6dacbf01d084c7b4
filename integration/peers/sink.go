package peers

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/relay/relaytest"
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
// transaction, and every command on the wire, a test can inspect. It is
// relaytest's FakeMX (the one go-smtp test server of the project) with
// the scripts and records the integration tests speak: attempts counted
// per address, the commands counted on the wire, messages awaited.
type Sink struct {
	Addr string // host:port it listens on

	opts  SinkOptions
	mx    *relaytest.FakeMX
	ready chan struct{} // closed once mx is set: a client may come first

	mu       sync.Mutex
	commands map[string]int
	mails    map[string]int
	rcpts    map[string]int
	datas    int
}

// StartSink listens on addr ("" means 127.0.0.1 on a free port) and serves
// until Close or the end of the test.
func StartSink(t testing.TB, addr string, opts SinkOptions) *Sink {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	s := &Sink{opts: opts, ready: make(chan struct{}), commands: map[string]int{}, mails: map[string]int{}, rcpts: map[string]int{}}
	s.mx = relaytest.StartMX(t, addr, relaytest.MXOptions{
		Domain: cmp.Or(opts.Domain, "sink.test"), TLS: opts.TLS, ImplicitTLS: opts.ImplicitTLS,
		Users: opts.Users, NoTranscript: true, Script: s.script(),
		WrapConn: func(c net.Conn, _ int) net.Conn { return &wireConn{Conn: c, sink: s, pending: []string{""}} },
		Configure: func(srv *smtp.Server) {
			srv.ReadTimeout, srv.WriteTimeout = time.Minute, time.Minute
			srv.AllowInsecureAuth = opts.InsecureAuth || opts.ImplicitTLS
			if opts.Configure != nil {
				opts.Configure(srv)
			}
		}})
	s.Addr = s.mx.Addr().String()
	close(s.ready)
	return s
}

// script turns the SinkOptions' scripts, whose attempts count per
// address, into the FakeMX's, which are told the transaction.
func (s *Sink) script() relaytest.Script {
	var sc relaytest.Script
	if f := s.opts.Mail; f != nil {
		sc.Mail = func(tx int) error {
			<-s.ready
			from := s.mx.Tx(tx).From
			s.mu.Lock()
			s.mails[strings.ToLower(from)]++
			n := s.mails[strings.ToLower(from)]
			s.mu.Unlock()
			return replyErr(f(from, n))
		}
	}
	if f := s.opts.Rcpt; f != nil {
		sc.Rcpt = func(_ int, to string) error {
			s.mu.Lock()
			s.rcpts[strings.ToLower(to)]++
			n := s.rcpts[strings.ToLower(to)]
			s.mu.Unlock()
			return replyErr(f(to, n))
		}
	}
	if f := s.opts.Data; f != nil {
		sc.Data = func(tx int) error {
			<-s.ready
			rcpts := s.mx.Tx(tx).Accepted
			s.mu.Lock()
			s.datas++
			n := s.datas
			s.mu.Unlock()
			return replyErr(f(rcpts, n))
		}
	}
	return sc
}

// replyErr is e as an error: nil, not a typed nil, when e is nil.
func replyErr(e *smtp.SMTPError) error {
	if e == nil {
		return nil
	}
	return e
}

// Close stops the sink and drops its connections.
func (s *Sink) Close() { s.mx.Close() }

// Messages returns the transactions whose DATA the sink accepted, in order.
func (s *Sink) Messages() []Received {
	return s.snapshot(func(r Received) bool { return r.Data != nil && r.Reply == nil })
}

// Transactions returns every transaction (accepted MAIL) seen, in order,
// including refused and abandoned ones.
func (s *Sink) Transactions() []Received {
	return s.snapshot(func(Received) bool { return true })
}

// Commands returns how many times each command verb (upper case: "EHLO",
// "MAIL", "RCPT", "DATA", "BDAT", "RSET", "QUIT"...) arrived on the wire,
// including commands go-smtp refused by itself. Commands after STARTTLS are
// encrypted on the wire and not counted; Transactions still records them.
func (s *Sink) Commands() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.commands)
}

// Connections returns how many connections the sink has accepted.
func (s *Sink) Connections() int { return len(s.mx.Connections()) }

// WaitFor waits until the sink has accepted at least n messages and returns
// them; after timeout it fails the test, listing what it did see.
func (s *Sink) WaitFor(t testing.TB, n int, timeout time.Duration) []Received {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		ch := s.mx.Changed()
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

// snapshot converts the FakeMX's transactions whose MAIL was accepted.
func (s *Sink) snapshot(keep func(Received) bool) []Received {
	var out []Received
	for _, tx := range s.mx.Transactions() {
		if tx.MailErr != nil {
			continue
		}
		r := Received{Conn: tx.Conn + 1, ClientIP: tx.Client, HELO: tx.Helo, TLS: tx.TLS, User: tx.User, From: tx.From,
			MailOptions: tx.MailOpts, Rcpts: tx.Accepted, RcptOptions: tx.RcptOpts, Rejected: tx.Refused, Data: tx.Body}
		if tx.Body != nil {
			sum := sha256.Sum256(tx.Body)
			r.SHA256 = hex.EncodeToString(sum[:])
		}
		var e *smtp.SMTPError
		if errors.As(tx.DataErr, &e) {
			r.Reply = e
		}
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

func (s *Sink) noteCommand(verb string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commands[verb]++
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
