package probe

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/relay/relaytest"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
)

// TestRun_SMTPReplies walks one MX that answers MAIL and RCPT as scripted.
func TestRun_SMTPReplies(t *testing.T) {
	tests := []struct {
		name       string
		script     peerScript
		target     string
		verdict    string
		exit       int
		reason     string
		failStep   string // the step carrying the reason
		meaningHas string // in the explanation of that step
	}{
		{name: "healthy", target: "user@example.test", verdict: Accepted, exit: 0},
		{name: "domain probes postmaster", target: "Example.TEST", verdict: Accepted, exit: 0},
		{name: "greylisting", target: "user@example.test", verdict: Deferred, exit: 1, reason: "greylisted", failStep: "RCPT",
			script:     peerScript{rcpt: relaytest.Reply("450 4.2.0 <user@example.test>: Recipient address rejected: Greylisted, see http://postgrey.schweikert.ch/help/example.test.html")},
			meaningHas: "greylist"},
		{name: "server misconfiguration", target: "user@example.test", verdict: Deferred, exit: 1, reason: "server-config", failStep: "RCPT",
			script:     peerScript{rcpt: relaytest.Reply("451 4.3.5 Server configuration problem")},
			meaningHas: "misconfigured"},
		{name: "no such user", target: "nobody@example.test", verdict: Refused, exit: 2, reason: "no-such-user", failStep: "RCPT",
			script:     peerScript{rcpt: relaytest.Reply("550 5.1.1 <nobody@example.test>: Recipient address rejected: User unknown")},
			meaningHas: "does not exist"},
		{name: "sender refused", target: "user@example.test", verdict: Refused, exit: 2, reason: "policy", failStep: "MAIL",
			script: peerScript{mail: relaytest.Reply("553 5.7.1 Sender address rejected: not welcome")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startPeer(t, "127.0.0.11", 0, tc.script)
			e := newEnv(t, int(p.Addr().Port()))
			e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.11")
			rep, m := e.run(t, tc.target)
			assertNoData(t, p)
			if !strings.Contains(p.Transcript(), "QUIT") {
				t.Errorf("no QUIT in the dialogue:\n%s", p.Transcript())
			}
			if rep.Verdict != tc.verdict || rep.ExitCode != tc.exit || rep.Reason != tc.reason {
				t.Errorf("verdict %s exit %d reason %q, want %s %d %q", rep.Verdict, rep.ExitCode, rep.Reason, tc.verdict, tc.exit, tc.reason)
			}
			if get(t, m, "verdict") != tc.verdict || get(t, m, "exit_code") != float64(tc.exit) {
				t.Errorf("JSON verdict %v exit_code %v", get(t, m, "verdict"), get(t, m, "exit_code"))
			}
			if len(rep.Paths) != 1 {
				t.Fatalf("%d paths, want 1", len(rep.Paths))
			}
			pr := rep.Paths[0]
			if pr.Host != "mx.example.test" || pr.Address != p.Addr().String() || !strings.HasPrefix(pr.Source, "127.0.0.2:") {
				t.Errorf("path %s %s from %s", pr.Host, pr.Address, pr.Source)
			}
			want := []string{"connect", "greeting", "EHLO", "MAIL", "RCPT", "RSET", "QUIT"}
			if tc.failStep == "MAIL" {
				want = []string{"connect", "greeting", "EHLO", "MAIL", "RSET", "QUIT"}
			}
			if got := names(pr.Steps); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("steps %v, want %v", got, want)
			}
			if g := step(t, pr, "greeting"); !g.OK || !strings.HasPrefix(g.Reply, "220 ") {
				t.Errorf("greeting step %+v", g)
			}
			if len(pr.Extensions) == 0 || !strings.Contains(strings.Join(pr.Extensions, " "), "PIPELINING") {
				t.Errorf("extensions %v", pr.Extensions)
			}
			wantRcpt := "RCPT TO:<" + tc.target + ">"
			if !strings.Contains(tc.target, "@") {
				wantRcpt = "RCPT TO:<postmaster@example.test>"
			}
			if tc.failStep != "MAIL" {
				if s := step(t, pr, "RCPT"); s.Sent != wantRcpt {
					t.Errorf("RCPT sent %q, want %q", s.Sent, wantRcpt)
				}
			}
			if m := step(t, pr, "MAIL"); m.Sent != "MAIL FROM:<>" {
				t.Errorf("MAIL sent %q, want the null sender", m.Sent)
			}
			if tc.failStep == "" {
				return
			}
			s := step(t, pr, tc.failStep)
			if s.OK || s.Reason != tc.reason || s.Explanation == nil || !strings.Contains(s.Explanation.Meaning, tc.meaningHas) {
				t.Errorf("%s step %+v (explanation %+v)", tc.failStep, s, s.Explanation)
			}
			js := get(t, m, "paths", 0, "steps", len(pr.Steps)-3) // RSET and QUIT follow
			if get(t, js, "reason") != tc.reason || get(t, js, "ok") != false || get(t, js, "code") == nil {
				t.Errorf("JSON step %v", js)
			}
			if get(t, js, "explanation", "meaning") == "" {
				t.Errorf("JSON step without explanation: %v", js)
			}
		})
	}
}

