package mx_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/mx/mxtest"
)

// zone starts a test DNS server with a small zone used by most tests.
// Addresses are from documentation ranges (RFC 5737, RFC 3849), never dialled.
func zone(t *testing.T) (*mxtest.Server, *mx.DNS) {
	t.Helper()
	s := &mxtest.Server{}
	s.MX("example.test", 20, "MX2.Example.Test.").
		MX("example.test", 10, "mx1.example.test").
		A("mx1.example.test", "192.0.2.1").
		A("mx2.example.test", "192.0.2.2").
		AAAA("mx2.example.test", "2001:db8::2").
		NullMX("null.test").
		NXDomain("gone.test").
		ServFail("broken.test").
		A("nomx.test", "192.0.2.9").
		Truncate("big.test").
		MX("big.test", 5, "mx.big.test").
		CNAME("alias.test", "mx1.example.test").
		PTR("192.0.2.1", "mx1.example.test").
		PTR("2001:db8::2", "MX2.example.test").
		TXT("example.test", "v=spf1 -all").
		TXT("long.test", strings.Repeat("a", 300)).
		A("2.0.0.127.zen.test", "127.0.0.2").
		Drop("slow.test")
	s.Start(t)
	d := mx.NewDNS(s.Addr(), 300*time.Millisecond)
	d.Retries = 0
	return s, d
}

func dnsKind(t *testing.T, err error) classifier.DNSKind {
	t.Helper()
	var de *classifier.DNSError
	if !errors.As(err, &de) {
		t.Fatalf("error %v (%T) is not a *classifier.DNSError", err, err)
	}
	return de.Kind
}

