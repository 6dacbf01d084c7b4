package tlsrpt

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type fakeAddrs map[string][]netip.Addr

func (f fakeAddrs) LookupAddrs(_ context.Context, host string, _, _ bool) ([]netip.Addr, error) {
	return f[host], nil
}

// An https: rua whose host has only private addresses (here loopback,
// written as an address or behind a name) gets no POST unless
// allow_private_rua is set, and is not tried again: the Result says why.
func TestDialerPrivateRUA(t *testing.T) {
	var posts atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { posts.Add(1) }))
	defer srv.Close()
	u, _ := url.Parse(srv.URL) // https://127.0.0.1:PORT
	named := "https://reports.sts.test:" + u.Port() + "/tlsrpt"
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	for _, tc := range []struct {
		name         string
		rua          string
		addrs        []netip.Addr
		allowPrivate bool
		wantSent     bool
	}{
		{"address, refused", srv.URL + "/tlsrpt", nil, false, false},
		{"name, refused", named, loop, false, false},
		{"mapped address, refused", named, []netip.Addr{netip.MustParseAddr("::ffff:127.0.0.1")}, false, false},
		{"address, allowed", srv.URL + "/tlsrpt", nil, true, true},
		{"name, allowed", named, loop, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			posts.Store(0)
			tr := srv.Client().Transport.(*http.Transport).Clone()
			tr.TLSClientConfig.ServerName = "example.com" // in httptest's certificate
			tr.DialContext = (&Dialer{Resolver: fakeAddrs{"reports.sts.test": tc.addrs}, AllowPrivate: tc.allowPrivate}).DialContext
			s := &Sender{Submitter: sub, HTTP: &http.Client{Transport: tr, Timeout: 5 * time.Second}, Rand: strings.NewReader(""),
				TXT: fakeTXT{"_smtp._tls.sts.test": {"v=TLSRPTv1;rua=" + tc.rua}}}
			a := NewAggregator()
			a.Success(sts, day1.Add(time.Hour))
			now := day1.Add(25 * time.Hour)
			res, owed := s.Deliver(context.Background(), a.Take(now, false), nil, now)
			if len(res) != 1 {
				t.Fatalf("Deliver = %+v", res)
			}
			if tc.wantSent {
				if len(res[0].Sent) != 1 || posts.Load() != 1 {
					t.Errorf("results %+v, %d POSTs; want the report sent", res, posts.Load())
				}
				return
			}
			if len(res[0].Sent) != 0 || posts.Load() != 0 || len(owed) != 0 ||
				len(res[0].Errors) != 1 || !strings.Contains(res[0].Errors[0], "allow_private_rua") {
				t.Errorf("results %+v, owed %+v, %d POSTs; want no POST, no retry and an error naming allow_private_rua",
					res, owed, posts.Load())
			}
		})
	}
}