func names(steps []Step) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.Name)
	}
	return out
}

// TestRun_Routing covers answers that end the probe before any connection.
func TestRun_Routing(t *testing.T) {
	tests := []struct {
		name      string
		zone      func(e *env)
		verdict   string
		permanent bool
		errHas    string
		kind      string
	}{
		{name: "null MX", zone: func(e *env) { e.dns.NullMX("example.test") }, verdict: Refused, permanent: true, errHas: "null MX", kind: "mx"},
		{name: "NXDOMAIN", zone: func(e *env) {}, verdict: Refused, permanent: true, errHas: "no such domain", kind: "mx"},
		{name: "SERVFAIL", zone: func(e *env) { e.dns.ServFail("example.test") }, verdict: Unreachable, errHas: "server failure", kind: "mx"},
		{name: "private MX refused", zone: func(e *env) {
			e.opt.Router.AllowPrivate = false
			e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.11")
		}, verdict: Unreachable, errHas: "private", kind: "mx"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 25)
			tc.zone(e)
			rep, m := e.run(t, "user@example.test")
			if rep.Verdict != tc.verdict || rep.ExitCode != 2 || rep.Reason != "dns" {
				t.Errorf("verdict %s exit %d reason %q", rep.Verdict, rep.ExitCode, rep.Reason)
			}
			r := rep.Routing
			if r.Kind != tc.kind || r.Permanent != tc.permanent || !strings.Contains(r.Error, tc.errHas) || r.Explanation == nil {
				t.Errorf("routing %+v", r)
			}
			if len(rep.Paths) != 0 || get(t, m, "paths") == nil {
				t.Errorf("paths %+v, JSON %v", rep.Paths, get(t, m, "paths"))
			}
			if get(t, m, "routing", "reason") != "dns" {
				t.Errorf("JSON routing %v", get(t, m, "routing"))
			}
		})
	}
}

// TestRun_PrivateAddressReported shows which MX addresses are refused.
func TestRun_PrivateAddressReported(t *testing.T) {
	e := newEnv(t, 25)
	e.opt.Router.AllowPrivate = false
	e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.11").A("mx.example.test", "10.1.2.3")
	rep, _ := e.run(t, "example.test")
	h := rep.Routing.Hops
	if len(h) != 1 || len(h[0].Addrs) != 0 || strings.Join(h[0].Refused, ",") != "127.0.0.11,10.1.2.3" {
		t.Errorf("hops %+v", h)
	}
}

// TestRun_NextMX: an unreachable first MX passes the turn to the second,
// as delivery does; an implicit MX is reported as such.
func TestRun_NextMX(t *testing.T) {
	port := freePort(t, "127.0.0.13") // nothing listens on 127.0.0.13:port
	p := startPeer(t, "127.0.0.11", port, peerScript{})
	e := newEnv(t, port)
	e.dns.MX("example.test", 10, "mx1.example.test").A("mx1.example.test", "127.0.0.13")
	e.dns.MX("example.test", 20, "mx2.example.test").A("mx2.example.test", "127.0.0.11")
	rep, m := e.run(t, "user@example.test")
	assertNoData(t, p)
	if rep.Verdict != Accepted || rep.ExitCode != 0 || len(rep.Paths) != 2 {
		t.Fatalf("verdict %s exit %d, %d paths", rep.Verdict, rep.ExitCode, len(rep.Paths))
	}
	first := rep.Paths[0]
	if first.Outcome != Unreachable || first.Reason != "connect" || first.Pref != 10 || first.Steps[0].Error == "" {
		t.Errorf("first path %+v", first)
	}
	if get(t, m, "paths", 1, "outcome") != Accepted || get(t, m, "paths", 1, "pref") != float64(20) {
		t.Errorf("second path %v", get(t, m, "paths", 1))
	}
}