func TestLookupMX(t *testing.T) {
	_, d := zone(t)
	ctx := context.Background()
	tests := []struct {
		domain string
		want   []mx.MX
		kind   classifier.DNSKind
		err    bool
	}{
		{domain: "example.test", want: []mx.MX{{"mx1.example.test", 10}, {"mx2.example.test", 20}}},
		{domain: "EXAMPLE.TEST.", want: []mx.MX{{"mx1.example.test", 10}, {"mx2.example.test", 20}}},
		{domain: "nomx.test", want: nil}, // NODATA: implicit MX is the Router's job
		{domain: "big.test", want: []mx.MX{{"mx.big.test", 5}}},
		{domain: "null.test", err: true, kind: classifier.DNSNullMX},
		{domain: "gone.test", err: true, kind: classifier.DNSNXDomain},
		{domain: "unknown.test", err: true, kind: classifier.DNSNXDomain},
		{domain: "broken.test", err: true, kind: classifier.DNSServFail},
		{domain: "slow.test", err: true, kind: classifier.DNSTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.domain, func(t *testing.T) {
			got, err := d.LookupMX(ctx, tt.domain)
			if tt.err {
				if err == nil {
					t.Fatalf("LookupMX = %v, want error", got)
				}
				if k := dnsKind(t, err); k != tt.kind {
					t.Fatalf("kind = %v, want %v (%v)", k, tt.kind, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("LookupMX = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestLookupAddrs(t *testing.T) {
	_, d := zone(t)
	ctx := context.Background()
	a := netip.MustParseAddr
	tests := []struct {
		host   string
		v4, v6 bool
		want   []netip.Addr
	}{
		{"mx2.example.test", true, true, []netip.Addr{a("192.0.2.2"), a("2001:db8::2")}},
		{"mx2.example.test", true, false, []netip.Addr{a("192.0.2.2")}},
		{"mx2.example.test", false, true, []netip.Addr{a("2001:db8::2")}},
		{"mx1.example.test", false, true, nil},                   // NODATA
		{"alias.test", true, true, []netip.Addr{a("192.0.2.1")}}, // CNAME followed
		{"mx.big.test", true, true, nil},                         // no address records at all
	}
	for _, tt := range tests {
		got, err := d.LookupAddrs(ctx, tt.host, tt.v4, tt.v6)
		if tt.host == "mx.big.test" {
			if dnsKind(t, err) != classifier.DNSNXDomain {
				t.Errorf("%s: err = %v, want NXDOMAIN", tt.host, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("LookupAddrs(%s, %v, %v) = %v, %v; want %v", tt.host, tt.v4, tt.v6, got, err, tt.want)
		}
	}
}

func TestLookupPTRTXTA(t *testing.T) {
	_, d := zone(t)
	ctx := context.Background()
	for ip, want := range map[string]string{"192.0.2.1": "mx1.example.test", "2001:db8::2": "mx2.example.test"} {
		got, err := d.LookupPTR(ctx, netip.MustParseAddr(ip))
		if err != nil || !slices.Equal(got, []string{want}) {
			t.Errorf("LookupPTR(%s) = %v, %v; want %s", ip, got, err, want)
		}
	}
	if _, err := d.LookupPTR(ctx, netip.MustParseAddr("192.0.2.77")); dnsKind(t, err) != classifier.DNSNXDomain {
		t.Errorf("LookupPTR(unknown) err = %v, want NXDOMAIN", err)
	}
	txt, err := d.LookupTXT(ctx, "example.test")
	if err != nil || !slices.Equal(txt, []string{"v=spf1 -all"}) {
		t.Errorf("LookupTXT = %q, %v", txt, err)
	}
	txt, err = d.LookupTXT(ctx, "long.test")
	if err != nil || !slices.Equal(txt, []string{strings.Repeat("a", 300)}) {
		t.Errorf("LookupTXT(long) strings not joined: %q, %v", txt, err)
	}
	as, err := d.LookupA(ctx, "2.0.0.127.zen.test")
	if err != nil || !slices.Equal(as, []netip.Addr{netip.MustParseAddr("127.0.0.2")}) {
		t.Errorf("LookupA = %v, %v", as, err)
	}
}

func TestTruncatedAnswerUsesTCP(t *testing.T) {
	// The UDP answer for big.test is empty with TC set; only the TCP retry
	// can produce the record.
	_, d := zone(t)
	got, err := d.LookupMX(context.Background(), "big.test")
	if err != nil || len(got) != 1 || got[0].Host != "mx.big.test" {
		t.Fatalf("LookupMX(big.test) = %v, %v", got, err)
	}
}

func TestTimeoutRetriesAndContext(t *testing.T) {
	_, d := zone(t)
	d.Retries, d.Timeout = 2, 100*time.Millisecond
	start := time.Now()
	_, err := d.LookupMX(context.Background(), "slow.test")
	if dnsKind(t, err) != classifier.DNSTimeout {
		t.Fatalf("err = %v, want timeout", err)
	}
	if el := time.Since(start); el < 3*d.Timeout {
		t.Errorf("returned after %v; want 3 attempts of %v", el, d.Timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := d.LookupMX(ctx, "slow.test"); dnsKind(t, err) != classifier.DNSTimeout {
		t.Fatalf("err = %v, want timeout from context", err)
	}
}

func TestSystemServer(t *testing.T) {
	dir := t.TempDir()
	tests := []struct{ conf, want string }{
		{"# c\nsearch x\nnameserver 127.0.0.53\nnameserver 192.0.2.1\n", "127.0.0.53:53"},
		{"nameserver ::1\n", "[::1]:53"},
		{"search x\n", ""},
	}
	for i, tt := range tests {
		p := filepath.Join(dir, "resolv"+string(rune('a'+i)))
		if err := os.WriteFile(p, []byte(tt.conf), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := mx.SystemServer(p)
		if tt.want == "" {
			if err == nil {
				t.Errorf("SystemServer(%q) = %q, want error", tt.conf, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("SystemServer(%q) = %q, %v; want %q", tt.conf, got, err, tt.want)
		}
	}
	if _, err := mx.SystemServer(filepath.Join(dir, "missing")); err == nil {
		t.Error("SystemServer(missing) succeeded")
	}
}

// TestOversizedUDPAnswerUsesTCP: a server that sends an answer larger than
// our EDNS0 buffer over UDP without setting TC (500 MX records, about
// 14 KB) leaves a datagram cut short that does not parse; the query is
// repeated over TCP instead of failing at every retry. The bounded route
// over the 500 hosts is TestRoute_MaxAddrs's business.
func TestOversizedUDPAnswerUsesTCP(t *testing.T) {
	s := &mxtest.Server{}
	for i := range 500 {
		s.MX("many.test", uint16(i), fmt.Sprintf("mx%03d.many.test", i))
	}
	s.Start(t)
	d := mx.NewDNS(s.Addr(), 300*time.Millisecond)
	got, err := d.LookupMX(context.Background(), "many.test")
	if err != nil || len(got) != 500 || got[0].Host != "mx000.many.test" {
		t.Fatalf("LookupMX(many.test) = %d records, %v", len(got), err)
	}
}

// TestCancelEndsQuery: a cancelled context ends a query to a resolver
// that does not answer at once, not at the query's timeout: a delivery
// worker waiting for it held the relay's stop on SIGTERM for up to the
// 10 s the relay gives a query.
func TestCancelEndsQuery(t *testing.T) {
	_, d := zone(t)
	d.Retries, d.Timeout = 1, 30*time.Second
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := d.LookupMX(ctx, "slow.test")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want the cancellation", err)
		}
		dnsKind(t, err)
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("returned %v after the cancellation", el)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the query went on 10 s after its context was cancelled")
	}
}
