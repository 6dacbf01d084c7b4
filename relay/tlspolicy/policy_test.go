package tlspolicy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/internal/spelling"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/mx/mxtest"
	"github.com/greyrelay/greyrelay/relay/relaytest"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
)

// stsEnv is a policy server for example.com (httptest's certificate is
// valid for *.example.com), a DNS server, and a queue as the cache.
type stsEnv struct {
	srv     *httptest.Server
	fetches atomic.Int32
	policy  atomic.Value // string
	roots   *x509.CertPool
	port    int
	q       *queue.Queue
}

func newSTSEnv(t *testing.T) *stsEnv {
	e := &stsEnv{}
	e.policy.Store("version: STSv1\nmode: enforce\nmx: mx.example.com\nmax_age: 3600\n")
	e.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.fetches.Add(1)
		if r.Host != "mta-sts.example.com" || r.URL.Path != "/.well-known/mta-sts.txt" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(e.policy.Load().(string)))
	}))
	t.Cleanup(e.srv.Close)
	e.roots = x509.NewCertPool()
	e.roots.AddCert(e.srv.Certificate())
	u, _ := url.Parse(e.srv.URL)
	e.port, _ = strconv.Atoi(u.Port())
	q, err := queue.Open(filepath.Join(t.TempDir(), "q.db"), queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	e.q = q
	return e
}

// checker is a Checker whose DNS says id for example.com.
func (e *stsEnv) checker(t *testing.T, id string, now *time.Time) *Checker {
	dns := &mxtest.Server{}
	dns.Start(t)
	dns.A("mta-sts.example.com", "127.0.0.1")
	if id != "" {
		dns.TXT("_mta-sts.example.com", "v=STSv1; id="+id)
	}
	r := mx.NewDNS(dns.Addr(), time.Second)
	c, err := New(Options{STS: true, TXT: r, Cache: e.q.Store(StoreName), Roots: e.roots, Now: func() time.Time { return *now },
		Fetcher: NewFetcher(r, e.roots, e.port, 5*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSTSPolicyCache follows RFC 8461 §5.1: a policy is fetched once per
// TXT id and kept in the queue database until max_age; a changed id
// fetches again; a failed fetch or a vanished TXT record keeps the cached
// policy while it is valid; an expired policy is dropped.
func TestSTSPolicyCache(t *testing.T) {
	e := newSTSEnv(t)
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ctx := context.Background()
	step := func(name string, c *Checker, wantMode string, wantFetches int32) {
		t.Helper()
		p, err := c.STSPolicy(ctx, "example.com")
		mode := ""
		if p != nil {
			mode = p.Mode
		}
		if mode != wantMode || e.fetches.Load() != wantFetches {
			t.Errorf("%s: mode %q (err %v), %d fetches; want %q, %d", name, mode, err, e.fetches.Load(), wantMode, wantFetches)
		}
	}
	id1 := e.checker(t, "one", &now)
	step("first lookup fetches", id1, ModeEnforce, 1)
	step("same id uses the cache", id1, ModeEnforce, 1)
	e.policy.Store("version: STSv1\nmode: testing\nmx: mx.example.com\nmax_age: 3600\n")
	step("new id fetches again", e.checker(t, "two", &now), ModeTesting, 2)
	e.srv.Close()
	step("fetch failure keeps the cached policy", e.checker(t, "three", &now), ModeTesting, 2)
	none := e.checker(t, "", &now)
	step("no TXT record keeps the cached policy", none, ModeTesting, 2)
	now = now.Add(2 * time.Hour)
	step("expired without TXT: no policy", none, "", 2)
	if err := none.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if d, _ := e.q.Store(StoreName).Keys(); len(d) != 0 {
		t.Errorf("Refresh kept expired policies of %v", d)
	}
}

// TestSTSFetchRefusesRedirectsAndOtherTypes: RFC 8461 §3.3.
func TestSTSFetchRefusesRedirectsAndOtherTypes(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Host {
		case "mta-sts.redirect.example.com":
			http.Redirect(w, r, "https://mta-sts.example.com/.well-known/mta-sts.txt", http.StatusFound)
		case "mta-sts.html.example.com":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte("version: STSv1\nmode: enforce\nmx: a.example.com\nmax_age: 1\n"))
		case "mta-sts.big.example.com":
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write(make([]byte, maxPolicySize+1))
		default: // where the redirect leads: a valid policy
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("version: STSv1\nmode: enforce\nmx: a.example.com\nmax_age: 1\n"))
		}
	}))
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	dns := &mxtest.Server{}
	dns.Start(t)
	for _, h := range []string{"mta-sts.redirect", "mta-sts.html", "mta-sts.big", "mta-sts"} {
		dns.A(h+".example.com", "127.0.0.1")
	}
	f := NewFetcher(mx.NewDNS(dns.Addr(), time.Second), roots, port, 5*time.Second)
	for _, h := range []string{"redirect", "html", "big"} {
		if p, err := f.Fetch(context.Background(), h+".example.com"); err == nil {
			t.Errorf("%s: fetched %+v", h, p)
		}
	}
}

