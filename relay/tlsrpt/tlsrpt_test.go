package tlsrpt

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
)

var (
	day1 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	sts  = Policy{Type: TypeSTS, Domain: "sts.test", Strings: []string{"version: STSv1", "mode: enforce", "mx: mx.sts.test", "max_age: 86400"}, MXHosts: []string{"mx.sts.test"}}
	dane = Policy{Type: TypeTLSA, Domain: "dane.test", Strings: []string{"3 1 1 abcd"}, MXHosts: []string{"mx.dane.test"}}
	sub  = Submitter{Organization: "Example Org", Contact: "postmaster@relay.test", Host: "relay.test"}
)

func TestAggregatorTake(t *testing.T) {
	a := NewAggregator()
	bad := Failure{ResultType: ResultHostMismatch, MXHost: "mx.sts.test", ReceivingIP: "127.0.0.31"}
	a.Success(sts, day1.Add(time.Hour))
	a.Success(sts, day1.Add(2*time.Hour))
	a.Failure(sts, bad, day1.Add(3*time.Hour))
	a.Failure(sts, bad, day1.Add(4*time.Hour))
	a.Success(dane, day1.Add(5*time.Hour))
	a.Success(dane, day1.Add(25*time.Hour))     // the next day
	a.Success(Policy{Type: TypeNoPolicy}, day1) // no domain: not counted

	tests := []struct {
		name    string
		now     time.Time
		all     bool
		domains []string
	}{
		{"same day, finished days only", day1.Add(6 * time.Hour), false, nil},
		{"next day: the first day", day1.Add(26 * time.Hour), false, []string{"dane.test", "sts.test"}},
		{"next day again: taken already", day1.Add(27 * time.Hour), false, nil},
		{"all: today too", day1.Add(28 * time.Hour), true, []string{"dane.test"}},
	}
	var first []Day
	for _, tc := range tests {
		days := a.Take(tc.now, tc.all)
		var got []string
		for _, d := range days {
			got = append(got, d.Domain)
		}
		if !reflect.DeepEqual(got, tc.domains) {
			t.Errorf("%s: Take = %v, want %v", tc.name, got, tc.domains)
		}
		if first == nil && len(days) > 0 {
			first = days
		}
		if tc.all && len(days) == 1 && !days[0].End.Equal(tc.now) {
			t.Errorf("%s: early report ends %v, want %v", tc.name, days[0].End, tc.now)
		}
	}
	if len(first) != 2 {
		t.Fatalf("first day: %d domains", len(first))
	}
	c := first[1].Counts[0]
	if c.Success != 2 || c.Failed() != 2 || c.Failures[bad] != 2 || !first[1].End.Equal(day1.Add(24*time.Hour)) {
		t.Errorf("sts.test counts = %+v, end %v; want 2 successes, 2 failures of %v, end of day", c, first[1].End, bad)
	}
}

func gunzipReport(t *testing.T, gz []byte) map[string]any {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("gzip: %v", err)
	}
	js, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gzip: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		t.Fatalf("json: %v\n%s", err, js)
	}
	return m
}

// The report has the fields and names RFC 8460 §4.4 requires.
func TestReportJSON(t *testing.T) {
	a := NewAggregator()
	a.Success(sts, day1.Add(time.Hour))
	a.Failure(sts, Failure{ResultType: ResultNotTrusted, MXHost: "mx.sts.test", ReceivingIP: "127.0.0.31", AdditionalInfo: "x509"}, day1.Add(2*time.Hour))
	days := a.Take(day1.Add(25*time.Hour), false)
	gz, err := BuildReport(sub, days[0]).Gzip()
	if err != nil {
		t.Fatal(err)
	}
	m := gunzipReport(t, gz)
	want := map[string]any{
		"organization-name": "Example Org",
		"date-range":        map[string]any{"start-datetime": "2026-12-01T00:00:00Z", "end-datetime": "2026-12-02T00:00:00Z"},
		"contact-info":      "postmaster@relay.test",
		"report-id":         fmt.Sprintf("sts.test.%d.%d@relay.test", day1.Unix(), day1.Add(24*time.Hour).Unix()),
		"policies": []any{map[string]any{
			"policy": map[string]any{"policy-type": "sts", "policy-domain": "sts.test",
				"policy-string": []any{"version: STSv1", "mode: enforce", "mx: mx.sts.test", "max_age: 86400"},
				"mx-host":       []any{"mx.sts.test"}},
			"summary": map[string]any{"total-successful-session-count": 1.0, "total-failure-session-count": 1.0},
			"failure-details": []any{map[string]any{"result-type": "certificate-not-trusted",
				"receiving-mx-hostname": "mx.sts.test", "receiving-ip": "127.0.0.31", "failed-session-count": 1.0,
				"failure-reason-code": "x509"}},
		}},
	}
	if !reflect.DeepEqual(m, want) {
		got, _ := json.MarshalIndent(m, "", " ")
		t.Errorf("report =\n%s", got)
	}
}