func TestRun_ImplicitMX(t *testing.T) {
	p := startPeer(t, "127.0.0.11", 0, peerScript{})
	e := newEnv(t, int(p.Addr().Port()))
	e.dns.A("example.test", "127.0.0.11")
	rep, _ := e.run(t, "user@example.test")
	if rep.Routing.Kind != "implicit-mx" || rep.Verdict != Accepted {
		t.Errorf("routing %+v verdict %s", rep.Routing, rep.Verdict)
	}
}

// TestRun_Unreachable: no MX answers at all.
func TestRun_Unreachable(t *testing.T) {
	port := freePort(t, "127.0.0.13")
	e := newEnv(t, port)
	e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.13")
	rep, m := e.run(t, "user@example.test")
	if rep.Verdict != Unreachable || rep.ExitCode != 2 || rep.Reason != "connect" {
		t.Errorf("verdict %s exit %d reason %q", rep.Verdict, rep.ExitCode, rep.Reason)
	}
	if get(t, m, "paths", 0, "steps", 0, "reason") != "connect" {
		t.Errorf("JSON %v", get(t, m, "paths", 0))
	}
}

// TestRun_Identity checks forward-confirmed reverse DNS and the HELO name.
func TestRun_Identity(t *testing.T) {
	tests := []struct {
		name        string
		source      string
		zone        func(e *env)
		fcrdns      bool
		heloMatches bool
		problems    []string
	}{
		{name: "consistent", source: "127.0.0.2", zone: func(*env) {}, fcrdns: true, heloMatches: true},
		{name: "PTR mismatch", source: "127.0.0.3", zone: func(e *env) {
			e.dns.PTR("127.0.0.3", "elsewhere.test").A("elsewhere.test", "127.0.0.99")
		}, problems: []string{"does not resolve back", "HELO name relay.test does not resolve to the source address 127.0.0.3"}},
		{name: "no PTR", source: "127.0.0.4", zone: func(*env) {}, problems: []string{"has no reverse DNS (NXDOMAIN)", "HELO name"}},
		{name: "HELO does not resolve", source: "127.0.0.2", zone: func(e *env) { e.opt.Hostname = "ghost.test" },
			fcrdns: true, problems: []string{"HELO name ghost.test does not resolve (NXDOMAIN)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startPeer(t, "127.0.0.11", 0, peerScript{})
			e := newEnv(t, int(p.Addr().Port()))
			e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.11")
			e.opt.SourceIPv4 = tc.source
			e.opt.Dialer4 = &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(tc.source)}}
			tc.zone(e)
			rep, m := e.run(t, "user@example.test")
			id := rep.Identity
			if len(id.Sources) != 1 {
				t.Fatalf("sources %+v", id.Sources)
			}
			s := id.Sources[0]
			if s.Address != tc.source || s.Origin != "configured" || s.ForwardConfirmed != tc.fcrdns || s.HELOMatches != tc.heloMatches {
				t.Errorf("source %+v", s)
			}
			if len(id.Problems) != len(tc.problems) {
				t.Errorf("problems %q, want %d", id.Problems, len(tc.problems))
			}
			for i, want := range tc.problems {
				if i < len(id.Problems) && !strings.Contains(id.Problems[i], want) {
					t.Errorf("problem %d %q, want it to contain %q", i, id.Problems[i], want)
				}
			}
			if get(t, m, "identity", "sources", 0, "forward_confirmed") != tc.fcrdns {
				t.Errorf("JSON identity %v", get(t, m, "identity"))
			}
			if rep.Verdict != Accepted {
				t.Errorf("verdict %s", rep.Verdict)
			}
		})
	}
}

// TestRun_KernelSource: without delivery.source_ipv4 the source is the
// local address of the connection, learnt after connecting.
func TestRun_KernelSource(t *testing.T) {
	p := startPeer(t, "127.0.0.11", 0, peerScript{})
	e := newEnv(t, int(p.Addr().Port()))
	e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.11")
	e.opt.SourceIPv4, e.opt.Dialer4 = "", &net.Dialer{}
	rep, _ := e.run(t, "user@example.test")
	src := rep.Paths[0].Source
	host, _, _ := net.SplitHostPort(src)
	if len(rep.Identity.Sources) != 1 || rep.Identity.Sources[0].Address != host || rep.Identity.Sources[0].Origin != "kernel" {
		t.Errorf("identity %+v, path source %s", rep.Identity, src)
	}
}

