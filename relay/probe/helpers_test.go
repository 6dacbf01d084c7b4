package probe

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

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

// assertNoData fails the test if the client ever sent DATA (or BDAT):
// a probe must never send a message.
func assertNoData(t *testing.T, p *relaytest.FakeMX) {
	t.Helper()
	data := false
	for _, tx := range p.Transactions() {
		data = data || tx.DataCalls > 0
	}
	tr := p.Transcript()
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

// startPeer starts a fake MX for mx.example.test on ip:port (port 0: any)
// that answers MAIL and RCPT as script says and accepts AUTH PLAIN for
// user "probe", password "pw".
func startPeer(t *testing.T, ip string, port int, script peerScript) *relaytest.FakeMX {
	t.Helper()
	o := relaytest.MXOptions{Domain: "mx.example.test", TLS: script.tls, Users: map[string]string{"probe": "pw"},
		Configure: func(s *smtp.Server) { s.ReadTimeout, s.WriteTimeout = 10*time.Second, 10*time.Second }}
	if script.mail != nil {
		o.Script.Mail = func(int) error { return script.mail }
	}
	if script.rcpt != nil {
		o.Script.Rcpt = func(int, string) error { return script.rcpt }
	}
	return relaytest.StartMX(t, net.JoinHostPort(ip, strconv.Itoa(port)), o)
}

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
