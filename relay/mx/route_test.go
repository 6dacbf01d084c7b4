package mx_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/spelling"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/mx/mxtest"
)

// hopsString renders hops compactly: "host:port=addr,addr!refused".
func hopsString(hs []mx.Hop) string {
	var parts []string
	for _, h := range hs {
		s := fmt.Sprintf("%s/%d:%d=", h.Host, h.Pref, h.Port)
		for i, a := range h.Addrs {
			if i > 0 {
				s += ","
			}
			s += a.String()
		}
		for _, a := range h.Refused {
			s += "!" + a.String()
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

func routeZone(t *testing.T) *mx.DNS {
	t.Helper()
	s := &mxtest.Server{}
	s.MX("example.test", 10, "mx1.example.test").
		MX("example.test", 20, "mx2.example.test").
		A("mx1.example.test", "192.0.2.1").
		A("mx2.example.test", "192.0.2.2").
		AAAA("mx2.example.test", "2001:db8::2").
		A("nomx.test", "192.0.2.9").
		MX("private.test", 10, "lo.private.test").
		MX("private.test", 20, "lan.private.test").
		A("lo.private.test", "127.0.0.1").
		A("lan.private.test", "10.1.2.3").
		AAAA("lan.private.test", "fd00::1").
		MX("mixed.test", 10, "lan.private.test").
		MX("mixed.test", 20, "mx1.example.test").
		MX("half.test", 10, "missing.half.test").
		MX("half.test", 20, "mx1.example.test").
		MX("dead.test", 10, "missing.half.test").
		MX("dead.test", 20, "flaky.half.test").
		ServFail("flaky.half.test").
		MX("v6only.test", 10, "v6.v6only.test").
		AAAA("v6.v6only.test", "2001:db8::6").
		A("relay.internal.test", "10.0.0.25").
		NullMX("null.test")
	s.Start(t)
	return mx.NewDNS(s.Addr(), 300*time.Millisecond)
}

func TestRoute(t *testing.T) {
	d := routeZone(t)
	routes := map[string]string{
		"routed.test":  "relay.internal.test:2525",
		"literal.test": "[127.0.0.1]:2526",
		"v6lit.test":   "[::1]:2527",
		"bare.test":    "relay.internal.test",
		"broken.test":  "relay.internal.test:99999",
	}
	tests := []struct {
		name      string
		r         mx.Router
		domain    string
		kind      string
		hops      string
		errKind   classifier.DNSKind
		err       bool
		errSubstr string
	}{
		{name: "mx order and families", domain: "Example.Test.", kind: "mx",
			hops: "mx1.example.test/10:25=192.0.2.1 mx2.example.test/20:25=192.0.2.2,2001:db8::2"},
		{name: "v4 only", r: mx.Router{IPv6: false}, domain: "example.test", kind: "mx",
			hops: "mx1.example.test/10:25=192.0.2.1 mx2.example.test/20:25=192.0.2.2"},
		{name: "implicit mx", domain: "nomx.test", kind: "implicit-mx", hops: "nomx.test/0:25=192.0.2.9"},
		{name: "static route wins over mx", r: mx.Router{Routes: map[string]string{"example.test": "relay.internal.test:2525"}},
			domain: "example.test", kind: "route", hops: "relay.internal.test/0:2525=10.0.0.25"},
		{name: "route to private is allowed", domain: "routed.test", kind: "route", hops: "relay.internal.test/0:2525=10.0.0.25"},
		{name: "route ip literal", domain: "literal.test", kind: "route", hops: "127.0.0.1/0:2526=127.0.0.1"},
		{name: "route v6 literal", domain: "v6lit.test", kind: "route", hops: "::1/0:2527=::1"},
		{name: "route default port", r: mx.Router{Port: 2500}, domain: "bare.test", kind: "route", hops: "relay.internal.test/0:2500=10.0.0.25"},
		{name: "route bad port", domain: "broken.test", err: true, errKind: classifier.DNSOther, errSubstr: "bad port"},
		{name: "smarthost wins", r: mx.Router{Smarthost: "relay.internal.test:587"}, domain: "example.test", kind: "smarthost",
			hops: "relay.internal.test/0:587=10.0.0.25"},
		{name: "mx port", r: mx.Router{Port: 2525}, domain: "nomx.test", kind: "implicit-mx", hops: "nomx.test/0:2525=192.0.2.9"},
		{name: "only private", domain: "private.test", err: true, errKind: classifier.DNSOther, errSubstr: "only to private",
			kind: "mx", hops: "lo.private.test/10:25=!127.0.0.1 lan.private.test/20:25=!10.1.2.3!fd00::1"},
		{name: "allow private", r: mx.Router{AllowPrivate: true}, domain: "private.test", kind: "mx",
			hops: "lo.private.test/10:25=127.0.0.1 lan.private.test/20:25=10.1.2.3,fd00::1"},
		{name: "private dropped, public kept", domain: "mixed.test", kind: "mx",
			hops: "lan.private.test/10:25=!10.1.2.3!fd00::1 mx1.example.test/20:25=192.0.2.1"},
		{name: "unresolvable mx kept empty", domain: "half.test", kind: "mx",
			hops: "missing.half.test/10:25= mx1.example.test/20:25=192.0.2.1"},
		{name: "no mx resolves: temporary error preferred", domain: "dead.test", err: true, errKind: classifier.DNSServFail,
			kind: "mx", hops: "missing.half.test/10:25= flaky.half.test/20:25="},
		{name: "family mismatch", r: mx.Router{IPv6: false}, domain: "v6only.test", err: true, errKind: classifier.DNSOther,
			errSubstr: "no usable address"},
		{name: "null mx", domain: "null.test", err: true, errKind: classifier.DNSNullMX},
		{name: "nxdomain", domain: "nowhere.test", err: true, errKind: classifier.DNSNXDomain},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.r
			r.Resolver = d
			r.IPv4 = true
			if tt.name != "v4 only" && tt.name != "family mismatch" {
				r.IPv6 = true
			}
			if r.Routes == nil {
				r.Routes = routes
			}
			rt, err := r.Route(context.Background(), tt.domain)
			if tt.err {
				var de *classifier.DNSError
				if !errors.As(err, &de) || de.Kind != tt.errKind || !strings.Contains(err.Error(), tt.errSubstr) {
					t.Fatalf("err = %v, want DNSError kind %v containing %q", err, tt.errKind, tt.errSubstr)
				}
			} else if err != nil {
				t.Fatalf("Route: %v", err)
			}
			if tt.hops == "" {
				return
			}
			if rt.Kind != tt.kind || rt.Domain != strings.TrimSuffix(strings.ToLower(tt.domain), ".") {
				t.Errorf("kind, domain = %q, %q; want %q", rt.Kind, rt.Domain, tt.kind)
			}
			if got := hopsString(rt.Hops); got != tt.hops {
				t.Errorf("hops\n got %s\nwant %s", got, tt.hops)
			}
		})
	}
}

// fakeResolver serves MX sets from a map; every host resolves to one address.
type fakeResolver struct{ mxs map[string][]mx.MX }

func (f fakeResolver) LookupMX(_ context.Context, d string) ([]mx.MX, error) { return f.mxs[d], nil }
func (f fakeResolver) LookupAddrs(_ context.Context, h string, _, _ bool) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil
}
func (f fakeResolver) LookupPTR(context.Context, netip.Addr) ([]string, error) { return nil, nil }
func (f fakeResolver) LookupTXT(context.Context, string) ([]string, error)     { return nil, nil }
func (f fakeResolver) LookupA(context.Context, string) ([]netip.Addr, error)   { return nil, nil }