// TestRun_NoSourceKnown: nothing connected and no source configured.
func TestRun_NoSourceKnown(t *testing.T) {
	e := newEnv(t, 25)
	e.opt.SourceIPv4 = ""
	rep, _ := e.run(t, "user@example.test")
	if len(rep.Identity.Sources) != 0 || len(rep.Identity.Problems) != 1 || !strings.Contains(rep.Identity.Problems[0], "source address unknown") {
		t.Errorf("identity %+v", rep.Identity)
	}
}

// TestRun_DNSBL looks the source address up in blocklists served by the
// test DNS (RFC 5782: 2.0.0.127.<zone>).
func TestRun_DNSBL(t *testing.T) {
	p := startPeer(t, "127.0.0.11", 0, peerScript{})
	e := newEnv(t, int(p.Addr().Port()))
	e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.11")
	e.dns.A("2.0.0.127.bl.test", "127.0.0.2").TXT("2.0.0.127.bl.test", "Listed for sending spam, see https://bl.test/127.0.0.2")
	e.dns.A("2.0.0.127.refusing.test", "127.255.255.254")
	e.dns.A("unrelated.clean.test", "127.0.0.2") // the zone exists; our entry does not
	e.opt.DNSBL = []string{"bl.test", "clean.test", "Refusing.Test."}
	rep, m := e.run(t, "user@example.test")
	if len(rep.Reputation) != 3 {
		t.Fatalf("reputation %+v", rep.Reputation)
	}
	bl, clean, refusing := rep.Reputation[0], rep.Reputation[1], rep.Reputation[2]
	if !bl.Listed || bl.Query != "2.0.0.127.bl.test" || bl.Codes[0] != "127.0.0.2" || !strings.Contains(bl.Reason, "sending spam") || bl.Error != "" {
		t.Errorf("bl.test %+v", bl)
	}
	if clean.Listed || clean.Error != "" || clean.List != "clean.test" {
		t.Errorf("clean.test %+v", clean)
	}
	if refusing.Listed || !strings.Contains(refusing.Error, "refused the query") || refusing.List != "refusing.test" {
		t.Errorf("refusing.test %+v", refusing)
	}
	if get(t, m, "reputation", 0, "listed") != true || get(t, m, "reputation", 0, "address") != "127.0.0.2" {
		t.Errorf("JSON %v", get(t, m, "reputation"))
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "127.0.0.2 is LISTED in bl.test") {
		t.Errorf("text:\n%s", text.String())
	}
}

// TestRun_STARTTLS reports the session's TLS and whether the certificate
// verifies for the MX name, under each TLS policy.
func TestRun_STARTTLS(t *testing.T) {
	srvTLS, pool := selfSigned(t, "mx.example.test")
	tests := []struct {
		name     string
		policy   string
		trusted  bool
		verdict  string
		verifies bool
		errHas   string
	}{
		{name: "self-signed, may", policy: "may", verdict: Accepted, errHas: "unknown authority"},
		{name: "trusted, verify", policy: "verify", trusted: true, verdict: Accepted, verifies: true},
		{name: "self-signed, verify", policy: "verify", verdict: Unreachable, errHas: "unknown authority"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startPeer(t, "127.0.0.11", 0, peerScript{tls: srvTLS})
			e := newEnv(t, int(p.Addr().Port()))
			e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.11")
			e.opt.TLS = smtpclient.TLSPolicy(tc.policy)
			if tc.trusted {
				e.opt.TLSConfig = &tls.Config{RootCAs: pool}
			}
			rep, m := e.run(t, "user@example.test")
			assertNoData(t, p)
			if rep.Verdict != tc.verdict {
				t.Errorf("verdict %s, want %s", rep.Verdict, tc.verdict)
			}
			ti := rep.Paths[0].TLS
			if ti == nil {
				t.Fatalf("no TLS info: %+v", rep.Paths[0])
			}
			if ti.VerifiesFor != tc.verifies || !strings.Contains(ti.VerifyError, tc.errHas) || ti.ServerName != "mx.example.test" ||
				!strings.Contains(ti.Subject, "mx.example.test") || ti.NotAfter.IsZero() || ti.Expired {
				t.Errorf("TLS %+v", ti)
			}
			if get(t, m, "paths", 0, "tls", "verifies_for") != tc.verifies {
				t.Errorf("JSON tls %v", get(t, m, "paths", 0, "tls"))
			}
			if tc.verdict == Accepted {
				if ti.Version == "" || ti.Cipher == "" {
					t.Errorf("TLS session not described: %+v", ti)
				}
				if got := names(rep.Paths[0].Steps); strings.Join(got, " ") != "connect greeting EHLO STARTTLS EHLO MAIL RCPT RSET QUIT" {
					t.Errorf("steps %v", got)
				}
			} else if rep.Paths[0].Reason != "tls" {
				t.Errorf("reason %q, want tls", rep.Paths[0].Reason)
			}
		})
	}
}

