package integration

// The admin API against web pages, with the real binary: a cross-site form
// POST as a browser sends it and a request through a rebound DNS name are
// refused and change nothing, while the CLI, curl-like clients, Prometheus
// and the names docs/security.md's admin.allowed_hosts example lists keep working.

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// readmeAllowedHosts returns admin.allowed_hosts from docs/security.md's example,
// so that the snippet is run as written.
func readmeAllowedHosts(t *testing.T) []string {
	t.Helper()
	block := recipeBlocks(t, "TestAdminRefusesWebPages")[0].Text
	var v struct {
		Admin struct {
			AllowedHosts []string `yaml:"allowed_hosts"`
		} `yaml:"admin"`
	}
	if err := yaml.Unmarshal([]byte(block), &v); err != nil || len(v.Admin.AllowedHosts) == 0 {
		t.Fatalf("docs/security.md's admin.allowed_hosts example: %v %q", err, block)
	}
	return v.Admin.AllowedHosts
}

// adminRequest sends one request to the relay's admin server; host, when
// set, is the Host header.
func adminRequest(t *testing.T, r *testRelay, method, path, host, body string, header ...string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+r.AdminAddr+path, rd)
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

// guardExcerpt keeps error messages readable when a body is a whole page.
func guardExcerpt(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func TestAdminRefusesWebPages(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	n.sink("slow.test", peers.SinkOptions{Rcpt: func(string, int) *smtp.SMTPError {
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try later"}
	}})
	n.sink("src.test", peers.SinkOptions{})
	hosts := readmeAllowedHosts(t)
	r := n.relay("retry.initial_interval=1m", "retry.max_interval=10m",
		"admin.allowed_hosts=["+strings.Join(hosts, ",")+"]")
	id := r.send(peers.SwaksMessage{From: "owner@src.test", To: []string{"x@slow.test"},
		Data: message("owner@src.test", "x@slow.test", "admin guard")})
	_, port, _ := net.SplitHostPort(r.AdminAddr)

	// A page on evil.example submits a form to the admin server.
	code, body := adminRequest(t, r, "POST", "/api/queue/delete?all=1", "", "all=1",
		"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate",
		"Sec-Fetch-Dest", "document", "User-Agent", "Mozilla/5.0")
	if code != http.StatusForbidden {
		t.Errorf("cross-site form POST: HTTP %d %q, want 403", code, guardExcerpt(body))
	}
	code, _ = adminRequest(t, r, "POST", "/api/queue/"+id+"/bounce", "", "x=1", "Origin", "http://evil.example")
	if code != http.StatusForbidden {
		t.Errorf("cross-site POST with Origin only: HTTP %d, want 403", code)
	}
	// The same page, its name re-pointed at the relay, reads the queue.
	for _, path := range []string{"/api/queue", "/api/queue/" + id, "/", "/message/" + id, "/metrics"} {
		code, body = adminRequest(t, r, "GET", path, "evil.example:"+port, "")
		if code != http.StatusForbidden || strings.Contains(body, "owner@src.test") {
			t.Errorf("GET %s with a rebound Host: HTTP %d %q, want 403 without data", path, code, guardExcerpt(body))
		}
	}
	if code, _ = adminRequest(t, r, "POST", "/api/queue/delete?all=1", "evil.example:"+port, ""); code != http.StatusForbidden {
		t.Errorf("POST with a rebound Host: HTTP %d, want 403", code)
	}
	if rows := r.rowsOf(id); len(rows) != 1 || rows[0].Status == "held" {
		t.Fatalf("refused requests changed the queue: %+v", rows)
	}

	// What operators use keeps working: the names docs/security.md lists, the CLI,
	// a plain POST as curl sends it, and a Prometheus scrape.
	for _, h := range hosts {
		if code, body = adminRequest(t, r, "GET", "/api/queue", h+":"+port, ""); code != http.StatusOK || !strings.Contains(body, id) {
			t.Errorf("GET /api/queue with Host %s (admin.allowed_hosts): HTTP %d", h, code)
		}
	}
	if res := r.cli("queue", "hold", id); res.Code != 0 {
		t.Errorf("queue hold: %s", res)
	}
	if code, body = adminRequest(t, r, "POST", "/api/queue/"+id+"/release", "", "", "User-Agent", "curl/8.5.0"); code != http.StatusOK {
		t.Errorf("curl-like POST release: HTTP %d %q", code, guardExcerpt(body))
	}
	code, body = adminRequest(t, r, "GET", "/metrics", "", "", "User-Agent", "Prometheus/3.0.0",
		"Accept", "text/plain;version=0.0.4;q=0.5,*/*;q=0.1", "X-Prometheus-Scrape-Timeout-Seconds", "10")
	if code != http.StatusOK || !strings.Contains(body, "greyrelay_queue") {
		t.Errorf("Prometheus scrape: HTTP %d", code)
	}
	if res := r.cli("queue", "delete", id); res.Code != 0 {
		t.Errorf("queue delete: %s", res)
	}
	if rows := r.rowsOf(id); len(rows) != 0 {
		t.Errorf("queue delete through the CLI left %+v", rows)
	}
}

// TestAdminProbeIsGuarded: the probe makes the relay speak SMTP from its
// pinned address, so a web page must not be able to start it and nobody
// may start many. A cross-site GET (what a link or an <img> makes a
// browser send) is 405 and a cross-site POST 403, and neither reaches the
// destination; a curl-like POST works. Twenty probes at once of a tarpit
// (a host that accepts and never greets) open at most
// admin.probe_concurrency (2) connections to it, the others answered 429
// with Retry-After at once; and one client's probes in a row are cut at
// admin.probe_per_minute (10) with 429 and Retry-After.
func TestAdminProbeIsGuarded(t *testing.T) {
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("ok.test", peers.SinkOptions{})
	tarpit, err := net.Listen("tcp", n.mxAddr("tarpit.test"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var open, most int
	var held []net.Conn
	go func() {
		for {
			c, err := tarpit.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			open++
			most = max(most, open)
			mu.Unlock()
			go func() { // held without a word until the client gives up
				io.Copy(io.Discard, c)
				mu.Lock()
				open--
				mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		tarpit.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	r := n.relay()

	code, body := adminRequest(t, r, "GET", "/api/probe?target=victim@ok.test", "", "",
		"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "no-cors", "Sec-Fetch-Dest", "image", "User-Agent", "Mozilla/5.0")
	if code != http.StatusMethodNotAllowed {
		t.Errorf("cross-site GET /api/probe: HTTP %d %q, want 405", code, guardExcerpt(body))
	}
	code, body = adminRequest(t, r, "POST", "/api/probe", "", "target=victim@ok.test",
		"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site", "User-Agent", "Mozilla/5.0")
	if code != http.StatusForbidden {
		t.Errorf("cross-site POST /api/probe: HTTP %d %q, want 403", code, guardExcerpt(body))
	}
	if c := sink.Connections(); c != 0 {
		t.Fatalf("refused probes reached the destination: %d connections", c)
	}
	code, body = adminRequest(t, r, "POST", "/api/probe?target=someone@ok.test", "", "", "User-Agent", "curl/8.5.0")
	if code != http.StatusOK || sink.Commands()["RCPT"] != 1 {
		t.Fatalf("curl-like POST /api/probe: HTTP %d %q, sink saw %v; want 200 and one RCPT", code, guardExcerpt(body), sink.Commands())
	}

	// Twenty at once against the tarpit.
	type answer struct {
		code  int
		retry string
	}
	answers := make(chan answer, 20)
	for range 20 {
		go func() {
			req, _ := http.NewRequest("POST", "http://"+r.AdminAddr+"/api/probe?target=x@tarpit.test", nil)
			resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
			if err != nil {
				answers <- answer{code: -1}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answers <- answer{resp.StatusCode, resp.Header.Get("Retry-After")}
		}()
	}
	ran := 0
	for range 20 {
		a := <-answers
		switch {
		case a.code == http.StatusTooManyRequests:
			if s, err := strconv.Atoi(a.retry); err != nil || s < 1 || s > 60 {
				t.Errorf("429 with Retry-After %q, want 1 to 60 seconds", a.retry)
			}
		case a.code == http.StatusOK || a.code == http.StatusBadGateway:
			ran++
		default:
			t.Errorf("probe of the tarpit: HTTP %d", a.code)
		}
	}
	mu.Lock()
	peak := most
	mu.Unlock()
	if ran > 2 || peak > 2 || peak == 0 {
		t.Errorf("%d probes ran and the tarpit saw up to %d connections at once; want at most admin.probe_concurrency (2) of each", ran, peak)
	}

	// One client in a row: refused with 429 and Retry-After before long.
	before := sink.Commands()["RCPT"]
	ok, limited := 0, false
	for range 12 {
		req, _ := http.NewRequest("POST", "http://"+r.AdminAddr+"/api/probe?target=someone@ok.test", nil)
		resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 60 {
				t.Errorf("429 with Retry-After %q, want 1 to 60 seconds", resp.Header.Get("Retry-After"))
			}
			limited = true
			break
		}
		ok++
	}
	if !limited || ok > 10 {
		t.Errorf("%d probes in a row answered, none refused; want 429 within admin.probe_per_minute (10)", ok)
	}
	if got := sink.Commands()["RCPT"] - before; got != ok {
		t.Errorf("the destination saw %d RCPTs for %d answered probes", got, ok)
	}
}
