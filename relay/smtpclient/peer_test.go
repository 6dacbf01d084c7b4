package smtpclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// testCert is a self-signed certificate for "mx.test" and 127.0.0.1, and a
// pool that trusts it.
var testCert = sync.OnceValues(func() (tls.Certificate, *x509.CertPool) {
	pair, pool, err := relaytest.SelfSigned("mx.test", "127.0.0.1")
	if err != nil {
		panic(err)
	}
	return pair, pool
})

func serverTLS() *tls.Config {
	cert, _ := testCert()
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}

// step is one move of a transcript peer.
type step = relaytest.Step

// startPeer starts a relaytest.Peer on 127.0.0.1: connection i follows
// scripts[i]; a step with TLS set presents testCert.
func startPeer(t *testing.T, scripts ...[]step) *relaytest.Peer {
	t.Helper()
	return relaytest.StartPeer(t, "127.0.0.1:0", relaytest.PeerOptions{TLS: serverTLS()}, scripts...)
}

// Script fragments.
var (
	greet       = step{Send: "220 mx.test ESMTP\r\n"}
	ehloPlain   = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250-8BITMIME\r\n250 SIZE 100000\r\n"}
	ehloTLS     = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250 STARTTLS\r\n"}
	ehloPipe    = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250-8BITMIME\r\n250 PIPELINING\r\n"}
	ehloChunk   = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250-PIPELINING\r\n250 CHUNKING\r\n"}
	ehloChunk1  = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250 CHUNKING\r\n"} // without PIPELINING
	mailOK      = step{Expect: "MAIL FROM:", Send: "250 2.1.0 ok\r\n"}
	rcptOK      = step{Expect: "RCPT TO:", Send: "250 2.1.5 ok\r\n"}
	dataGo      = step{Expect: "DATA", Send: "354 go ahead\r\n"}
	dataDone    = step{Data: true, Send: "250 2.0.0 queued\r\n"}
	quit        = step{Expect: "QUIT", Send: "221 bye\r\n"}
	plainScript = []step{greet, ehloPlain, quit}
)

// msg is a transaction seen by the go-smtp backend.
type msg struct {
	helo      string
	remote    net.Addr
	tls       bool
	from      string
	mailOpts  smtp.MailOptions
	rcpts     []string
	rcptOpts  []smtp.RcptOptions
	data      []byte
	dataCalls int
}

// backend is a go-smtp backend for realistic dialogues. Recipients whose
// local part starts with "temp" get 450, with "perm" 550.
type backend struct {
	mu    sync.Mutex
	msgs  []*msg
	auths []string
}

type session struct {
	be  *backend
	c   *smtp.Conn
	cur *msg
}

func (b *backend) NewSession(c *smtp.Conn) (smtp.Session, error) { return &session{be: b, c: c}, nil }

func (b *backend) snapshot() ([]msg, []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []msg
	for _, m := range b.msgs {
		out = append(out, *m)
	}
	return out, append([]string(nil), b.auths...)
}

func (s *session) Mail(from string, opts *smtp.MailOptions) error {
	s.be.mu.Lock()
	defer s.be.mu.Unlock()
	_, isTLS := s.c.TLSConnectionState()
	s.cur = &msg{helo: s.c.Hostname(), remote: s.c.Conn().RemoteAddr(), tls: isTLS, from: from}
	if opts != nil {
		s.cur.mailOpts = *opts
	}
	s.be.msgs = append(s.be.msgs, s.cur)
	return nil
}

func (s *session) Rcpt(to string, opts *smtp.RcptOptions) error {
	switch {
	case strings.HasPrefix(to, "temp"):
		return &smtp.SMTPError{Code: 450, EnhancedCode: smtp.EnhancedCode{4, 2, 0}, Message: "greylisted"}
	case strings.HasPrefix(to, "perm"):
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
	}
	s.be.mu.Lock()
	defer s.be.mu.Unlock()
	s.cur.rcpts = append(s.cur.rcpts, to)
	if opts != nil {
		s.cur.rcptOpts = append(s.cur.rcptOpts, *opts)
	}
	return nil
}

func (s *session) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	s.be.mu.Lock()
	defer s.be.mu.Unlock()
	s.cur.data = b
	s.cur.dataCalls++
	return err
}

func (s *session) Reset()        {}
func (s *session) Logout() error { return nil }

func (s *session) AuthMechanisms() []string { return []string{sasl.Plain} }

func (s *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		s.be.mu.Lock()
		defer s.be.mu.Unlock()
		s.be.auths = append(s.be.auths, user+":"+pass)
		if pass != "secret" {
			return errors.New("bad password")
		}
		return nil
	}), nil
}

// startGoSMTP runs a go-smtp server on 127.0.0.1; configure adjusts it.
func startGoSMTP(t *testing.T, configure func(*smtp.Server)) (*backend, netip.AddrPort) {
	t.Helper()
	be := &backend{}
	s := smtp.NewServer(be)
	s.Domain = "mx.test"
	s.ErrorLog = log.New(io.Discard, "", 0)
	s.ReadTimeout, s.WriteTimeout = 2*time.Second, 2*time.Second
	s.MaxMessageBytes, s.MaxRecipients = 1<<20, 50
	if configure != nil {
		configure(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { s.Close() })
	return be, ln.Addr().(*net.TCPAddr).AddrPort()
}

// opts returns client options with short timeouts.
func opts(policy TLSPolicy) Options {
	return Options{Hostname: "client.test", TLS: policy,
		ConnectTimeout: time.Second, GreetingTimeout: time.Second, CommandTimeout: time.Second, DataTimeout: time.Second}
}