// TestRun_BadTarget refuses what is not an address or a domain.
func TestRun_BadTarget(t *testing.T) {
	e := newEnv(t, 25)
	for _, target := range []string{"", "user@", "@example.test", "a b@example.test", "user@[127.0.0.1]", "user@example.test\r\nDATA", "127.0.0.1"} {
		if _, err := Run(t.Context(), target, e.opt); err == nil {
			t.Errorf("Run(%q) succeeded", target)
		}
	}
	e.opt.Sender = "bad sender"
	if _, err := Run(t.Context(), "example.test", e.opt); err == nil {
		t.Error("a bad probe.sender was accepted")
	}
}

// TestRun_Sender uses the configured probe sender in MAIL FROM.
func TestRun_Sender(t *testing.T) {
	p := startPeer(t, "127.0.0.11", 0, peerScript{})
	e := newEnv(t, int(p.Addr().Port()))
	e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.11")
	e.opt.Sender = "<probe@relay.test>"
	rep, _ := e.run(t, "user@example.test")
	if s := step(t, rep.Paths[0], "MAIL"); s.Sent != "MAIL FROM:<probe@relay.test>" || rep.Sender != "probe@relay.test" {
		t.Errorf("MAIL step %+v, sender %q", s, rep.Sender)
	}
}

// TestRun_TLSFallback: under "may" a failed handshake is reported and the
// probe redials in plaintext, as the relay does (RFC 7435 §4).
func TestRun_TLSFallback(t *testing.T) {
	srvTLS, _ := selfSigned(t, "mx.example.test")
	srvTLS.MaxVersion = tls.VersionTLS10 // our client requires TLS 1.2
	p := startPeer(t, "127.0.0.11", 0, peerScript{tls: srvTLS})
	e := newEnv(t, int(p.Addr().Port()))
	e.dns.MX("example.test", 10, "mx.example.test").A("mx.example.test", "127.0.0.11")
	rep, _ := e.run(t, "user@example.test")
	assertNoData(t, p)
	pr := rep.Paths[0]
	got := strings.Join(names(pr.Steps), " ")
	if rep.Verdict != Accepted || got != "connect greeting EHLO STARTTLS tls connect greeting EHLO MAIL RCPT RSET QUIT" {
		t.Fatalf("verdict %s, steps %s", rep.Verdict, got)
	}
	if s := step(t, pr, "tls"); s.Reason != "tls" || s.Error == "" || !strings.Contains(s.Note, "plaintext") {
		t.Errorf("tls step %+v", s)
	}
	if pr.TLS != nil {
		t.Errorf("TLS info for a plaintext session: %+v", pr.TLS)
	}
}

// TestRun_Smarthost: the smarthost is the one hop, reached with its own TLS
// policy and credentials; the password never appears in the report.
func TestRun_Smarthost(t *testing.T) {
	srvTLS, _ := selfSigned(t, "smarthost.test")
	p := startPeer(t, "127.0.0.11", 0, peerScript{tls: srvTLS})
	e := newEnv(t, 25)
	e.opt.Router.Smarthost = p.Addr().String()
	e.opt.Router.AllowPrivate = false // does not apply to a configured next hop
	e.opt.TLS, e.opt.SmarthostTLS = smtpclient.TLSNone, smtpclient.TLSEncrypt
	e.opt.Username, e.opt.Password = "probe", "pw"
	rep, m := e.run(t, "user@example.test")
	assertNoData(t, p)
	if rep.Routing.Kind != "smarthost" || rep.Verdict != Accepted || len(rep.Paths) != 1 {
		t.Fatalf("routing %+v, verdict %s", rep.Routing, rep.Verdict)
	}
	pr := rep.Paths[0]
	if got := strings.Join(names(pr.Steps), " "); got != "connect greeting EHLO STARTTLS EHLO AUTH MAIL RCPT RSET QUIT" {
		t.Errorf("steps %s", got)
	}
	if a := step(t, pr, "AUTH"); a.Sent != "AUTH PLAIN <redacted>" || a.Code != 235 {
		t.Errorf("AUTH step %+v", a)
	}
	b, _ := json.Marshal(m)
	if plain := base64.StdEncoding.EncodeToString([]byte("\x00probe\x00pw")); strings.Contains(string(b), plain) {
		t.Errorf("credentials leaked into the report: %s", b)
	}
}
