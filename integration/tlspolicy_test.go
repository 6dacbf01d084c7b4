package integration

// Outbound TLS policy: DANE (RFC 7672) through a real validating Unbound
// and an NSD serving a zone signed by ldns-signzone, to a real Postfix
// offering STARTTLS.

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// tlsaHash is the SHA-256 of a certificate's DER (selector 0) or of its
// SubjectPublicKeyInfo (selector 1), in hex, for a TLSA record.
func tlsaHash(t *testing.T, c *peers.Cert, selector int) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	data := cert.Raw
	if selector == 1 {
		data = cert.RawSubjectPublicKeyInfo
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// TestDANE delivers to one Postfix with STARTTLS, reached under several
// MX names whose TLSA records say different things. DANE-EE and DANE-TA
// records that match, and PKIX-only records (unusable: TLS required, not
// authenticated), deliver over TLS; a record that does not match the
// certificate and a record whose signature is bogus defer with reason tls
// (4.7.5) and never send the message in the clear; an unsigned zone's
// mismatching TLSA record is ignored (insecure: delivery.tls applies).
// An MX host that is a secure CNAME chain is authenticated by the TLSA
// records of the chain's target, named in SNI; one whose chain leads
// into an unsigned zone is not held to DANE. The DANE mismatch is in the
// TLS report (RFC 8460) POSTed to the domain's rua.
func TestDANE(t *testing.T) {
	peers.Require(t, "postfix", "swaks", "nsd", "unbound", "ldns-signzone")
	t.Parallel()
	n := newMailNet(t)
	mxIP := n.host("")
	// The TLS report of bad.dane.test goes by HTTPS POST to a report
	// server.
	postIP := n.host("")
	postPort := peers.FreePort(t, postIP)
	posts := reportServer(t, net.JoinHostPort(postIP, strconv.Itoa(postPort)))
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, readFile(t, posts.cert.CertFile), 0o644); err != nil {
		t.Fatal(err)
	}
	sniIP := n.host("")
	sniCert := peers.NewCert(t, "mx-target.dane.test")
	var sni sync.Map // the SNI of each handshake at the sink
	sniTLS := sniCert.Config.Clone()
	sniTLS.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		sni.Store(hello.ServerName, true)
		return nil, nil
	}
	sniSink := peers.StartSink(t, net.JoinHostPort(sniIP, strconv.Itoa(n.port)), peers.SinkOptions{TLS: sniTLS})
	names := []string{"mx-ee.dane.test", "mx-ta.dane.test", "mx-pkix.dane.test", "mx-bad.dane.test", "mx-bogus.dane.test", "mx.plain.test"}
	cert := peers.NewCert(t, names...)
	spki, full := tlsaHash(t, cert, 1), tlsaHash(t, cert, 0)
	wrong := strings.Repeat("ab", 32)
	tlsa := "_" + strconv.Itoa(n.port) + "._tcp."
	var signed []string
	for _, h := range []string{"ee", "ta", "pkix", "bad", "bogus"} {
		signed = append(signed, h+" MX 10 mx-"+h, "mx-"+h+" A "+mxIP)
	}
	signed = append(signed,
		tlsa+"mx-ee TLSA 3 1 1 "+spki,
		tlsa+"mx-ta TLSA 2 0 1 "+full,
		tlsa+"mx-pkix TLSA 1 1 1 "+spki,
		tlsa+"mx-bad TLSA 3 1 1 "+wrong,
		tlsa+"mx-bogus TLSA 3 1 1 "+spki,
		// RFC 7672 §2.2.3: a secure CNAME chain whose target holds the
		// TLSA records (the target's certificate is the sink's), and a
		// CNAME into an unsigned zone (DANE does not apply, although a
		// mismatching TLSA record sits at the original name).
		"cname MX 10 mx-alias", "mx-alias CNAME mx-target", "mx-target A "+sniIP,
		tlsa+"mx-target TLSA 3 1 1 "+tlsaHash(t, sniCert, 1),
		"out MX 10 mx-out", "mx-out CNAME mx.plain.test.", tlsa+"mx-out TLSA 3 1 1 "+wrong,
		`_smtp._tls.bad TXT "v=TLSRPTv1; rua=https://tlsrpt.reports.test:`+strconv.Itoa(postPort)+`/v1"`)
	dns := peers.StartDNSSEC(t, n.host(""), n.host(""),
		peers.Zone{Name: "dane.test", Signed: true, Records: signed, Forge: []string{tlsa + "mx-bogus"}},
		peers.Zone{Name: "plain.test", Records: []string{"@ MX 10 mx", "mx A " + mxIP, tlsa + "mx TLSA 3 1 1 " + wrong}},
		peers.Zone{Name: "reports.test", Records: []string{"tlsrpt A " + postIP}},
		peers.Zone{Name: "relay.test"}) // the probe looks up our HELO name

	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	px := peers.StartPostfix(t, peers.PostfixConfig{Listen: net.JoinHostPort(mxIP, strconv.Itoa(n.port)),
		Hostname: "mx-ee.dane.test", ServerCert: cert, DeliverTo: final.Addr,
		RelayDomains: []string{"ee.dane.test", "ta.dane.test", "pkix.dane.test", "bad.dane.test", "bogus.dane.test", "plain.test", "out.dane.test"}})
	r := n.relay("delivery.resolver="+dns.Resolver, "delivery.dnssec=trust-ad", "delivery.mta_sts=false",
		"tls_reporting.enabled=true", "tls_reporting.allow_private_rua=true", "delivery.tls_ca_file="+caFile)

	ids := map[string]string{}
	for _, dom := range []string{"ee.dane.test", "ta.dane.test", "pkix.dane.test", "bad.dane.test", "bogus.dane.test", "plain.test", "cname.dane.test", "out.dane.test"} {
		to := "u@" + dom
		ids[dom] = r.send(peers.SwaksMessage{From: "a@src.test", To: []string{to}, Data: message("a@src.test", to, "dane "+dom)})
	}
	for dom, want := range map[string]string{"ee.dane.test": "dane", "ta.dane.test": "dane", "pkix.dane.test": "dane-unusable", "plain.test": "none",
		"cname.dane.test": "dane", "out.dane.test": "none"} {
		r.waitAttempts(ids[dom], "delivered", 60*time.Second)
		if got := lastPolicy(t, r, ids[dom]); got != want {
			t.Errorf("%s: attempt made under TLS policy %q, want %q", dom, got, want)
		}
	}
	for _, dom := range []string{"bad.dane.test", "bogus.dane.test"} {
		atts := r.waitAttempts(ids[dom], "deferred", 60*time.Second)
		if a := atts[0]; a.str("reason") != "tls" || !strings.Contains(fmt.Sprint(a), "4.7.5") {
			t.Errorf("%s: first attempt %v, want deferred with reason tls, 4.7.5", dom, a)
		}
		if got := lastPolicy(t, r, ids[dom]); got != "dane" {
			t.Errorf("%s: attempt made under TLS policy %q, want dane", dom, got)
		}
	}
	// RFC 8460 §4.3.2.1: the mismatch is a tlsa-invalid failure of the
	// tlsa policy of mx-bad in bad.dane.test's report.
	if res := r.cli("tls-report", "send"); res.Code != 0 || !strings.Contains(res.Stdout, "bad.dane.test") {
		t.Errorf("tls-report send: %s", res)
	}
	select {
	case p := <-posts.got:
		rep := decodeTLSReport(t, p.body)
		if len(rep.Policies) != 1 {
			t.Fatalf("bad.dane.test report: %+v, want one policy", rep)
		}
		pol := rep.Policies[0]
		if pol.Policy.Type != "tlsa" || pol.Policy.Domain != "bad.dane.test" || strings.Join(pol.Policy.String, ",") != "3 1 1 "+wrong ||
			strings.Join(pol.Policy.MX, ",") != "mx-bad.dane.test" || pol.Summary.OK != 0 || pol.Summary.Failed < 1 ||
			len(pol.Failures) != 1 || pol.Failures[0].Result != "tlsa-invalid" || pol.Failures[0].MX != "mx-bad.dane.test" {
			t.Errorf("bad.dane.test report policy %+v, want tlsa 3 1 1 %s at mx-bad.dane.test with tlsa-invalid failures only", pol, wrong)
		}
	case <-time.After(30 * time.Second):
		t.Error("no TLS report POSTed for bad.dane.test")
	}
	// RFC 7672 §3.2.2: the SNI is the TLSA base domain, the CNAME target.
	if _, ok := sni.Load("mx-target.dane.test"); !ok || len(sniSink.Messages()) != 1 {
		var seen []any
		sni.Range(func(k, _ any) bool { seen = append(seen, k); return true })
		t.Errorf("CNAME'd MX: SNI seen %v, %d messages; want mx-target.dane.test and 1", seen, len(sniSink.Messages()))
	}
	// Every delivery to Postfix was encrypted; the deferred ones never
	// reached MAIL.
	for _, m := range final.WaitFor(t, 5, 30*time.Second) {
		for _, rc := range m.Rcpts {
			if strings.HasSuffix(rc, "@bad.dane.test") || strings.HasSuffix(rc, "@bogus.dane.test") {
				t.Errorf("%s was delivered despite a failed DANE check", rc)
			}
		}
	}
	log := px.Log()
	if c := strings.Count(log, "TLS connection established from"); c < 5 {
		t.Errorf("Postfix saw %d TLS sessions, want at least 5:\n%s", c, log)
	}
	if strings.Contains(log, "bad.dane.test>") || strings.Contains(log, "bogus.dane.test>") {
		t.Errorf("Postfix saw an envelope for a domain whose DANE check failed:\n%s", log)
	}
	res := r.cli("queue", "show", ids["bad.dane.test"])
	if !strings.Contains(res.Stdout, "TLS POLICY") || !strings.Contains(res.Stdout, " dane ") {
		t.Errorf("queue show does not name the DANE policy:\n%s", res)
	}
	// probe shows the TLSA records with their DNSSEC state and probes
	// under them: the matching MX accepts, the mismatching one defers.
	res = r.cli("probe", "u@ee.dane.test")
	if res.Code != 0 || !strings.Contains(res.Stdout, "TLSA of mx-ee.dane.test (base domain mx-ee.dane.test): secure") ||
		!strings.Contains(res.Stdout, "3 1 1 "+spki) || !strings.Contains(res.Stdout, "mx-ee.dane.test: dane") {
		t.Errorf("probe u@ee.dane.test: want exit 0, the secure TLSA record and policy dane:\n%s", res)
	}
	res = r.cli("probe", "u@bad.dane.test")
	if res.Code == 0 || !strings.Contains(res.Stdout, "no TLSA record matches") {
		t.Errorf("probe u@bad.dane.test: want a failure and the DANE mismatch:\n%s", res)
	}
	res = r.cli("probe", "u@bogus.dane.test")
	if res.Code != 1 || !strings.Contains(res.Stdout, ": bogus") {
		t.Errorf("probe u@bogus.dane.test: want exit 1 (deferred) and a bogus TLSA lookup:\n%s", res)
	}
	// The status page names the policy of each delivery and deferral.
	_, page := r.Get(t, "/")
	for _, want := range []string{"u@ee.dane.test", "u@pkix.dane.test", `<td class="mono">dane</td>`, `<td class="mono">dane-unusable</td>`} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	if m := r.metrics()["greyrelay_tls_policy_total"]; m == nil || len(m.GetMetric()) < 3 {
		t.Errorf("metric greyrelay_tls_policy_total: %v, want series for dane, dane-unusable and none", m)
	}
}

