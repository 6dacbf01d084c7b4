package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
)

// t0 is when the first test message arrived; testNow is two hours later.
var (
	t0      = time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	testNow = t0.Add(2 * time.Hour)
)

// fixture is a real queue in t.TempDir() with four messages:
//
//	m1 alice → bob@greylist.test, carol@greylist.test  deferred, greylisted (451 4.7.1)
//	m2 <>    → dave@slow.test                          deferred, rate-limited (421 4.7.0)
//	m3 alice → erin@new.test                           queued, never attempted
//	m4 bob   → frank@greylist.test                     held after one greylisting
//
// and three destinations: greylist.test greylists (learned 5m), slow.test
// throttles and has a dead host, quiet.test has nothing worth showing.
type fixture struct {
	q              *queue.Queue
	srv            *Server
	engine         *fakeEngine
	m1, m2, m3, m4 queue.ID
}

type fakeEngine struct {
	q      *queue.Queue
	mu     sync.Mutex
	bounce []queue.Selector
	retry  []queue.Selector
	forget []string // domain, or "all"
	kicks  int
}

func (e *fakeEngine) Retry(sel queue.Selector, now time.Time) (int, error) {
	e.mu.Lock()
	e.retry = append(e.retry, sel)
	e.mu.Unlock()
	return e.q.Retry(sel, now)
}

func (e *fakeEngine) Forget(domain string, all bool, _ time.Time) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if all {
		domain = "all"
	}
	e.forget = append(e.forget, domain)
	return 1, nil
}

func (e *fakeEngine) Bounce(sel queue.Selector, _ time.Time) (int, error) {
	e.mu.Lock()
	e.bounce = append(e.bounce, sel)
	e.mu.Unlock()
	rs, err := e.q.Select(sel)
	return len(rs), err
}

func (e *fakeEngine) Kick() {
	e.mu.Lock()
	e.kicks++
	e.mu.Unlock()
}

// options adjusts the server options of a fixture before New.
type options func(*Options)

func newFixture(t testing.TB, opts ...options) *fixture {
	t.Helper()
	q, err := queue.Open(filepath.Join(t.TempDir(), "queue.db"), queue.Options{
		History: queue.HistoryOptions{Retention: 7 * 24 * time.Hour, MaxMessages: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	f := &fixture{q: q, engine: &fakeEngine{q: q}}
	f.populate(t)
	o := Options{Config: &config.Config{Hostname: "relay.test", Admin: config.Admin{Address: "127.0.0.1:0"}},
		Queue: q, Engine: f.engine, Registry: prometheus.NewRegistry(), Now: func() time.Time { return testNow }}
	for _, fn := range opts {
		fn(&o)
	}
	if f.srv, err = New(o); err != nil {
		t.Fatal(err)
	}
	return f
}

func enqueue(t testing.TB, q *queue.Queue, from string, arrival time.Time, to ...string) queue.ID {
	t.Helper()
	m := queue.NewMessage{From: from, Body: []byte("Subject: x\r\n\r\nhi\r\n"), Arrival: arrival,
		ClientAddr: "127.0.0.1:40000", Helo: "client.test"}
	for _, a := range to {
		m.To = append(m.To, queue.NewRecipient{Addr: a, Domain: a[strings.IndexByte(a, '@')+1:]})
	}
	id, err := q.Enqueue(m)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// defer records one attempt for keys that ended with reply.
func deferKeys(t testing.TB, q *queue.Queue, at time.Time, reason string, reply queue.Reply, keys ...queue.Key) {
	t.Helper()
	err := q.Begin(queue.Start{Keys: keys, Time: at, SourceIP: "192.0.2.10", MXHost: "mx." + "peer.test",
		MXAddr: "198.51.100.7", LeaseUntil: at.Add(10 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var u queue.Update
	for _, k := range keys {
		u.Results = append(u.Results, queue.Result{Key: k, Status: queue.Deferred, Reason: reason,
			Reply: reply, Stage: "rcpt", End: at.Add(time.Second), NextAttempt: testNow.Add(4 * time.Minute)})
	}
	if _, err := q.Apply(u); err != nil {
		t.Fatal(err)
	}
}

var greylistReply = queue.Reply{Code: 451, Enhanced: "4.7.1", Text: "Greylisted <script>alert(1)</script>, try again in 300 seconds"}

func (f *fixture) populate(t testing.TB) {
	q := f.q
	f.m1 = enqueue(t, q, "alice@example.org", t0, "bob@greylist.test", "carol@greylist.test")
	f.m2 = enqueue(t, q, "", t0.Add(30*time.Minute), "dave@slow.test")
	f.m3 = enqueue(t, q, "alice@example.org", t0.Add(time.Hour), "erin@new.test")
	f.m4 = enqueue(t, q, "bob@example.org", t0.Add(90*time.Minute), "frank@greylist.test")
	deferKeys(t, q, testNow.Add(-time.Hour), "greylisted", greylistReply, queue.Key{ID: f.m1}, queue.Key{ID: f.m1, Rcpt: 1})
	deferKeys(t, q, testNow.Add(-time.Minute), "rate-limited",
		queue.Reply{Code: 421, Enhanced: "4.7.0", Text: "Too many connections \x1b[31mfrom you"}, queue.Key{ID: f.m2})
	deferKeys(t, q, testNow.Add(-30*time.Minute), "greylisted", greylistReply, queue.Key{ID: f.m4})
	if _, err := q.Hold(queue.Selector{ID: f.m4}); err != nil {
		t.Fatal(err)
	}
	_, err := q.Apply(queue.Update{Destinations: []queue.Destination{
		{Domain: "greylist.test", Greylists: true, GreylistSeen: 3, GreylistPassed: 1, LearnedDelay: 5 * time.Minute,
			LastGreylisted: testNow.Add(-time.Hour), LastReply: greylistReply, Updated: testNow.Add(-time.Hour)},
		{Domain: "slow.test", ThrottleLevel: 2, ThrottledUntil: testNow.Add(10 * time.Minute),
			DeadHosts: map[string]time.Time{"mx1.slow.test": testNow.Add(30 * time.Minute)}, Updated: testNow},
		{Domain: "quiet.test", Updated: testNow},
	}})
	if err != nil {
		t.Fatal(err)
	}
}

// do runs one request against the fixture's handler.
func (f *fixture) do(t testing.TB, method, target string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	req.Host = "127.0.0.1:8025" // as the CLI sends it; httptest's default example.com is refused
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, req)
	return rec
}

// getJSON runs a request, checks the status and decodes the body.
func (f *fixture) getJSON(t testing.TB, method, target string, want int, out any) {
	t.Helper()
	rec := f.do(t, method, target)
	if rec.Code != want {
		t.Fatalf("%s %s: status %d, want %d; body %s", method, target, rec.Code, want, rec.Body)
	}
	if out != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			t.Fatalf("%s %s: %v; body %s", method, target, err, rec.Body)
		}
	}
}

// httpGet fetches url from a real server.
func httpGet(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
