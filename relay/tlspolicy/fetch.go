package tlspolicy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"
)

// maxPolicySize bounds a fetched policy body (RFC 8461 §3.3 asks senders
// to bound it; 64 KiB is what Postfix's and mox's fetchers accept).
const maxPolicySize = 64 << 10

// AddrResolver finds the addresses of the policy host (mx.Resolver fits).
type AddrResolver interface {
	LookupAddrs(ctx context.Context, host string, v4, v6 bool) ([]netip.Addr, error)
}

// Roots returns the system roots plus the PEM certificates of caFile (if
// not empty): the WebPKI roots for policy fetches and MTA-STS MX hosts.
func Roots(caFile string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if caFile == "" {
		return pool, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls_ca_file: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls_ca_file %s: no PEM certificate", caFile)
	}
	return pool, nil
}

// Fetcher fetches MTA-STS policies over HTTPS (RFC 8461 §3.3).
type Fetcher struct {
	client *http.Client
}

// NewFetcher returns a Fetcher that resolves the policy host with r,
// verifies its certificate against roots and gives up after timeout. It
// uses no proxy and follows no redirect (§3.3: "MUST NOT follow
// redirects").
func NewFetcher(r AddrResolver, roots *x509.CertPool, port int, timeout time.Duration) *Fetcher {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		addrs, err := r.LookupAddrs(ctx, host, true, true)
		if err != nil {
			return nil, err
		}
		var d net.Dialer
		err = errors.New("no address")
		for _, a := range addrs {
			var c net.Conn
			if c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String()); err == nil {
				return c, nil
			}
		}
		return nil, fmt.Errorf("policy host %s: %w", host, err)
	}
	tr := &http.Transport{DialContext: dial, Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: roots},
		DisableKeepAlives: true, ResponseHeaderTimeout: timeout, MaxResponseHeaderBytes: maxPolicySize}
	return &Fetcher{client: &http.Client{Transport: tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errors.New("mta-sts: redirects are not followed (RFC 8461 §3.3)")
		}}}
}

// FetchError is why Fetch found no policy: the fetch failed, or (Invalid)
// the policy it got does not parse. TLS reports tell these apart
// (RFC 8460 §4.3.2.2).
type FetchError struct {
	Err     error
	Invalid bool
}

func (e *FetchError) Error() string { return e.Err.Error() }

// Unwrap returns the cause.
func (e *FetchError) Unwrap() error { return e.Err }

// Fetch fetches and parses the policy of domain; its errors are
// *FetchError.
func (f *Fetcher) Fetch(ctx context.Context, domain string) (STSPolicy, error) {
	p, err := f.fetch(ctx, domain)
	if err != nil {
		var inv *invalidPolicy
		return p, &FetchError{Err: err, Invalid: errors.As(err, &inv)}
	}
	return p, nil
}

// invalidPolicy marks a policy that was fetched but does not parse.
type invalidPolicy struct{ error }

func (e invalidPolicy) Unwrap() error { return e.error }

func (f *Fetcher) fetch(ctx context.Context, domain string) (STSPolicy, error) {
	url := "https://mta-sts." + domain + "/.well-known/mta-sts.txt"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return STSPolicy{}, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return STSPolicy{}, fmt.Errorf("mta-sts fetch: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return STSPolicy{}, fmt.Errorf("mta-sts fetch %s: HTTP %d", url, resp.StatusCode)
	}
	// §3.3: the policy is text/plain.
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "text/plain" {
		return STSPolicy{}, fmt.Errorf("mta-sts fetch %s: media type %q, not text/plain", url, resp.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPolicySize+1))
	if err != nil {
		return STSPolicy{}, fmt.Errorf("mta-sts fetch %s: %w", url, err)
	}
	if len(body) > maxPolicySize {
		return STSPolicy{}, fmt.Errorf("mta-sts fetch %s: policy larger than %d bytes", url, maxPolicySize)
	}
	p, err := ParseSTSPolicy(string(body))
	if err != nil {
		return p, &invalidPolicy{err}
	}
	return p, nil
}
