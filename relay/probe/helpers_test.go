package probe

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/mx/mxtest"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// peerScript says how a fake MX answers; nil errors accept.
type peerScript struct {
	mail, rcpt error
	tls        *tls.Config
}

// peer is a scripted go-smtp server on a loopback address. It records the
// whole dialogue (go-smtp's Debug writer) and whether DATA ever arrived.
type peer struct {
	addr netip.AddrPort
	mu   sync.Mutex
	log  bytes.Buffer
	data bool
}

func (p *peer) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Write(b)
}

// transcript returns what was said so far.
func (p *peer) transcript() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// assertNoData fails the test if the client ever sent DATA (or BDAT):
// a probe must never send a message.
func (p *peer) assertNoData(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	data := p.data
	p.mu.Unlock()
	tr := p.transcript()
	for _, l := range strings.Split(tr, "\n") {
		l = strings.ToUpper(strings.TrimSpace(l))
		if l == "DATA" || strings.HasPrefix(l, "BDAT") {
			data = true
		}
	}
	if data {
		t.Errorf("the peer received DATA:\n%s", tr)
	}
}

type peerSession struct {
	p *peer
	s peerScript
}

func (s *peerSession) Reset()        {}
func (s *peerSession) Logout() error { return nil }
func (s *peerSession) Mail(string, *smtp.MailOptions) error {
	return s.s.mail
}
func (s *peerSession) Rcpt(string, *smtp.RcptOptions) error { return s.s.rcpt }

// AuthMechanisms and Auth accept PLAIN for user "probe", password "pw".
func (s *peerSession) AuthMechanisms() []string { return []string{sasl.Plain} }
func (s *peerSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != "probe" || pass != "pw" {
			return errors.New("bad credentials")
		}
		return nil
	}), nil
}
func (s *peerSession) Data(r io.Reader) error {
	s.p.mu.Lock()
	s.p.data = true
	s.p.mu.Unlock()
	_, err := io.Copy(io.Discard, r)
	return err
}

// startPeer listens on ip:port (port 0: any) and serves the script.
func startPeer(t *testing.T, ip string, port int, script peerScript) *peer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{addr: netip.MustParseAddrPort(ln.Addr().String())}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) {
		return &peerSession{p: p, s: script}, nil
	}))
	srv.Domain = "mx.example.test"
	srv.Debug = p
	srv.TLSConfig = script.tls
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	srv.ErrorLog = quietLog{}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return p
}

type quietLog struct{}

func (quietLog) Printf(string, ...any) {}
func (quietLog) Println(...any)        {}

// freePort returns a port free on every address we use (we bind it on one).
func freePort(t *testing.T, ip string) int {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// env is one probe's world: a DNS server with our identity records, a
// relay-like configuration sending from 127.0.0.2 as relay.test.
type env struct {
	dns *mxtest.Server
	opt Options
}

func newEnv(t *testing.T, port int) *env {
	t.Helper()
	d := &mxtest.Server{}
	d.Start(t)
	// Our identity, all consistent: FCrDNS and HELO name match.
	d.PTR("127.0.0.2", "relay.test").A("relay.test", "127.0.0.2")
	cl, err := classifier.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	res := mx.NewDNS(d.Addr(), 2*time.Second)
	return &env{dns: d, opt: Options{
		Hostname:   "relay.test",
		Router:     &mx.Router{Resolver: res, Port: port, AllowPrivate: true, IPv4: true},
		Dialer4:    &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}},
		SourceIPv4: "127.0.0.2", TLS: "may", Classifier: cl,
		ConnectTimeout: 5 * time.Second, GreetingTimeout: 5 * time.Second, CommandTimeout: 5 * time.Second,
	}}
}

// run probes target and also round-trips the report through JSON, which
// is what scripts and the admin API see.
func (e *env) run(t *testing.T, target string) (Report, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Run(ctx, target, e.opt)
	if err != nil {
		t.Fatalf("Run(%q): %v", target, err)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("report:\n%s", text.String())
	}
	return rep, m
}

// get walks a decoded JSON value: get(m, "paths", 0, "tls", "verifies_for").
func get(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("JSON %v: not an object at %q", path, k)
			}
			if v, ok = m[k]; !ok {
				t.Fatalf("JSON %v: no field %q", path, k)
			}
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				t.Fatalf("JSON %v: no element %d", path, k)
			}
			v = a[k]
		}
	}
	return v
}

// step returns the step of the path named name, or fails.
func step(t *testing.T, pr PathReport, name string) Step {
	t.Helper()
	for _, s := range pr.Steps {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no %s step in %+v", name, pr.Steps)
	return Step{}
}

// selfSigned returns a server TLS configuration with a self-signed
// certificate for host, and a pool that trusts it.
func selfSigned(t *testing.T, host string) (*tls.Config, *x509.CertPool) {
	t.Helper()
	pair, pool, err := relaytest.SelfSigned(host)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}}, pool
}
