package admin

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// startReal starts the fixture's server on a loopback port and returns its
// base URL: these tests send real HTTP requests, headers as a browser
// writes them, through net/http's server.
func startReal(t *testing.T, f *fixture) string {
	t.Helper()
	if err := f.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.srv.Shutdown(ctx)
	})
	return "http://" + boundAddr(f.srv).String()
}

// send makes one request; host, when set, replaces the Host header (what a
// page reached through a rebound DNS name sends). body is sent as a form.
func send(t *testing.T, method, url, host, body string, header ...string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func stats(t *testing.T, q *queue.Queue) queue.Stats {
	t.Helper()
	st, err := q.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestCrossSiteFormPOSTRefused: a page on another site makes the browser
// submit a form to the admin API. Whatever the browser says about the
// request's origin (Sec-Fetch-Site, or only Origin in older browsers), it
// gets 403 and the queue does not change.
func TestCrossSiteFormPOSTRefused(t *testing.T) {
	f := newFixture(t)
	base := startReal(t, f)
	before := stats(t, f.q)
	forged := []struct {
		name   string
		method string
		header []string
	}{
		{"modern browser", "POST", []string{"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site",
			"Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}},
		{"another port on this host", "POST", []string{"Origin", "http://127.0.0.1:3000", "Sec-Fetch-Site", "same-site"}},
		{"old browser, Origin only", "POST", []string{"Origin", "http://evil.example"}},
		{"sandboxed frame", "POST", []string{"Origin", "null"}},
		{"fetch with PUT", "PUT", []string{"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"}},
		{"fetch with DELETE", "DELETE", []string{"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"}},
	}
	for _, tc := range forged {
		for _, path := range []string{"/api/queue/delete?all=1", "/api/queue/hold?domain=greylist.test",
			"/api/queue/" + f.m1.String() + "/bounce"} {
			code, body := send(t, tc.method, base+path, "", "x=1", tc.header...)
			if code != http.StatusForbidden || !strings.Contains(body, "cross-origin") {
				t.Errorf("%s: %s %s: %d %q, want 403 cross-origin", tc.name, tc.method, path, code, body)
			}
		}
	}
	if after := stats(t, f.q); !reflect.DeepEqual(after, before) {
		t.Errorf("forged requests changed the queue:\nbefore %+v\nafter  %+v", before, after)
	}
	if len(f.engine.Bounced()) != 0 {
		t.Errorf("forged bounce reached the engine: %v", f.engine.Bounced())
	}

	// Reads stay open to the browser, which cannot read a cross-origin
	// answer without CORS headers, and none are sent.
	req, _ := http.NewRequest("GET", base+"/api/stats", nil)
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("cross-site GET: %d, Access-Control-Allow-Origin %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
}

// TestSameOriginAndNonBrowserPOSTAccepted: the CLI and curl send no Origin;
// the status page's own requests are same-origin; a typed URL is "none".
func TestSameOriginAndNonBrowserPOSTAccepted(t *testing.T) {
	f := newFixture(t)
	base := startReal(t, f)
	host := strings.TrimPrefix(base, "http://")
	cases := []struct {
		name   string
		header []string
	}{
		{"curl", []string{"User-Agent", "curl/8.5.0"}},
		{"same-origin page", []string{"Origin", base, "Sec-Fetch-Site", "same-origin"}},
		{"old browser, own Origin", []string{"Origin", "http://" + host}},
		{"user-initiated", []string{"Sec-Fetch-Site", "none"}},
	}
	for _, tc := range cases {
		code, body := send(t, "POST", base+"/api/queue/retry?all=1", "", "", tc.header...)
		if code != http.StatusOK {
			t.Errorf("%s: %d %q, want 200", tc.name, code, body)
		}
	}
	// A plain request as the CLI's client sends it (adminclient's
	// TestClientThroughGuard sends it with the client itself).
	if code, body := send(t, "POST", base+"/api/queue/hold?domain=new.test", "", ""); code != http.StatusOK ||
		!strings.Contains(body, `"recipients": 1`) {
		t.Fatalf("hold: %d %q", code, body)
	}
	if st := stats(t, f.q); st.ByStatus[queue.Held] != 2 {
		t.Errorf("after hold: %+v", st.ByStatus)
	}
}

// TestReboundHostRefused: a page served under a name the attacker controls,
// re-pointed at 127.0.0.1, sends that name as Host. It gets 403 and no
// data; the names the operator uses still work, Prometheus included.
func TestReboundHostRefused(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Config.Admin.AllowedHosts = []string{"relay.internal", "Status.Example."} })
	base := startReal(t, f)
	_, port, _ := strings.Cut(strings.TrimPrefix(base, "http://"), ":")
	for _, host := range []string{"evil.example:" + port, "evil.example", "localhost.evil.example:" + port,
		"127.0.0.1.nip.io:" + port, "relay.internal.evil.example", "xrelay.internal"} {
		for _, path := range []string{"/api/queue", "/api/queue/" + f.m1.String(), "/api/stats", "/metrics", "/", "/message/" + f.m1.String(), "/api/destinations"} {
			code, body := send(t, "GET", base+path, host, "")
			if code != http.StatusForbidden || strings.Contains(body, "alice@") || strings.Contains(body, "greylist.test") ||
				strings.Contains(body, "greyrelay_") {
				t.Errorf("GET %s with Host %s: %d %q, want 403 and no data", path, host, code, body)
			}
		}
		before := stats(t, f.q)
		if code, _ := send(t, "POST", base+"/api/queue/delete?all=1", host, ""); code != http.StatusForbidden {
			t.Errorf("POST delete with Host %s: %d, want 403", host, code)
		}
		if after := stats(t, f.q); !reflect.DeepEqual(after, before) {
			t.Errorf("Host %s changed the queue", host)
		}
	}
	for _, host := range []string{"", "127.0.0.1:" + port, "localhost:" + port, "LOCALHOST.:" + port, "[::1]:" + port,
		"127.0.0.2:" + port, "app.localhost:" + port, "relay.internal:" + port, "status.example", "STATUS.EXAMPLE.:" + port} {
		if code, body := send(t, "GET", base+"/api/queue", host, ""); code != http.StatusOK || !strings.Contains(body, "alice@") {
			t.Errorf("GET /api/queue with Host %q: %d, want 200 with the queue", host, code)
		}
	}
	// Prometheus scrapes with the target's address as Host.
	code, body := send(t, "GET", base+"/metrics", "", "", "User-Agent", "Prometheus/3.0.0",
		"Accept", "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2",
		"X-Prometheus-Scrape-Timeout-Seconds", "10")
	if code != http.StatusOK || !strings.Contains(body, "greyrelay_") {
		t.Errorf("Prometheus scrape: %d", code)
	}
}

func TestHostPolicy(t *testing.T) {
	tests := []struct {
		listen  string
		allowed []string
		host    string
		ok      bool
	}{
		{"127.0.0.1:8025", nil, "127.0.0.1:8025", true},
		{"127.0.0.1:8025", nil, "127.1.2.3", true},
		{"127.0.0.1:8025", nil, "[::ffff:127.0.0.1]:8025", true},
		{"127.0.0.1:8025", nil, "localhost", true},
		{"127.0.0.1:8025", nil, "192.0.2.1:8025", false},
		{"127.0.0.1:8025", nil, "evil.example:8025", false},
		{"127.0.0.1:8025", nil, "localhost.evil.example", false},
		{"127.0.0.1:8025", nil, "evil.example:8025@127.0.0.1", false},
		{"192.0.2.7:8025", nil, "192.0.2.7:8025", true},
		{"192.0.2.7:8025", nil, "192.0.2.8:8025", false},
		{"[2001:db8::7]:8025", nil, "[2001:DB8:0::7]:8025", true},
		{"admin.internal:8025", nil, "ADMIN.internal.:8025", true},
		{"admin.internal:8025", nil, "admin.internal.evil.example", false},
		{"0.0.0.0:8025", nil, "10.1.2.3:8025", true},
		{"[::]:8025", nil, "[2001:db8::1]:8025", true},
		{":8025", nil, "10.1.2.3", true},
		{"0.0.0.0:8025", nil, "greyrelay:8025", false},
		{"0.0.0.0:8025", []string{"greyrelay"}, "greyrelay:8025", true},
		{"0.0.0.0:8025", []string{"192.0.2.9"}, "evil.example", false},
	}
	for _, tt := range tests {
		if got := newHostPolicy(tt.listen, tt.allowed).allows(tt.host); got != tt.ok {
			t.Errorf("listen %s allowed %v: Host %q allowed = %v, want %v", tt.listen, tt.allowed, tt.host, got, tt.ok)
		}
	}
}

// FuzzHostPolicy: whatever the Host header holds, a server on 127.0.0.1
// with no admin.allowed_hosts answers only loopback names and addresses.
func FuzzHostPolicy(f *testing.F) {
	for _, s := range []string{"127.0.0.1:8025", "[::1]:1", "localhost.", "a.localhost", "evil.example:8025",
		"[::ffff:127.0.0.1]", "127.0.0.1.nip.io", "[fe80::1%lo]:80", ":80", "[", "LOCALHOST"} {
		f.Add(s)
	}
	p := newHostPolicy("127.0.0.1:8025", nil)
	f.Fuzz(func(t *testing.T, host string) {
		if host == "" || !p.allows(host) {
			return
		}
		h := host
		if hh, _, err := net.SplitHostPort(host); err == nil {
			h = hh
		}
		h = normalHost(h)
		if ip, err := netip.ParseAddr(h); err == nil && ip.Unmap().IsLoopback() {
			return
		}
		if h != "localhost" && !strings.HasSuffix(h, ".localhost") {
			t.Errorf("Host %q (%q) allowed", host, h)
		}
	})
}