func TestRouteShufflesOnlyEqualPreferences(t *testing.T) {
	f := fakeResolver{mxs: map[string][]mx.MX{"d.test": {
		{"a", 10}, {"b", 10}, {"c", 10}, {"d", 20}, {"e", 30}, {"f", 30},
	}}}
	var runs []int
	reverse := func(n int, swap func(i, j int)) {
		runs = append(runs, n)
		for i := 0; i < n/2; i++ {
			swap(i, n-1-i)
		}
	}
	r := mx.Router{Resolver: f, IPv4: true, Shuffle: reverse}
	rt, err := r.Route(context.Background(), "d.test")
	if err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, h := range rt.Hops {
		hosts = append(hosts, h.Host)
	}
	if want := []string{"c", "b", "a", "d", "f", "e"}; !slices.Equal(hosts, want) {
		t.Errorf("hosts = %v, want %v", hosts, want)
	}
	if !slices.Equal(runs, []int{3, 2}) {
		t.Errorf("shuffle runs = %v, want [3 2]", runs)
	}
}

// countingResolver answers every MX query with n hosts of preference 10,
// each with two addresses (or with fail), and counts the queries.
type countingResolver struct {
	n, mxQueries, addrQueries int
	fail                      bool
}

func (c *countingResolver) LookupMX(_ context.Context, d string) ([]mx.MX, error) {
	c.mxQueries++
	var out []mx.MX
	for i := range c.n {
		out = append(out, mx.MX{Host: fmt.Sprintf("mx%d.%s", i, d), Pref: 10})
	}
	return out, nil
}

