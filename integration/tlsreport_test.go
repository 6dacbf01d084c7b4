package integration

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/mail"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// tlsReport is the part of an RFC 8460 §4.4 report the test looks at.
type tlsReport struct {
	Org      string `json:"organization-name"`
	ReportID string `json:"report-id"`
	Policies []struct {
		Policy struct {
			Type   string   `json:"policy-type"`
			Domain string   `json:"policy-domain"`
			String []string `json:"policy-string"`
			MX     []string `json:"mx-host"`
		} `json:"policy"`
		Summary struct {
			OK     int `json:"total-successful-session-count"`
			Failed int `json:"total-failure-session-count"`
		} `json:"summary"`
		Failures []struct {
			Result string `json:"result-type"`
			MX     string `json:"receiving-mx-hostname"`
			Count  int    `json:"failed-session-count"`
		} `json:"failure-details"`
	} `json:"policies"`
}

func decodeTLSReport(t *testing.T, gz []byte) tlsReport {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	js, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	var r tlsReport
	if err := json.Unmarshal(js, &r); err != nil {
		t.Fatalf("report: %v\n%s", err, js)
	}
	return r
}

// reportFromMail checks the RFC 8460 §5.3 structure of a mailed report and
// returns its domain and decoded report.
func reportFromMail(t *testing.T, data []byte) (string, tlsReport) {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("report mail: %v", err)
	}
	dom := msg.Header.Get("TLS-Report-Domain")
	if sub := msg.Header.Get("Subject"); !strings.HasPrefix(sub, "Report Domain: "+dom+" Submitter: relay.test Report-ID: <") {
		t.Errorf("report mail Subject %q", sub)
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/report" || params["report-type"] != "tlsrpt" {
		t.Fatalf("report mail Content-Type %q", msg.Header.Get("Content-Type"))
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err != nil {
			t.Fatalf("report mail has no application/tlsrpt+gzip part: %v", err)
		}
		if p.Header.Get("Content-Type") == "application/tlsrpt+gzip" {
			gz, err := io.ReadAll(base64.NewDecoder(base64.StdEncoding, p))
			if err != nil {
				t.Fatal(err)
			}
			return dom, decodeTLSReport(t, gz)
		}
	}
}