func TestResultType(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{&smtpvocab.TLSError{Err: fmt.Errorf("x: %w", tlspolicy.ErrDANEMismatch)}, ResultTLSAInvalid},
		{&tls.CertificateVerificationError{Err: x509.HostnameError{Host: "a"}}, ResultHostMismatch},
		{&tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Reason: x509.Expired}}, ResultExpired},
		{&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, ResultNotTrusted},
		{&smtpvocab.TLSError{Err: fmt.Errorf("%w, but", smtpclient.ErrNoSTARTTLS)}, ResultSTARTTLSNotSupported},
		{errors.New("handshake failure"), ResultValidationFailure},
	}
	for _, tc := range tests {
		if got := ResultType(TypeSTS, tc.err); got != tc.want {
			t.Errorf("ResultType(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

type fakeTXT map[string][]string

func (f fakeTXT) LookupTXT(_ context.Context, name string) ([]string, error) {
	if v, ok := f[name]; ok {
		return v, nil
	}
	return nil, &classifier.DNSError{Domain: name, Kind: classifier.DNSNXDomain, Err: errors.New("NXDOMAIN")}
}

type fakeQueue struct{ mails []Mail }

func (f *fakeQueue) EnqueueReport(m Mail) error {
	f.mails = append(f.mails, m)
	return nil
}

// A mailto: rua gets a multipart/report message as RFC 8460 §5.3 says;
// a domain without a record gets nothing.
func TestSendMail(t *testing.T) {
	a := NewAggregator()
	a.Failure(dane, Failure{ResultType: ResultTLSAInvalid, MXHost: "mx.dane.test"}, day1.Add(time.Hour))
	a.Success(sts, day1.Add(time.Hour))
	q := &fakeQueue{}
	s := &Sender{Submitter: sub, From: "tlsrpt@relay.test", Queue: q, Rand: strings.NewReader(strings.Repeat("r", 64)),
		TXT: fakeTXT{"_smtp._tls.dane.test": {"v=spf1 -all", "v=TLSRPTv1; rua=mailto:reports@sink.test"}}}
	now := day1.Add(25 * time.Hour)
	res, _ := s.Deliver(context.Background(), a.Take(now, false), nil, now)
	if len(res) != 2 || len(res[0].Sent) != 1 || len(res[1].Errors) != 1 || len(q.mails) != 1 {
		t.Fatalf("Send = %+v, %d mails; want one sent to dane.test, sts.test without record", res, len(q.mails))
	}
	m := q.mails[0]
	if m.From != "tlsrpt@relay.test" || !reflect.DeepEqual(m.To, []string{"reports@sink.test"}) {
		t.Errorf("envelope %s -> %v", m.From, m.To)
	}
	checkReportMail(t, m.Body, "dane.test", "relay.test")
}

// checkReportMail parses a report message and returns its decoded report.
func checkReportMail(t *testing.T, body []byte, domain, submitter string) map[string]any {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("mail: %v", err)
	}
	h := msg.Header
	if h.Get("TLS-Report-Domain") != domain || h.Get("TLS-Report-Submitter") != submitter {
		t.Errorf("TLS-Report headers: %q %q", h.Get("TLS-Report-Domain"), h.Get("TLS-Report-Submitter"))
	}
	want := fmt.Sprintf("Report Domain: %s Submitter: %s Report-ID: <", domain, submitter)
	if !strings.HasPrefix(h.Get("Subject"), want) || !strings.HasSuffix(h.Get("Subject"), ">") {
		t.Errorf("Subject %q, want %q...>", h.Get("Subject"), want)
	}
	mt, params, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil || mt != "multipart/report" || params["report-type"] != "tlsrpt" {
		t.Fatalf("Content-Type %q", h.Get("Content-Type"))
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	var types []string
	var report map[string]any
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("multipart: %v", err)
		}
		ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		types = append(types, ct)
		if ct == "application/tlsrpt+gzip" {
			gz, err := io.ReadAll(base64.NewDecoder(base64.StdEncoding, p))
			if err != nil {
				t.Fatalf("base64: %v", err)
			}
			report = gunzipReport(t, gz)
		}
	}
	if !reflect.DeepEqual(types, []string{"text/plain", "application/tlsrpt+gzip"}) || report == nil {
		t.Fatalf("parts %v", types)
	}
	pol := report["policies"].([]any)[0].(map[string]any)["policy"].(map[string]any)
	if pol["policy-domain"] != domain {
		t.Errorf("policy-domain %v, want %s", pol["policy-domain"], domain)
	}
	if !strings.HasSuffix(h.Get("Subject"), "<"+report["report-id"].(string)+">") {
		t.Errorf("Subject %q does not name report-id %v", h.Get("Subject"), report["report-id"])
	}
	return report
}

// An https: rua gets the gzip report by POST (RFC 8460 §5.2), over TLS
// verified with the given roots.
func TestSendHTTPS(t *testing.T) {
	type got struct {
		ct     string
		report map[string]any
	}
	posts := make(chan got, 2)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		zr, err := gzip.NewReader(bytes.NewReader(b))
		var m map[string]any
		if err == nil {
			js, _ := io.ReadAll(zr)
			_ = json.Unmarshal(js, &m)
		}
		posts <- got{r.Header.Get("Content-Type"), m}
		if r.Method != http.MethodPost || r.URL.Path != "/tlsrpt" {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	a := NewAggregator()
	a.Success(sts, day1.Add(time.Hour))
	s := &Sender{Submitter: sub, HTTP: srv.Client(), Rand: strings.NewReader(""),
		TXT: fakeTXT{"_smtp._tls.sts.test": {"v=TLSRPTv1;rua=" + srv.URL + "/tlsrpt"}}}
	now := day1.Add(25 * time.Hour)
	res, _ := s.Deliver(context.Background(), a.Take(now, false), nil, now)
	if len(res) != 1 || len(res[0].Sent) != 1 || len(res[0].Errors) != 0 {
		t.Fatalf("Send = %+v", res)
	}
	p := <-posts
	sum := p.report["policies"].([]any)[0].(map[string]any)["summary"].(map[string]any)
	if p.ct != "application/tlsrpt+gzip" || sum["total-successful-session-count"] != 1.0 {
		t.Errorf("POST Content-Type %q, summary %v", p.ct, sum)
	}

	// A server the roots do not trust gets nothing.
	a.Success(sts, day1.Add(time.Hour))
	s.HTTP = &http.Client{Timeout: 5 * time.Second}
	res, _ = s.Deliver(context.Background(), a.Take(now, false), nil, now)
	if len(res) != 1 || len(res[0].Sent) != 0 || len(res[0].Errors) != 1 {
		t.Errorf("untrusted server: Send = %+v, want an error", res)
	}
}

func TestSTSResultType(t *testing.T) {
	tests := []struct {
		err  *tlspolicy.FetchError
		want string
	}{
		{&tlspolicy.FetchError{Err: errors.New("mta-sts policy: no mx"), Invalid: true}, ResultSTSPolicyInvalid},
		{&tlspolicy.FetchError{Err: fmt.Errorf("mta-sts fetch: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})}, ResultSTSWebPKIInvalid},
		{&tlspolicy.FetchError{Err: errors.New("mta-sts fetch: HTTP 404")}, ResultSTSPolicyFetch},
	}
	for _, tc := range tests {
		if got := STSResultType(tc.err); got != tc.want {
			t.Errorf("STSResultType(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}