func (c *countingResolver) LookupAddrs(_ context.Context, h string, _, _ bool) ([]netip.Addr, error) {
	c.addrQueries++
	if c.fail {
		return nil, &classifier.DNSError{Domain: h, Kind: classifier.DNSNXDomain}
	}
	i := c.addrQueries
	return []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})}, nil
}
func (c *countingResolver) LookupPTR(context.Context, netip.Addr) ([]string, error) { return nil, nil }
func (c *countingResolver) LookupTXT(context.Context, string) ([]string, error)     { return nil, nil }
func (c *countingResolver) LookupA(context.Context, string) ([]netip.Addr, error)   { return nil, nil }

// TestRoute_MaxAddrs: a domain with 500 MX hosts costs a bounded number of
// lookups and yields at most MaxAddrs addresses (Postfix
// smtp_mx_address_limit), whether its hosts resolve or not.
func TestRoute_MaxAddrs(t *testing.T) {
	for _, tc := range []struct {
		name        string
		max         int
		fail        bool
		wantQueries int
		wantAddrs   int
	}{
		{"five addresses from three hosts", 5, false, 3, 5},
		{"one address", 1, false, 1, 1},
		{"unresolvable hosts: twice the limit looked up", 5, true, 10, 0},
		{"no limit", 0, false, 500, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &countingResolver{n: 500, fail: tc.fail}
			r := mx.Router{Resolver: c, IPv4: true, MaxAddrs: tc.max}
			rt, _ := r.Route(context.Background(), "many.test")
			n := 0
			for _, h := range rt.Hops {
				n += len(h.Addrs)
			}
			if c.addrQueries != tc.wantQueries || n != tc.wantAddrs {
				t.Errorf("%d host lookups, %d addresses; want %d, %d", c.addrQueries, n, tc.wantQueries, tc.wantAddrs)
			}
		})
	}
}