// TestDecideTesting: under an MTA-STS policy in testing mode no host is
// refused and delivery.tls applies, but each host's rule verifies a session
// as the enforced policy would (RFC 8461 §5), so that its failures can be
// reported: an unlisted MX, no STARTTLS, a certificate from an unknown
// authority or for another name.
func TestDecideTesting(t *testing.T) {
	e := newSTSEnv(t)
	e.policy.Store("version: STSv1\nmode: testing\nmx: mx.example.com\nmax_age: 3600\n")
	now := time.Now() // the certificates made below are valid from now on
	dec := e.checker(t, "one", &now).Decide(context.Background(), "example.com", []string{"MX.example.com.", "other.test"})
	leaf := func(c tls.Certificate, err error) []*x509.Certificate {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{x}
	}
	selfSigned := func(name string) []*x509.Certificate {
		c, _, err := relaytest.SelfSigned(name)
		return leaf(c, err)
	}
	trusted := []*x509.Certificate{e.srv.Certificate()} // valid for *.example.com
	var (
		hostErr x509.HostnameError
		authErr x509.UnknownAuthorityError
	)
	tests := []struct {
		name  string
		host  string
		chain []*x509.Certificate // nil: a session in plaintext
		ok    func(error) bool
	}{
		{"valid", "mx.example.com", trusted, func(err error) bool { return err == nil }},
		{"plaintext", "mx.example.com", nil, func(err error) bool { return errors.Is(err, smtpclient.ErrNoSTARTTLS) }},
		{"self-signed", "mx.example.com", selfSigned("mx.example.com"), func(err error) bool { return errors.As(err, &authErr) }},
		{"other name", "mx.example.com", selfSigned("wrong.example.com"), func(err error) bool { return errors.As(err, &hostErr) }},
		{"unlisted", "other.test", trusted, func(err error) bool {
			return err != nil && !errors.As(err, &hostErr) && !errors.As(err, &authErr) && strings.Contains(err.Error(), "not listed")
		}},
	}
	for _, tc := range tests {
		r := dec.Rule(tc.host)
		if r.Label != LabelSTSTesting || r.Refuse != nil || r.Mode != "" || r.Authenticated || r.Check == nil {
			t.Fatalf("%s: rule %+v, want mta-sts-testing, not refused, delivery.tls, with a check", tc.host, r)
		}
		var cs *tls.ConnectionState
		if tc.chain != nil {
			cs = &tls.ConnectionState{PeerCertificates: tc.chain}
		}
		if err := r.Check(cs); !tc.ok(err) {
			t.Errorf("%s: check says %v", tc.name, err)
		}
	}
}

// TestDecide_CanonicalDomain: the decision (its policy lookups, the cache
// key and the TLS report's policy-domain) is made for the canonical
// domain, whatever spelling the recipient used; every spelling of an
// MTA-STS domain gets its enforced policy.
func TestDecide_CanonicalDomain(t *testing.T) {
	e := newSTSEnv(t)
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c := e.checker(t, "one", &now)
	for _, sp := range spelling.Of("example.com") {
		d := c.Decide(context.Background(), sp, []string{"MX.example.com."})
		if d.Domain != "example.com" || d.Rule("mx.example.com").Label != LabelSTS {
			t.Errorf("%q: domain %q, rule %q", sp, d.Domain, d.Rule("mx.example.com").Label)
		}
	}
	plain, err := New(Options{Now: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range spelling.Of("bücher.test") {
		if d := plain.Decide(context.Background(), sp, nil); d.Domain != "xn--bcher-kva.test" {
			t.Errorf("%q: decided for %q", sp, d.Domain)
		}
	}
}

// A relay upgraded from a greyrelay whose queue kept MTA-STS policies
// itself still has them: queue/testdata/stores.db was written by that
// version (see the queue's TestStoresReadOldBuckets) with a cached
// enforce policy for example.test. With the TXT id unchanged, the cached
// policy holds and nothing is fetched (the fetch would fail: no address
// for mta-sts.example.test).
func TestSTSPolicyCacheFromOldQueue(t *testing.T) {
	b, err := os.ReadFile("../../queue/testdata/stores.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "q.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	q, err := queue.Open(path, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	dns := &mxtest.Server{}
	dns.Start(t)
	dns.TXT("_mta-sts.example.test", "v=STSv1; id=20261201T000000")
	r := mx.NewDNS(dns.Addr(), time.Second)
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC) // an hour after the fetch
	c, err := New(Options{STS: true, TXT: r, Cache: q.Store(StoreName), Now: func() time.Time { return now },
		Fetcher: NewFetcher(r, x509.NewCertPool(), 443, time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.STSPolicy(context.Background(), "example.test")
	if err != nil {
		t.Fatalf("the cached policy of the old queue: %v", err)
	}
	if p.Mode != ModeEnforce || len(p.MX) != 1 || p.MX[0] != "mx.example.test" || p.MaxAge != 604800 {
		t.Errorf("cached policy %+v, want enforce for mx.example.test, max_age 604800", p)
	}
}
