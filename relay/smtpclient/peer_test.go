package smtpclient

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
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

// step is one move of a scripted peer: read a line (if expect is set), then
// act.
type step struct {
	expect string        // the client must send a line starting with this; "" reads nothing
	pipe   []string      // then these lines (prefixes), all before any reply: a pipelined group
	send   string        // raw bytes to write
	data   bool          // before sending, read message data up to CRLF.CRLF
	tls    bool          // after sending, run a server-side TLS handshake
	hang   bool          // stop answering; wait for the client to leave
	close  bool          // after sending, close the connection
	drip   time.Duration // write send one byte at a time, this far apart
	flood  string        // write this line again and again until the client leaves
}

// peer is a scripted SMTP server: connection i follows scripts[i]. It
// records every line and DATA payload received, so tests can inspect the
// raw bytes we put on the wire.
type peer struct {
	t     *testing.T
	ln    net.Listener
	mu    sync.Mutex
	lines []string
	data  [][]byte
	conns int
	wg    sync.WaitGroup
}

func startPeer(t *testing.T, scripts ...[]step) *peer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{t: t, ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for _, s := range scripts {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns++
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer conn.Close()
				p.run(conn, s)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *peer) addr() netip.AddrPort { return p.ln.Addr().(*net.TCPAddr).AddrPort() }

// run plays one script, then drains until the client goes away.
func (p *peer) run(conn net.Conn, script []step) {
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	for _, s := range script {
		if !p.expect(br, s) {
			return
		}
		if s.data && !p.readData(br) {
			return
		}
		if !p.write(conn, s) || s.close {
			return
		}
		if s.hang {
			break
		}
		if s.tls {
			tc := tls.Server(conn, serverTLS())
			if err := tc.Handshake(); err != nil {
				p.t.Errorf("peer: TLS handshake: %v", err)
				return
			}
			conn, br = tc, bufio.NewReader(tc)
		}
	}
	for { // drain (QUIT and anything else) until EOF
		line, err := br.ReadString('\n')
		if line != "" {
			p.record(line)
		}
		if err != nil {
			return
		}
	}
}

// expect reads the lines s expects, and after a BDAT line its chunk (RFC
// 3030 §2: the size on the command line, then exactly that many octets),
// which is recorded as a payload.
func (p *peer) expect(br *bufio.Reader, s step) bool {
	want := s.pipe
	if s.expect != "" {
		want = append([]string{s.expect}, want...)
	}
	for _, w := range want {
		line, err := br.ReadString('\n')
		p.record(line)
		if err != nil || !strings.HasPrefix(line, w) {
			p.t.Errorf("peer: got %q (%v), want %q", line, err, w)
			return false
		}
		if f := strings.Fields(line); len(f) > 1 && f[0] == "BDAT" && !p.readChunk(br, f[1]) {
			return false
		}
	}
	return true
}

// readChunk reads a BDAT chunk of size octets.
func (p *peer) readChunk(br *bufio.Reader, size string) bool {
	n, err := strconv.Atoi(size)
	if err != nil {
		p.t.Errorf("peer: BDAT size %q: %v", size, err)
		return false
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(br, buf); err != nil {
		p.t.Errorf("peer: reading a chunk of %d octets: %v", n, err)
		return false
	}
	p.mu.Lock()
	p.data = append(p.data, buf)
	p.mu.Unlock()
	return true
}

func (p *peer) write(conn net.Conn, s step) bool {
	switch {
	case s.flood != "":
		for {
			if _, err := io.WriteString(conn, s.flood); err != nil {
				return false
			}
		}
	case s.drip > 0:
		for i := range len(s.send) {
			if _, err := conn.Write([]byte{s.send[i]}); err != nil {
				return false
			}
			time.Sleep(s.drip)
		}
	case s.send != "":
		if _, err := io.WriteString(conn, s.send); err != nil {
			return false
		}
	}
	return true
}

func (p *peer) readData(br *bufio.Reader) bool {
	var buf []byte
	for !bytes.HasSuffix(buf, []byte("\r\n.\r\n")) && !bytes.Equal(buf, []byte(".\r\n")) {
		b, err := br.ReadByte()
		if err != nil {
			p.t.Errorf("peer: reading data: %v", err)
			return false
		}
		buf = append(buf, b)
	}
	p.mu.Lock()
	p.data = append(p.data, buf)
	p.mu.Unlock()
	return true
}

func (p *peer) record(line string) {
	p.mu.Lock()
	p.lines = append(p.lines, strings.TrimRight(line, "\r\n"))
	p.mu.Unlock()
}

func (p *peer) received() ([]string, [][]byte, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...), append([][]byte(nil), p.data...), p.conns
}

// Script fragments.
var (
	greet       = step{send: "220 mx.test ESMTP\r\n"}
	ehloPlain   = step{expect: "EHLO client.test", send: "250-mx.test\r\n250-8BITMIME\r\n250 SIZE 100000\r\n"}
	ehloTLS     = step{expect: "EHLO client.test", send: "250-mx.test\r\n250 STARTTLS\r\n"}
	ehloPipe    = step{expect: "EHLO client.test", send: "250-mx.test\r\n250-8BITMIME\r\n250 PIPELINING\r\n"}
	ehloChunk   = step{expect: "EHLO client.test", send: "250-mx.test\r\n250-PIPELINING\r\n250 CHUNKING\r\n"}
	ehloChunk1  = step{expect: "EHLO client.test", send: "250-mx.test\r\n250 CHUNKING\r\n"} // without PIPELINING
	mailOK      = step{expect: "MAIL FROM:", send: "250 2.1.0 ok\r\n"}
	rcptOK      = step{expect: "RCPT TO:", send: "250 2.1.5 ok\r\n"}
	dataGo      = step{expect: "DATA", send: "354 go ahead\r\n"}
	dataDone    = step{data: true, send: "250 2.0.0 queued\r\n"}
	quit        = step{expect: "QUIT", send: "221 bye\r\n"}
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