// TestTLSReport delivers under MTA-STS policies to a real Postfix: one
// domain whose MX certificate is valid, one whose MX certificate is not
// valid for its name, one whose MX the policy does not list, one whose
// policy host's certificate is not valid (the policy fetch fails). Four
// more domains publish policies in testing mode (RFC 8461 §5): their
// messages are delivered, and their reports name what the enforced policy
// would have refused: a certificate for another name, a self-signed
// certificate the relay does not trust (a second Postfix), an MX the
// policy does not list, an MX without STARTTLS (a third Postfix). The
// relay restarts, keeping its counts. `greyrelay tls-report send` then sends each domain
// its RFC 8460 report: by mail, through the relay's own queue, to the sink
// that is the MX of the rua's domain, and by HTTPS POST to a report server
// the relay trusts through delivery.tls_ca_file.
func TestTLSReport(t *testing.T) {
	peers.Require(t, "postfix", "swaks")
	t.Parallel()
	n := newMailNet(t)
	mxIP, policyIP, postIP := n.host(""), n.host(""), n.host("")
	mxCert := peers.NewCert(t, "mx.ok.test")
	policies := map[string]string{
		"ok.test":       "version: STSv1\r\nmode: enforce\r\nmx: mx.ok.test\r\nmax_age: 86400\r\n",
		"badcert.test":  "version: STSv1\r\nmode: enforce\r\nmx: *.badcert.test\r\nmax_age: 86400\r\n",
		"unlisted.test": "version: STSv1\r\nmode: enforce\r\nmx: other.unlisted.test\r\nmax_age: 86400\r\n",
		// Testing mode: delivered whatever the MX is like, failures reported.
		"testing.test":      "version: STSv1\r\nmode: testing\r\nmx: mx.testing.test\r\nmax_age: 86400\r\n",
		"untrusted.test":    "version: STSv1\r\nmode: testing\r\nmx: mx.untrusted.test\r\nmax_age: 86400\r\n",
		"testunlisted.test": "version: STSv1\r\nmode: testing\r\nmx: other.testunlisted.test\r\nmax_age: 86400\r\n",
		"nostarttls.test":   "version: STSv1\r\nmode: testing\r\nmx: mx.nostarttls.test\r\nmax_age: 86400\r\n",
	}
	untrustedIP, plainIP := n.host(""), n.host("")
	mxOf := map[string]string{"untrusted.test": untrustedIP, "nostarttls.test": plainIP}
	for dom := range policies {
		ip := mxIP
		if mxOf[dom] != "" {
			ip = mxOf[dom]
		}
		n.dns.MX(dom, 10, "mx."+dom).A("mx."+dom, ip).A("mta-sts."+dom, policyIP).
			TXT("_mta-sts."+dom, "v=STSv1; id=20261201;")
	}
	testingDomains := []string{"testing.test", "untrusted.test", "testunlisted.test", "nostarttls.test"}
	for _, dom := range testingDomains {
		n.dns.TXT("_smtp._tls."+dom, "v=TLSRPTv1; rua=mailto:tlsrpt@reports.test")
	}
	postPort := peers.FreePort(t, postIP)
	n.dns.A("tlsrpt.reports.test", postIP)
	n.dns.TXT("_smtp._tls.ok.test", "v=TLSRPTv1; rua=mailto:tlsrpt@reports.test,https://tlsrpt.reports.test:"+strconv.Itoa(postPort)+"/v1")
	n.dns.TXT("_smtp._tls.badcert.test", "v=TLSRPTv1; rua=mailto:tlsrpt@reports.test")
	n.dns.TXT("_smtp._tls.unlisted.test", "v=TLSRPTv1; rua=mailto:tlsrpt@reports.test")
	// A policy announced, but its host's certificate is for other names.
	n.dns.MX("nopolicy.test", 10, "mx.nopolicy.test").A("mx.nopolicy.test", mxIP).A("mta-sts.nopolicy.test", policyIP).
		TXT("_mta-sts.nopolicy.test", "v=STSv1; id=1;").TXT("_smtp._tls.nopolicy.test", "v=TLSRPTv1; rua=mailto:tlsrpt@reports.test")
	stsCert := stsServer(t, policyIP, policies)
	posts := reportServer(t, net.JoinHostPort(postIP, strconv.Itoa(postPort)))
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	ca := append(readFile(t, mxCert.CertFile), readFile(t, stsCert.CertFile)...)
	if err := os.WriteFile(caFile, append(ca, readFile(t, posts.cert.CertFile)...), 0o644); err != nil {
		t.Fatal(err)
	}
	sink := n.sink("reports.test", peers.SinkOptions{})
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	peers.StartPostfix(t, peers.PostfixConfig{Listen: net.JoinHostPort(mxIP, strconv.Itoa(n.port)),
		Hostname: "mx.ok.test", ServerCert: mxCert, DeliverTo: final.Addr,
		RelayDomains: []string{"ok.test", "badcert.test", "unlisted.test", "nopolicy.test", "testing.test", "testunlisted.test"}})
	peers.StartPostfix(t, peers.PostfixConfig{Listen: net.JoinHostPort(untrustedIP, strconv.Itoa(n.port)),
		Hostname: "mx.untrusted.test", ServerCert: peers.NewCert(t, "mx.untrusted.test"), DeliverTo: final.Addr,
		RelayDomains: []string{"untrusted.test"}})
	peers.StartPostfix(t, peers.PostfixConfig{Listen: net.JoinHostPort(plainIP, strconv.Itoa(n.port)),
		Hostname: "mx.nostarttls.test", DeliverTo: final.Addr, RelayDomains: []string{"nostarttls.test"}})
	r := n.relay("delivery.mta_sts=true", "delivery.tls_ca_file="+caFile,
		"tls_reporting.enabled=true", "tls_reporting.allow_private_rua=true", "tls_reporting.organization=Relay Test", "postmaster=pm@relay.test")

	ok := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"u@ok.test"}, Data: message("a@src.test", "u@ok.test", "ok")})
	bad := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"u@badcert.test"}, Data: message("a@src.test", "u@badcert.test", "bad")})
	unlisted := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"u@unlisted.test"}, Data: message("a@src.test", "u@unlisted.test", "unlisted")})
	nopolicy := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"u@nopolicy.test"}, Data: message("a@src.test", "u@nopolicy.test", "nopolicy")})
	var testingIDs []string
	for _, dom := range testingDomains {
		to := "u@" + dom
		testingIDs = append(testingIDs, r.send(peers.SwaksMessage{From: "a@src.test", To: []string{to}, Data: message("a@src.test", to, dom)}))
	}
	for _, id := range testingIDs {
		r.waitAttempts(id, "delivered", 60*time.Second)
		if got := lastPolicy(t, r, id); got != "mta-sts-testing" {
			t.Errorf("%s: attempt under TLS policy %q, want mta-sts-testing", id, got)
		}
	}
	r.waitAttempts(ok, "delivered", 60*time.Second)
	r.waitAttempts(nopolicy, "delivered", 60*time.Second)
	r.waitAttempts(bad, "deferred", 60*time.Second)
	r.waitAttempts(unlisted, "deferred", 60*time.Second)
	// The counts so far survive a restart (saved in the queue database).
	r.Restart(t)
	if res := r.cli("tls-report", "send"); res.Code != 0 || !strings.Contains(res.Stdout, "ok.test") {
		t.Fatalf("tls-report send: %s", res)
	}

	reports := map[string]tlsReport{}
	for _, m := range sink.WaitFor(t, 4+len(testingDomains), 60*time.Second) {
		if len(m.Rcpts) != 1 || m.Rcpts[0] != "tlsrpt@reports.test" {
			t.Errorf("report sent to %v", m.Rcpts)
		}
		dom, rep := reportFromMail(t, m.Data)
		reports[dom] = rep
	}
	check := func(dom string, rep tlsReport, wantFailure string) {
		t.Helper()
		if rep.Org != "Relay Test" || len(rep.Policies) != 1 {
			t.Fatalf("%s: report %+v", dom, rep)
		}
		p := rep.Policies[0]
		mode := "mode: enforce"
		if strings.Contains(policies[dom], "mode: testing") {
			mode = "mode: testing"
		}
		if p.Policy.Type != "sts" || p.Policy.Domain != dom || len(p.Policy.MX) != 1 || !strings.Contains(strings.Join(p.Policy.String, "\n"), mode) {
			t.Errorf("%s: policy %+v", dom, p.Policy)
		}
		switch wantFailure {
		case "":
			if p.Summary.OK < 1 || p.Summary.Failed != 0 {
				t.Errorf("%s: summary %+v, want successes only", dom, p.Summary)
			}
		default:
			if p.Summary.OK != 0 || p.Summary.Failed < 1 || len(p.Failures) != 1 ||
				p.Failures[0].Result != wantFailure || p.Failures[0].MX != "mx."+dom {
				t.Errorf("%s: summary %+v, failures %+v; want only %s at mx.%s", dom, p.Summary, p.Failures, wantFailure, dom)
			}
		}
	}
	check("ok.test", reports["ok.test"], "")
	check("badcert.test", reports["badcert.test"], "certificate-host-mismatch")
	check("unlisted.test", reports["unlisted.test"], "validation-failure") // refused before any connection
	// Testing mode: delivered, and reported as the enforced policy would
	// have judged each session (RFC 8460 §4.3.1).
	check("testing.test", reports["testing.test"], "certificate-host-mismatch")
	check("untrusted.test", reports["untrusted.test"], "certificate-not-trusted")
	check("testunlisted.test", reports["testunlisted.test"], "validation-failure")
	check("nostarttls.test", reports["nostarttls.test"], "starttls-not-supported")
	// nopolicy.test: the policy fetch failed WebPKI validation, and the
	// message went out under delivery.tls (may), over TLS.
	got := map[string]string{}
	for _, p := range reports["nopolicy.test"].Policies {
		res := ""
		for _, f := range p.Failures {
			res += f.Result
		}
		got[p.Policy.Type] = fmt.Sprintf("%d/%d %s", p.Summary.OK, p.Summary.Failed, res)
	}
	if got["sts"] != "0/1 sts-webpki-invalid" || got["no-policy-found"] != "1/0 " {
		t.Errorf("nopolicy.test: policies %v, want sts 0/1 sts-webpki-invalid and no-policy-found 1/0", got)
	}
	select {
	case p := <-posts.got:
		if p.contentType != "application/tlsrpt+gzip" {
			t.Errorf("POST Content-Type %q", p.contentType)
		}
		check("ok.test", decodeTLSReport(t, p.body), "")
	case <-time.After(30 * time.Second):
		t.Fatal("no report POSTed to the https: rua")
	}
}

type reportPost struct {
	contentType string
	body        []byte
}

type reportSrv struct {
	cert *peers.Cert
	got  chan reportPost
}

// reportServer receives TLS reports by HTTPS POST on addr.
func reportServer(t *testing.T, addr string) reportSrv {
	t.Helper()
	s := reportSrv{cert: peers.NewCert(t, "tlsrpt.reports.test"), got: make(chan reportPost, 4)}
	ln, err := tls.Listen("tcp", addr, s.cert.Config)
	if err != nil {
		t.Fatalf("report server: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		if req.Method == http.MethodPost && req.URL.Path == "/v1" {
			s.got <- reportPost{req.Header.Get("Content-Type"), b}
			return
		}
		http.NotFound(w, req)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}
