package admin

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin/admintest"
	"github.com/greyrelay/greyrelay/relay/config"
)

// t0 and testNow are the fixture's (admintest).
var (
	t0         = admintest.T0
	testNow    = admintest.Now
	noSuchUser = admintest.NoSuchUser
)

// fixture is admintest's queue (see there for its messages and
// destinations) served by a Server with a fake engine.
type fixture struct {
	q              *queue.Queue
	srv            *Server
	engine         *admintest.Engine
	m1, m2, m3, m4 queue.ID
}

// options adjusts the server options of a fixture before New.
type options func(*Options)

func newFixture(t testing.TB, opts ...options) *fixture {
	t.Helper()
	d := admintest.New(t)
	f := &fixture{q: d.Q, engine: &admintest.Engine{Q: d.Q}, m1: d.M1, m2: d.M2, m3: d.M3, m4: d.M4}
	o := Options{Config: &config.Config{Hostname: "relay.test", Admin: config.Admin{Address: "127.0.0.1:0"}},
		Queue: f.q, Engine: f.engine, Registry: prometheus.NewRegistry(), Now: func() time.Time { return testNow }}
	for _, fn := range opts {
		fn(&o)
	}
	var err error
	if f.srv, err = New(o); err != nil {
		t.Fatal(err)
	}
	return f
}

var (
	enqueue    = admintest.Enqueue
	finishKeys = admintest.FinishKeys
	deferKeys  = admintest.DeferKeys
)

// do runs one request against the fixture's handler.
func (f *fixture) do(t testing.TB, method, target string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	req.Host = "127.0.0.1:8025" // as the CLI sends it; httptest's default example.com is refused
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	f.srv.handler.ServeHTTP(rec, req)
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

// boundAddr returns the address s listens on, or nil before Start.
func boundAddr(s *Server) net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}