// TestRoute_Literal: an address literal is never looked up in DNS; it is
// refused permanently unless Literals is set, and then delivered to under
// the private-destination rule of MX targets.
func TestRoute_Literal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		r       mx.Router
		domain  string
		hops    string
		errKind classifier.DNSKind
		err     string
	}{
		{"refused by default", mx.Router{}, "[192.0.2.1]", "", classifier.DNSNXDomain, "address_literals"},
		{"ipv4", mx.Router{Literals: true}, "[192.0.2.1]", "192.0.2.1/0:25=192.0.2.1", 0, ""},
		{"ipv6", mx.Router{Literals: true, IPv6: true}, "[IPv6:2001:db8::1]", "2001:db8::1/0:25=2001:db8::1", 0, ""},
		{"ipv6 without an ipv6 source", mx.Router{Literals: true}, "[IPv6:2001:db8::1]", "2001:db8::1/0:25=", classifier.DNSOther, "no usable address"},
		{"private refused", mx.Router{Literals: true}, "[127.0.0.1]", "127.0.0.1/0:25=!127.0.0.1", classifier.DNSOther, "only to private"},
		{"private refused v6", mx.Router{Literals: true, IPv6: true}, "[IPv6:::1]", "::1/0:25=!::1", classifier.DNSOther, "only to private"},
		{"private allowed", mx.Router{Literals: true, AllowPrivate: true, Port: 2525}, "[10.0.0.1]", "10.0.0.1/0:2525=10.0.0.1", 0, ""},
		{"mapped v4", mx.Router{Literals: true}, "[IPv6:::ffff:192.0.2.7]", "192.0.2.7/0:25=192.0.2.7", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &countingResolver{n: 1}
			r := tc.r
			r.Resolver, r.IPv4 = c, true
			rt, err := r.Route(context.Background(), tc.domain)
			if c.mxQueries+c.addrQueries != 0 {
				t.Errorf("%d DNS queries for a literal", c.mxQueries+c.addrQueries)
			}
			var de *classifier.DNSError
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("Route: %v", err)
			case tc.err != "" && (!errors.As(err, &de) || de.Kind != tc.errKind || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("err = %v, want kind %v containing %q", err, tc.errKind, tc.err)
			}
			if got := hopsString(rt.Hops); got != tc.hops {
				t.Errorf("hops %q, want %q", got, tc.hops)
			}
			if tc.hops != "" && rt.Kind != mx.KindLiteral {
				t.Errorf("kind %q", rt.Kind)
			}
		})
	}
}

// Private holds the addresses greyrelay sends nothing to by default; an
// IPv4 address written as IPv6 is judged as IPv4.
func TestPrivate(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1", true}, {"10.1.2.3", true}, {"172.16.0.1", true}, {"192.168.1.1", true},
		{"169.254.169.254", true}, {"0.0.0.0", true}, {"224.0.0.1", true},
		{"::1", true}, {"fd00::1", true}, {"fe80::1", true}, {"::", true}, {"ff02::1", true},
		{"::ffff:10.0.0.1", true}, {"::ffff:127.0.0.1", true}, {"::ffff:0.0.0.0", true},
		{"192.0.2.1", false}, {"8.8.8.8", false}, {"2001:db8::1", false}, {"::ffff:8.8.8.8", false},
	} {
		if got := mx.Private(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("Private(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

// FuzzRouteSpellings: a route configured for a domain (keys are canonical,
// as relay/config writes them) is taken for every spelling of the domain,
// and an MX lookup is made for the A-label form only.
func FuzzRouteSpellings(f *testing.F) {
	for _, s := range []string{"example.test", "bücher.test", "xn--mnchen-3ya.test", "日本語.jp",
		"Xn--0-0000AAAAAAAAAAAAAAAA.test", // a 26-octet A-label whose U-label is 65 octets
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, d string) {
		canon, err := address.CanonicalDomain(d)
		if err != nil || strings.HasPrefix(canon, "[") {
			return
		}
		res := fakeResolver{mxs: map[string][]mx.MX{canon: {{Host: "mx." + canon, Pref: 10}}}}
		routed := mx.Router{Resolver: res, Routes: map[string]string{canon: "127.0.0.1:2526"}, AllowPrivate: true, IPv4: true}
		viaMX := mx.Router{Resolver: res, AllowPrivate: true, IPv4: true}
		for _, sp := range spelling.Of(d) {
			rt, err := routed.Route(context.Background(), sp)
			if err != nil || rt.Kind != mx.KindRoute || rt.Domain != canon {
				t.Fatalf("route for %q not taken for %q: %+v, %v", canon, sp, rt, err)
			}
			rt, err = viaMX.Route(context.Background(), sp)
			if err != nil || rt.Kind != mx.KindMX || rt.Domain != canon {
				t.Fatalf("MX of %q not found for %q: %+v, %v", canon, sp, rt, err)
			}
		}
	})
}