// lastPolicy returns the TLS policy of the newest ended attempt of message id's
// only recipient, from `greyrelay queue show -json`.
func lastPolicy(t *testing.T, r *testRelay, id string) string {
	t.Helper()
	res := r.cli("queue", "show", "-json", id)
	var m struct {
		Recipients []struct {
			History []struct {
				TLS string     `json:"tls_policy"`
				End *time.Time `json:"end"`
			} `json:"history"`
		} `json:"recipients"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &m); err != nil || len(m.Recipients) != 1 {
		t.Fatalf("queue show -json %s: %v\n%s", id, err, res)
	}
	// The last attempt that ended: a deferred recipient's next one may be
	// under way, not yet under any policy.
	h := m.Recipients[0].History
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].End != nil {
			return h[i].TLS
		}
	}
	t.Fatalf("queue show -json %s: no attempt ended\n%s", id, res)
	return ""
}

// stsServer serves MTA-STS policies over HTTPS on ip:443 for the domains
// in policies (by Host header), with a certificate for their mta-sts
// names, and returns that certificate.
func stsServer(t *testing.T, ip string, policies map[string]string) *peers.Cert {
	t.Helper()
	var names []string
	for dom := range policies {
		names = append(names, "mta-sts."+dom)
	}
	cert := peers.NewCert(t, names...)
	ln, err := tls.Listen("tcp", net.JoinHostPort(ip, "443"), cert.Config)
	if err != nil {
		t.Fatalf("policy server: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p, ok := policies[strings.TrimPrefix(req.Host, "mta-sts.")]
		if !ok || req.URL.Path != "/.well-known/mta-sts.txt" {
			http.NotFound(w, req)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, p)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return cert
}

// TestMTASTS delivers under MTA-STS policies fetched over HTTPS from a
// policy server whose certificate the relay trusts through
// delivery.tls_ca_file, to a real Postfix with STARTTLS: "enforce" with
// a listed MX and a valid certificate delivers over verified TLS;
// "enforce" with an unlisted MX, or with an MX whose certificate is not
// valid for its name, defers with reason tls and sends nothing;
// "testing" delivers despite an unlisted MX.
func TestMTASTS(t *testing.T) {
	peers.Require(t, "postfix", "swaks")
	t.Parallel()
	n := newMailNet(t)
	mxIP, policyIP := n.host(""), n.host("")
	mxCert := peers.NewCert(t, "mx.ok.test", "mx.unlisted.test", "mx.testing.test")
	policy := func(mode, mx string) string {
		return "version: STSv1\r\nmode: " + mode + "\r\nmx: " + mx + "\r\nmax_age: 86400\r\n"
	}
	policies := map[string]string{
		"ok.test":       policy("enforce", "mx.ok.test"),
		"unlisted.test": policy("enforce", "other.unlisted.test"),
		"badcert.test":  policy("enforce", "*.badcert.test"),
		"testing.test":  policy("testing", "other.testing.test"),
	}
	for dom := range policies {
		n.dns.MX(dom, 10, "mx."+dom).A("mx."+dom, mxIP).A("mta-sts."+dom, policyIP).
			TXT("_mta-sts."+dom, "v=STSv1; id=20261201;")
	}
	stsCert := stsServer(t, policyIP, policies)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, append(readFile(t, mxCert.CertFile), readFile(t, stsCert.CertFile)...), 0o644); err != nil {
		t.Fatal(err)
	}
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	px := peers.StartPostfix(t, peers.PostfixConfig{Listen: net.JoinHostPort(mxIP, strconv.Itoa(n.port)),
		Hostname: "mx.ok.test", ServerCert: mxCert, DeliverTo: final.Addr,
		RelayDomains: []string{"ok.test", "unlisted.test", "badcert.test", "testing.test"}})
	r := n.relay("delivery.mta_sts=true", "delivery.tls_ca_file="+caFile)

	ids := map[string]string{}
	for dom := range policies {
		to := "u@" + dom
		ids[dom] = r.send(peers.SwaksMessage{From: "a@src.test", To: []string{to}, Data: message("a@src.test", to, "sts "+dom)})
	}
	for dom, want := range map[string]string{"ok.test": "mta-sts", "testing.test": "mta-sts-testing"} {
		r.waitAttempts(ids[dom], "delivered", 60*time.Second)
		if got := lastPolicy(t, r, ids[dom]); got != want {
			t.Errorf("%s: attempt made under TLS policy %q, want %q", dom, got, want)
		}
	}
	for _, dom := range []string{"unlisted.test", "badcert.test"} {
		atts := r.waitAttempts(ids[dom], "deferred", 60*time.Second)
		if a := atts[0]; a.str("reason") != "tls" || a.str("enhanced") != "4.7.5" {
			t.Errorf("%s: first attempt %v, want deferred with reason tls, 4.7.5", dom, a)
		}
	}
	for _, m := range final.WaitFor(t, 2, 30*time.Second) {
		for _, rc := range m.Rcpts {
			if strings.HasSuffix(rc, "@unlisted.test") || strings.HasSuffix(rc, "@badcert.test") {
				t.Errorf("%s was delivered despite its enforced MTA-STS policy", rc)
			}
		}
	}
	if log := px.Log(); strings.Contains(log, "unlisted.test>") || strings.Contains(log, "badcert.test>") {
		t.Errorf("Postfix saw an envelope for a domain whose MTA-STS policy forbids it:\n%s", log)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// plaintextRequireTLS sends EHLO and "MAIL FROM:<a@src.test> REQUIRETLS"
// without TLS and returns both replies.
func plaintextRequireTLS(t *testing.T, addr string) (ehlo, mail string) {
	t.Helper()
	c, err := textproto.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, _, err := c.ReadResponse(220); err != nil {
		t.Fatal(err)
	}
	if err := c.PrintfLine("EHLO client.test"); err != nil {
		t.Fatal(err)
	}
	_, ehlo, err = c.ReadResponse(250)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PrintfLine("MAIL FROM:<a@src.test> REQUIRETLS"); err != nil {
		t.Fatal(err)
	}
	code, msg, _ := c.ReadResponse(0)
	return ehlo, fmt.Sprintf("%d %s", code, msg)
}

// submitOverTLS submits one message over STARTTLS with go-smtp's client, with
// REQUIRETLS on MAIL if requireTLS, and returns the queue id.
func submitOverTLS(t *testing.T, addr, to string, data []byte, requireTLS bool) string {
	t.Helper()
	c, err := smtp.DialStartTLS(addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Mail("a@src.test", &smtp.MailOptions{RequireTLS: requireTLS}); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt(to, nil); err != nil {
		t.Fatal(err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write(data)
	resp, err := w.CloseWithResponse()
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Quit()
	m := regexp.MustCompile(`queued as ([0-9a-f]{16})`).FindStringSubmatch(resp.StatusText)
	if m == nil {
		t.Fatalf("no queue id in %q", resp.StatusText)
	}
	return m[1]
}

// TestRequireTLS: REQUIRETLS (RFC 8689) is refused outside TLS; a
// REQUIRETLS message goes to a DANE-authenticated MX that advertises
// REQUIRETLS, with REQUIRETLS on its MAIL; it bounces with 5.7.30 when the
// destination has no DANE or MTA-STS policy, or when its authenticated MX
// (a real Postfix) does not support REQUIRETLS, but goes past that Postfix
// to a second MX that does. A message with
// "TLS-Required: No" is delivered although its MX fails DANE.
func TestRequireTLS(t *testing.T) {
	peers.Require(t, "postfix", "nsd", "unbound", "ldns-signzone")
	t.Parallel()
	n := newMailNet(t)
	sinkIP, pfIP := n.host(""), n.host("")
	sinkCert, pfCert := peers.NewCert(t, "mx-rt.dane.test", "mx-bad.dane.test"), peers.NewCert(t, "mx-pf.dane.test")
	tlsa := "_" + strconv.Itoa(n.port) + "._tcp."
	dns := peers.StartDNSSEC(t, n.host(""), n.host(""),
		peers.Zone{Name: "dane.test", Signed: true, Records: []string{
			"rt MX 10 mx-rt", "mx-rt A " + sinkIP, tlsa + "mx-rt TLSA 3 1 1 " + tlsaHash(t, sinkCert, 1),
			"bad MX 10 mx-bad", "mx-bad A " + sinkIP, tlsa + "mx-bad TLSA 3 1 1 " + strings.Repeat("cd", 32),
			"pf MX 10 mx-pf", "mx-pf A " + pfIP, tlsa + "mx-pf TLSA 3 1 1 " + tlsaHash(t, pfCert, 1),
			"next MX 10 mx-pf", "next MX 20 mx-rt"}},
		peers.Zone{Name: "plain.test", Records: []string{"@ MX 10 mx", "mx A " + sinkIP}})
	sink := peers.StartSink(t, net.JoinHostPort(sinkIP, strconv.Itoa(n.port)), peers.SinkOptions{
		TLS: sinkCert.Config, Configure: func(s *smtp.Server) { s.EnableREQUIRETLS = true }})
	peers.StartPostfix(t, peers.PostfixConfig{Listen: net.JoinHostPort(pfIP, strconv.Itoa(n.port)),
		Hostname: "mx-pf.dane.test", ServerCert: pfCert, DeliverTo: peers.FreeAddr(t, n.host("")),
		RelayDomains: []string{"pf.dane.test"}})
	ip := n.host("")
	intakeCert := peers.NewCert(t, "relay.test")
	addr := peers.FreeAddr(t, ip)
	yml := n.relayYAML(ip, "delivery.resolver="+dns.Resolver, "delivery.dnssec=trust-ad", "delivery.mta_sts=false",
		fmt.Sprintf("listeners=[{address: %q, mode: smtp, tls_cert: %q, tls_key: %q}]", addr, intakeCert.CertFile, intakeCert.KeyFile))
	r := &testRelay{Relay: peers.StartRelay(t, yml), t: t, IP: ip}

	ehlo, mail := plaintextRequireTLS(t, addr)
	if strings.Contains(ehlo, "REQUIRETLS") || !strings.HasPrefix(mail, "530 5.7.10") {
		t.Errorf("without TLS: EHLO %q (want no REQUIRETLS), MAIL ... REQUIRETLS answered %q (want 530 5.7.10)", ehlo, mail)
	}
	body := func(to, extra string) []byte {
		return []byte("From: <a@src.test>\r\nTo: <" + to + ">\r\nSubject: requiretls\r\n" + extra + "\r\nbody\r\n")
	}
	ok := submitOverTLS(t, addr, "u@rt.dane.test", body("u@rt.dane.test", ""), true)
	plain := submitOverTLS(t, addr, "u@plain.test", body("u@plain.test", ""), true)
	pf := submitOverTLS(t, addr, "u@pf.dane.test", body("u@pf.dane.test", ""), true)
	next := submitOverTLS(t, addr, "u@next.dane.test", body("u@next.dane.test", ""), true)
	optional := submitOverTLS(t, addr, "v@bad.dane.test", body("v@bad.dane.test", "TLS-Required: No\r\n"), false)

	r.waitAttempts(ok, "delivered", 60*time.Second)
	r.waitAttempts(next, "delivered", 60*time.Second) // past Postfix, to the MX with REQUIRETLS
	r.waitAttempts(optional, "delivered", 60*time.Second)
	if got := lastPolicy(t, r, optional); got != "tls-required-no" {
		t.Errorf("TLS-Required: No message sent under policy %q, want tls-required-no", got)
	}
	for name, id := range map[string]string{"no policy": plain, "Postfix without REQUIRETLS": pf} {
		atts := r.waitAttempts(id, "failed", 60*time.Second)
		if a := atts[len(atts)-1]; a.str("enhanced") != "5.7.30" {
			t.Errorf("%s: last attempt %v, want failed with 5.7.30", name, a)
		}
	}
	var sawOK bool
	for _, m := range sink.Messages() {
		for _, rc := range m.Rcpts {
			switch rc {
			case "u@rt.dane.test", "u@next.dane.test":
				sawOK = sawOK || rc == "u@rt.dane.test"
				if !m.MailOptions.RequireTLS {
					t.Errorf("REQUIRETLS message was relayed without REQUIRETLS on MAIL")
				}
			case "u@plain.test":
				t.Errorf("REQUIRETLS message went to a destination without DANE or MTA-STS")
			}
		}
	}
	if !sawOK {
		t.Errorf("the sink did not get the REQUIRETLS message")
	}
}

// TestTLSPolicyConnectionReuse is the TLS downgrade through the connection
// cache, with the real binary: sts.test publishes an MTA-STS "enforce"
// policy (fetched over HTTPS) and dane.test DNSSEC-signed TLSA records
// (through NSD and a validating Unbound), and their MX, a real Postfix,
// offers no STARTTLS. A "TLS-Required: No" message to each (RFC 8689 §5)
// is delivered in plaintext over a connection the relay keeps open; the
// ordinary and REQUIRETLS messages that follow to the same MX while it is
// open, several in flight, must not ride it: each opens its own connection
// under its own policy and is deferred with reason tls, its attempt
// recorded under mta-sts or dane, and Postfix sees none of them.
func TestTLSPolicyConnectionReuse(t *testing.T) {
	peers.Require(t, "postfix", "nsd", "unbound", "ldns-signzone")
	t.Parallel()
	n := newMailNet(t)
	mxIP, policyIP := n.host(""), n.host("")
	daneCert := peers.NewCert(t, "mx.dane.test") // what the TLSA record names; Postfix has no certificate
	tlsa := "_" + strconv.Itoa(n.port) + "._tcp."
	dns := peers.StartDNSSEC(t, n.host(""), n.host(""),
		peers.Zone{Name: "dane.test", Signed: true, Records: []string{"@ MX 10 mx", "mx A " + mxIP,
			tlsa + "mx TLSA 3 1 1 " + tlsaHash(t, daneCert, 1)}},
		peers.Zone{Name: "sts.test", Records: []string{"@ MX 10 mx", "mx A " + mxIP, "mta-sts A " + policyIP,
			`_mta-sts TXT "v=STSv1; id=20261204;"`}},
		peers.Zone{Name: "relay.test"})
	stsCert := stsServer(t, policyIP, map[string]string{
		"sts.test": "version: STSv1\r\nmode: enforce\r\nmx: mx.sts.test\r\nmax_age: 86400\r\n"})
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, readFile(t, stsCert.CertFile), 0o644); err != nil {
		t.Fatal(err)
	}
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	px := peers.StartPostfix(t, peers.PostfixConfig{Listen: net.JoinHostPort(mxIP, strconv.Itoa(n.port)),
		Hostname: "mx.sts.test", DeliverTo: final.Addr, RelayDomains: []string{"sts.test", "dane.test"}})
	ip := n.host("")
	intakeCert := peers.NewCert(t, "relay.test")
	addr := peers.FreeAddr(t, ip)
	// The connection cache is kept longer than its 2 s default so that the
	// connection is surely still open when the next messages come, however
	// slow this machine is: the seam under test is that reuse.
	yml := n.relayYAML(ip, "delivery.resolver="+dns.Resolver, "delivery.dnssec=trust-ad", "delivery.mta_sts=true",
		"delivery.tls_ca_file="+caFile, "delivery.connection_cache_time=30s",
		fmt.Sprintf("listeners=[{address: %q, mode: smtp, tls_cert: %q, tls_key: %q}]", addr, intakeCert.CertFile, intakeCert.KeyFile))
	r := &testRelay{Relay: peers.StartRelay(t, yml), t: t, IP: ip}
	body := func(to, extra string) []byte {
		return []byte("From: <a@src.test>\r\nTo: <" + to + ">\r\nSubject: reuse\r\n" + extra + "\r\nbody\r\n")
	}

	optional := map[string]string{}
	for _, dom := range []string{"sts.test", "dane.test"} {
		to := "optional@" + dom
		optional[dom] = submitOverTLS(t, addr, to, body(to, "TLS-Required: No\r\n"), false)
	}
	final.WaitFor(t, 2, 60*time.Second) // both delivered, in plaintext; their connections stay open
	held := map[string]string{}         // queue id -> the policy its attempt must name
	for _, dom := range []string{"sts.test", "dane.test"} {
		policy := map[string]string{"sts.test": "mta-sts", "dane.test": "dane"}[dom]
		for _, rc := range []string{"a", "b", "c"} {
			to := rc + "@" + dom
			held[submitOverTLS(t, addr, to, body(to, ""), false)] = policy
		}
		to := "rt@" + dom
		held[submitOverTLS(t, addr, to, body(to, ""), true)] = policy
	}
	for dom, id := range optional {
		if got := lastPolicy(t, r, id); got != "tls-required-no" {
			t.Errorf("TLS-Required: No message to %s: attempt under TLS policy %q, want tls-required-no", dom, got)
		}
	}
	for id, policy := range held {
		var atts []logEntry
		relaytest.Eventually(t, 60*time.Second, "an attempt for "+id, func() error {
			if atts = r.attempts(id); len(atts) == 0 {
				return errors.New("none yet")
			}
			return nil
		})

		if a := atts[0]; a.str("outcome") != "deferred" || a.str("reason") != "tls" || a.str("enhanced") != "4.7.5" {
			t.Errorf("%s: first attempt %v, want deferred with reason tls, 4.7.5", id, a)
		}
		if got := lastPolicy(t, r, id); got != policy {
			t.Errorf("%s: attempt under TLS policy %q, want %q", id, got, policy)
		}
	}
	for _, m := range final.Messages() {
		if len(m.Rcpts) != 1 || !strings.HasPrefix(m.Rcpts[0], "optional@") {
			t.Errorf("%v was delivered in plaintext despite its domain's TLS policy", m.Rcpts)
		}
	}
	log := px.Log()
	for _, dom := range []string{"sts.test", "dane.test"} {
		for _, rc := range []string{"a", "b", "c", "rt"} {
			if strings.Contains(log, "<"+rc+"@"+dom+">") {
				t.Errorf("Postfix saw an envelope for %s@%s against its domain's TLS policy:\n%s", rc, dom, log)
			}
		}
	}
}
