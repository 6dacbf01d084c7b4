package admin

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
)

func keys(l ListResult) []string {
	var out []string
	for _, r := range l.Rows {
		out = append(out, r.Key)
	}
	return out
}

func TestListFiltersAndPaging(t *testing.T) {
	f := newFixture(t)
	k := func(id queue.ID, n int) string { return queue.Key{ID: id, Rcpt: n}.String() }
	all := []string{k(f.m1, 0), k(f.m1, 1), k(f.m2, 0), k(f.m3, 0), k(f.m4, 0)}
	tests := []struct {
		query string
		want  []string
		total int
	}{
		{"", all, 5},
		{"status=deferred", []string{k(f.m1, 0), k(f.m1, 1), k(f.m2, 0)}, 3},
		{"status=held", []string{k(f.m4, 0)}, 1},
		{"reason=greylisted", []string{k(f.m1, 0), k(f.m1, 1), k(f.m4, 0)}, 3},
		{"reason=rate-limited", []string{k(f.m2, 0)}, 1},
		{"domain=GREYLIST.test", []string{k(f.m1, 0), k(f.m1, 1), k(f.m4, 0)}, 3},
		{"sender=%3C%3E", []string{k(f.m2, 0)}, 1},
		{"sender=alice@example.org", []string{k(f.m1, 0), k(f.m1, 1), k(f.m3, 0)}, 3},
		{"older_than=1h", []string{k(f.m1, 0), k(f.m1, 1), k(f.m2, 0)}, 3},
		{"status=deferred&domain=slow.test", []string{k(f.m2, 0)}, 1},
		{"limit=2&offset=1", all[1:3], 5},
		{"offset=4", all[4:], 5},
		{"offset=9", nil, 5},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			var l ListResult
			f.getJSON(t, "GET", "/api/queue?"+tt.query, http.StatusOK, &l)
			if got := keys(l); !slices.Equal(got, tt.want) || l.Total != tt.total {
				t.Errorf("got %v total %d, want %v total %d", got, l.Total, tt.want, tt.total)
			}
		})
	}
}

func TestListRowFields(t *testing.T) {
	f := newFixture(t)
	var l ListResult
	f.getJSON(t, "GET", "/api/queue?reason=greylisted&limit=1", http.StatusOK, &l)
	if len(l.Rows) != 1 {
		t.Fatalf("rows %v", l.Rows)
	}
	r := l.Rows[0]
	want := Row{ID: f.m1.String(), Node: "relay.test", Key: f.m1.String() + "/0", Status: "deferred", Reason: "greylisted",
		Attempts: 1, SourceIP: "192.0.2.10", MXHost: "mx.peer.test", MXAddr: "198.51.100.7",
		Sender: "alice@example.org", Recipient: "bob@greylist.test", Domain: "greylist.test",
		Arrival: t0, AgeSeconds: 7200}
	got := r
	got.NextAttempt, got.LastAttempt, got.LastReply = nil, nil, nil
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("row\n got %+v\nwant %+v", got, want)
	}
	if r.NextAttempt == nil || !r.NextAttempt.Equal(testNow.Add(4*time.Minute)) {
		t.Errorf("next_attempt %v", r.NextAttempt)
	}
	if r.LastReply == nil || r.LastReply.Code != 451 || r.LastReply.Enhanced != "4.7.1" {
		t.Errorf("last_reply %+v", r.LastReply)
	}
	if !l.Now.Equal(testNow) || l.Limit != 1 {
		t.Errorf("now %v limit %d", l.Now, l.Limit)
	}
}

func TestListRejectsBadFilters(t *testing.T) {
	f := newFixture(t)
	for _, q := range []string{"status=bogus", "older_than=soon", "older_than=-1h", "limit=0",
		"limit=10001", "offset=-1", "offset=x"} {
		var e ErrorAnswer
		f.getJSON(t, "GET", "/api/queue?"+q, http.StatusBadRequest, &e)
		if e.Error == "" {
			t.Errorf("%s: no error message", q)
		}
	}
}

func TestShowExplainsLastReply(t *testing.T) {
	f := newFixture(t)
	var m Message
	f.getJSON(t, "GET", "/api/queue/"+f.m1.String(), http.StatusOK, &m)
	// The node holding it (the fixture's hostname: no cluster.node_name).
	if m.ID != f.m1.String() || m.Node != "relay.test" || len(m.Recipients) != 2 || m.Sender != "alice@example.org" {
		t.Fatalf("message %+v", m)
	}
	r := m.Recipients[1]
	if r.Recipient != "carol@greylist.test" || len(r.History) != 1 {
		t.Fatalf("recipient %+v", r)
	}
	a := r.History[0]
	if a.Outcome != "deferred" || a.Reply == nil || a.Reply.Code != 451 || a.MXHost != "mx.peer.test" || a.End == nil {
		t.Errorf("attempt %+v", a)
	}
	if r.Explanation == nil || !strings.Contains(r.Explanation.Meaning, "greylist") || r.Explanation.Fault == "" {
		t.Errorf("explanation %+v", r.Explanation)
	}

	var q3 Message // never attempted: nothing to explain
	f.getJSON(t, "GET", "/api/queue/"+f.m3.String(), http.StatusOK, &q3)
	if q3.Recipients[0].Explanation != nil || len(q3.Recipients[0].History) != 0 {
		t.Errorf("queued recipient %+v", q3.Recipients[0])
	}
	f.getJSON(t, "GET", "/api/queue/ffffff", http.StatusNotFound, nil)
	f.getJSON(t, "GET", "/api/queue/not-hex", http.StatusBadRequest, nil)
	f.getJSON(t, "GET", "/api/queue/0", http.StatusBadRequest, nil)
}

func TestActions(t *testing.T) {
	type check func(t *testing.T, f *fixture)
	status := func(id queue.ID, want ...queue.Status) check {
		return func(t *testing.T, f *fixture) {
			m, err := f.q.Show(id)
			if err != nil {
				t.Fatal(err)
			}
			var got []queue.Status
			for _, r := range m.Recipients {
				got = append(got, r.Status)
			}
			if !slices.Equal(got, want) {
				t.Errorf("message %s: statuses %v, want %v", id, got, want)
			}
		}
	}
	tests := []struct {
		name  string
		path  func(f *fixture) string
		code  int
		n     int
		check check
	}{
		{"hold one", func(f *fixture) string { return "/api/queue/" + f.m1.String() + "/hold" }, 200, 2,
			func(t *testing.T, f *fixture) { status(f.m1, queue.Held, queue.Held)(t, f) }},
		{"release domain", func(f *fixture) string { return "/api/queue/release?domain=greylist.test" }, 200, 1,
			func(t *testing.T, f *fixture) { status(f.m4, queue.Deferred)(t, f) }},
		{"retry all", func(f *fixture) string { return "/api/queue/retry?all=1" }, 200, 4,
			func(t *testing.T, f *fixture) {
				m, _ := f.q.Show(f.m2)
				if !m.Recipients[0].NextAttempt.Equal(testNow) {
					t.Errorf("next attempt %v, want now", m.Recipients[0].NextAttempt)
				}
				if f.engine.Kicks() != 1 {
					t.Errorf("kicks %d, want 1", f.engine.Kicks())
				}
				if want := []queue.Selector{{All: true}}; !slices.Equal(f.engine.Retried(), want) {
					t.Errorf("engine retried %v, want %v (the flush goes through the engine)", f.engine.Retried(), want)
				}
			}},
		{"retry domain", func(f *fixture) string { return "/api/queue/retry?domain=slow.test" }, 200, 1, nil},
		{"delete one", func(f *fixture) string { return "/api/queue/" + f.m3.String() + "/delete" }, 200, 1,
			func(t *testing.T, f *fixture) {
				if _, err := f.q.Show(f.m3); !errors.Is(err, queue.ErrNotFound) {
					t.Errorf("after delete: %v", err)
				}
			}},
		{"bounce one", func(f *fixture) string { return "/api/queue/" + f.m2.String() + "/bounce" }, 200, 1,
			func(t *testing.T, f *fixture) {
				if want := []queue.Selector{{ID: f.m2}}; !slices.Equal(f.engine.Bounced(), want) {
					t.Errorf("engine got %v, want %v", f.engine.Bounced(), want)
				}
			}},
		{"bounce domain", func(f *fixture) string { return "/api/queue/bounce?domain=greylist.test" }, 200, 3, nil},
		{"unknown id", func(f *fixture) string { return "/api/queue/abcdef/retry" }, 404, 0, nil},
		{"bad id", func(f *fixture) string { return "/api/queue/xyz/retry" }, 400, 0, nil},
		{"unknown action", func(f *fixture) string { return "/api/queue/" + f.m1.String() + "/expedite" }, 404, 0, nil},
		{"no selector", func(f *fixture) string { return "/api/queue/retry" }, 400, 0, nil},
		{"two selectors", func(f *fixture) string { return "/api/queue/delete?all=1&domain=x.test" }, 400, 0,
			func(t *testing.T, f *fixture) {
				if st, _ := f.q.Stats(); st.Recipients != 5 {
					t.Errorf("recipients %d after a refused delete", st.Recipients)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			var res ActionResult
			var out any = &res
			if tt.code != 200 {
				out = nil
			}
			f.getJSON(t, "POST", tt.path(f), tt.code, out)
			if tt.code == 200 && res.Recipients != tt.n {
				t.Errorf("recipients %d, want %d", res.Recipients, tt.n)
			}
			if tt.check != nil {
				tt.check(t, f)
			}
		})
	}
}

func TestBounceWithoutEngine(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Engine = nil })
	f.getJSON(t, "POST", "/api/queue/"+f.m1.String()+"/bounce", http.StatusServiceUnavailable, nil)
	f.getJSON(t, "POST", "/api/queue/"+f.m1.String()+"/retry", http.StatusOK, nil) // no Kick needed
}

func TestActionsNeedPOST(t *testing.T) {
	f := newFixture(t)
	if rec := f.do(t, "GET", "/api/queue/"+f.m1.String()+"/delete"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET delete: %d", rec.Code)
	}
	if _, err := f.q.Show(f.m1); err != nil {
		t.Errorf("message gone after a GET: %v", err)
	}
}

func TestStatsAndDestinations(t *testing.T) {
	f := newFixture(t)
	var st Stats
	f.getJSON(t, "GET", "/api/stats", http.StatusOK, &st)
	if st.Messages != 4 || st.Recipients != 5 || st.ByStatus["deferred"] != 3 || st.ByStatus["held"] != 1 ||
		st.ByReason["greylisted"] != 3 || st.OldestAgeSeconds != 7200 || st.DBBytes <= 0 {
		t.Errorf("stats %+v", st)
	}
	var ds Destinations
	f.getJSON(t, "GET", "/api/destinations", http.StatusOK, &ds)
	if len(ds.Destinations) != 3 {
		t.Fatalf("destinations %+v", ds)
	}
	g := ds.Destinations[0]
	if g.Domain != "greylist.test" || !g.Greylists || g.LearnedDelaySeconds != 300 || g.GreylistSeen != 3 ||
		g.GreylistLearned == nil || !g.GreylistLearned.Equal(testNow.Add(-2*time.Hour)) {
		t.Errorf("greylist.test %+v", g)
	}
	var one Destinations
	f.getJSON(t, "GET", "/api/destinations/SLOW.test", http.StatusOK, &one)
	if len(one.Destinations) != 1 || one.Destinations[0].ThrottleLevel != 2 ||
		len(one.Destinations[0].DeadHosts) != 1 || one.Destinations[0].DeadHosts[0].Host != "mx1.slow.test" ||
		one.Destinations[0].PaceSeconds != 2 || one.Destinations[0].PaceRefused == nil ||
		!one.Destinations[0].PaceRefused.Equal(testNow.Add(-time.Minute)) {
		t.Errorf("slow.test %+v", one)
	}
	f.getJSON(t, "GET", "/api/destinations/unknown.test", http.StatusNotFound, nil)
}

func TestTokenRequired(t *testing.T) {
	const token = "s3cret-token"
	f := newFixture(t, func(o *Options) { o.Config.Admin.Token = token })
	paths := []string{"/", "/readyz", "/metrics", "/api/stats", "/api/queue", "/api/queue/" + "1",
		"/message/" + f.m1.String(), "/api/destinations", "/nonexistent"}
	for _, p := range paths {
		for _, auth := range []string{"", "Bearer wrong", "Bearer " + token + "x", "Basic " + token, token} {
			if rec := f.do(t, "GET", p, "Authorization", auth); rec.Code != http.StatusUnauthorized {
				t.Errorf("GET %s with %q: %d, want 401", p, auth, rec.Code)
			} else if rec.Header().Get("WWW-Authenticate") == "" {
				t.Errorf("GET %s: 401 without WWW-Authenticate", p)
			}
		}
		if rec := f.do(t, "GET", p, "Authorization", "Bearer "+token); rec.Code == http.StatusUnauthorized {
			t.Errorf("GET %s with the token: 401", p)
		}
	}
	if rec := f.do(t, "POST", "/api/queue/delete?all=1", "Authorization", "Bearer nope"); rec.Code != http.StatusUnauthorized {
		t.Errorf("POST delete: %d", rec.Code)
	}
	if st, _ := f.q.Stats(); st.Recipients != 5 {
		t.Errorf("unauthorised delete changed the queue: %d recipients", st.Recipients)
	}
	if rec := f.do(t, "GET", "/healthz"); rec.Code != http.StatusOK {
		t.Errorf("/healthz without token: %d", rec.Code)
	}
}

// A browser can open the status page with the token as an HTTP Basic
// password, but Basic credentials (which a browser also sends with forged
// cross-site requests) never act on the queue.
func TestTokenAsBasicPasswordReadsOnly(t *testing.T) {
	const token = "s3cret-token"
	f := newFixture(t, func(o *Options) { o.Config.Admin.Token = token })
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	rec := f.do(t, "GET", "/")
	if !slices.Contains(rec.Header().Values("WWW-Authenticate"), `Basic realm="greyrelay", charset="UTF-8"`) {
		t.Errorf("401 challenges %q, want a Basic one too", rec.Header().Values("WWW-Authenticate"))
	}
	tests := []struct {
		method, path, auth string
		want               int
	}{
		{"GET", "/", basic("admin", token), http.StatusOK},
		{"GET", "/api/stats", basic("", token), http.StatusOK},
		{"GET", "/message/" + f.m1.String(), basic("admin", token), http.StatusOK},
		{"GET", "/", basic("admin", token+"x"), http.StatusUnauthorized},
		{"GET", "/", basic(token, ""), http.StatusUnauthorized},
		{"POST", "/api/queue/delete?all=1", basic("admin", token), http.StatusUnauthorized},
	}
	for _, tt := range tests {
		if rec := f.do(t, tt.method, tt.path, "Authorization", tt.auth); rec.Code != tt.want {
			t.Errorf("%s %s with %q: %d, want %d", tt.method, tt.path, tt.auth, rec.Code, tt.want)
		}
	}
	if st, _ := f.q.Stats(); st.Recipients != 5 {
		t.Errorf("a Basic-authenticated POST changed the queue: %d recipients", st.Recipients)
	}
}

func TestNewRefusesOpenAddressWithoutToken(t *testing.T) {
	f := newFixture(t) // a queue to pass
	for _, tt := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:8025", "", true},
		{"[::1]:8025", "", true},
		{"localhost:8025", "", true},
		{"0.0.0.0:8025", "", false},
		{":8025", "", false},
		{"192.0.2.1:8025", "", false},
		{"0.0.0.0:8025", "t", true},
	} {
		_, err := New(Options{Config: &config.Config{Admin: config.Admin{Address: tt.addr, Token: tt.token}}, Queue: f.q})
		if (err == nil) != tt.ok {
			t.Errorf("%s token %q: err %v, want ok=%v", tt.addr, tt.token, err, tt.ok)
		}
	}
}

func TestReadyz(t *testing.T) {
	notReady := errors.New("listeners not up")
	f := newFixture(t, func(o *Options) { o.Ready = func() error { return notReady } })
	if rec := f.do(t, "GET", "/readyz"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "listeners not up") {
		t.Errorf("readyz: %d %q", rec.Code, rec.Body)
	}
	g := newFixture(t, func(o *Options) { o.Ready = func() error { return nil } })
	if rec := g.do(t, "GET", "/readyz"); rec.Code != http.StatusOK {
		t.Errorf("readyz: %d", rec.Code)
	}
}

func TestMetricsExposeQueueGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "greyrelay_test_total", Help: "x"})
	reg.MustRegister(other)
	f := newFixture(t, func(o *Options) { o.Registry = reg })
	rec := f.do(t, "GET", "/metrics", "Accept", "text/plain")
	if rec.Code != http.StatusOK {
		t.Fatalf("metrics: %d %s", rec.Code, rec.Body)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	gauge := func(name, label, value string) float64 {
		t.Helper()
		fam := fams[name]
		if fam == nil {
			t.Fatalf("no family %s", name)
		}
		for _, m := range fam.Metric {
			if label == "" || hasLabel(m, label, value) {
				return m.GetGauge().GetValue()
			}
		}
		t.Fatalf("%s{%s=%q} missing", name, label, value)
		return 0
	}
	checks := []struct {
		name, label, value string
		want               float64
	}{
		{"greyrelay_queue_recipients", "status", "deferred", 3},
		{"greyrelay_queue_recipients", "status", "held", 1},
		{"greyrelay_queue_recipients", "status", "queued", 1},
		{"greyrelay_queue_recipients", "status", "delivered", 0},
		{"greyrelay_queue_recipients_by_reason", "reason", "greylisted", 3},
		{"greyrelay_queue_recipients_by_reason", "reason", "rate-limited", 1},
		{"greyrelay_queue_recipients_by_reason", "reason", "mailbox-full", 0},
		{"greyrelay_queue_messages", "", "", 4},
		{"greyrelay_queue_oldest_age_seconds", "", "", 7200},
		{"greyrelay_queue_unsettled_recipients", "", "", 0},
	}
	for _, c := range checks {
		if got := gauge(c.name, c.label, c.value); got != c.want {
			t.Errorf("%s{%s=%q} = %v, want %v", c.name, c.label, c.value, got, c.want)
		}
	}
	if got := gauge("greyrelay_queue_db_bytes", "", ""); got <= 0 {
		t.Errorf("db bytes %v", got)
	}
	if fams["greyrelay_test_total"] == nil {
		t.Error("metrics of the given registry are missing")
	}
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.Label {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

func TestStatusPage(t *testing.T) {
	f := newFixture(t)
	rec := f.do(t, "GET", "/")
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("status page: %d %s", rec.Code, rec.Header())
	}
	body := rec.Body.String()
	for _, want := range []string{
		`<meta http-equiv="refresh" content="10">`,
		"relay.test",
		"greylisted", "rate-limited", // reasons
		"greylist.test", "5m", "slow.test", "mx1.slow.test", // destinations, learned delay, dead host
		f.m1.String() + "/0",                              // oldest message
		"451 4.7.1 Greylisted &lt;script&gt;",             // reply, escaped
		"Nothing to fix: greyrelay retries from the same", // explanation (classifier.Explain)
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	for _, bad := range []string{"quiet.test", "<script", "src=", "<link", "\x1b"} {
		if strings.Contains(body, bad) {
			t.Errorf("status page contains %q", bad)
		}
	}
	if f.do(t, "GET", "/other").Code != http.StatusNotFound {
		t.Error("/other should be 404")
	}
}

func TestStatusPageEmptyQueue(t *testing.T) {
	f := newFixture(t)
	if _, err := f.q.Delete(queue.Selector{All: true}); err != nil {
		t.Fatal(err)
	}
	rec := f.do(t, "GET", "/")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "The queue is empty.") {
		t.Errorf("empty status page: %d", rec.Code)
	}
}

func TestProbeHook(t *testing.T) {
	f := newFixture(t)
	f.getJSON(t, "POST", "/api/probe?target=x.test", http.StatusNotFound, nil)
	g := newFixture(t, func(o *Options) {
		o.Probe = func(_ context.Context, target string) (any, error) {
			if target == "broken.test" {
				return nil, errors.New("no MX")
			}
			return map[string]string{"target": target, "verdict": "ok"}, nil
		}
	})
	var res map[string]string
	g.getJSON(t, "POST", "/api/probe?target=x.test", http.StatusOK, &res)
	if res["target"] != "x.test" {
		t.Errorf("probe %v", res)
	}
	g.getJSON(t, "POST", "/api/probe", http.StatusBadRequest, nil)
	g.getJSON(t, "POST", "/api/probe?target=broken.test", http.StatusBadGateway, nil)
	// A form body, as curl -d sends it.
	req := httptest.NewRequest("POST", "/api/probe", strings.NewReader("target=form.test"))
	req.Host = "127.0.0.1:8025"
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	g.srv.handler.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "form.test") {
		t.Errorf("form POST: %d %s", rec.Code, rec.Body)
	}
}

// TestProbeIsGuarded: the probe sends SMTP, so a GET (what a link, an
// <img> or a cross-site fetch without CORS makes a browser send) does not
// run it, and neither does a cross-site POST.
func TestProbeIsGuarded(t *testing.T) {
	var calls atomic.Int64
	f := newFixture(t, func(o *Options) {
		o.Probe = func(context.Context, string) (any, error) { calls.Add(1); return "ok", nil }
	})
	if rec := f.do(t, "GET", "/api/probe?target=victim@example.test", "Sec-Fetch-Site", "cross-site"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("cross-site GET: %d, want 405", rec.Code)
	}
	if rec := f.do(t, "GET", "/api/probe?target=victim@example.test"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", rec.Code)
	}
	for _, h := range [][]string{{"Sec-Fetch-Site", "cross-site"}, {"Origin", "http://evil.example"}} {
		if rec := f.do(t, "POST", "/api/probe?target=victim@example.test", h...); rec.Code != http.StatusForbidden {
			t.Errorf("POST with %v: %d, want 403", h, rec.Code)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the probe ran %d times", n)
	}
	// With a token, only the bearer form acts: a browser's cached Basic
	// credentials do not.
	g := newFixture(t, func(o *Options) {
		o.Config.Admin.Token = "s3cret"
		o.Probe = func(context.Context, string) (any, error) { calls.Add(1); return "ok", nil }
	})
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x:s3cret"))
	if rec := g.do(t, "POST", "/api/probe?target=x.test", "Authorization", basic); rec.Code != http.StatusUnauthorized {
		t.Errorf("POST with Basic: %d, want 401", rec.Code)
	}
	if rec := g.do(t, "POST", "/api/probe?target=x.test", "Authorization", "Bearer s3cret"); rec.Code != http.StatusOK {
		t.Errorf("POST with the bearer token: %d", rec.Code)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the probe ran %d times, want 1", n)
	}
}

// TestProbeLimits: admin.probe_concurrency probes at once in all, and
// admin.probe_per_minute per client address; beyond either, 429 with
// Retry-After, and the probe does not run.
func TestProbeLimits(t *testing.T) {
	var now atomic.Int64
	now.Store(testNow.UnixNano())
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	var calls atomic.Int64
	f := newFixture(t, func(o *Options) {
		o.Config.Admin.ProbeConcurrency = 2
		o.Config.Admin.ProbePerMinute = 3
		o.Now = func() time.Time { return time.Unix(0, now.Load()) }
		o.Probe = func(_ context.Context, target string) (any, error) {
			calls.Add(1)
			if target == "tarpit.test" {
				started <- struct{}{}
				<-release
			}
			return "ok", nil
		}
	})
	from := func(client, target string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/api/probe?target="+target, nil)
		req.Host, req.RemoteAddr = "127.0.0.1:8025", client+":40000"
		rec := httptest.NewRecorder()
		f.srv.handler.ServeHTTP(rec, req)
		return rec
	}
	// Two probes of a tarpit hold both places.
	done := make(chan int, 2)
	for _, c := range []string{"127.0.0.1", "127.0.0.2"} {
		go func() { done <- from(c, "tarpit.test").Code }()
	}
	<-started
	<-started
	rec := from("127.0.0.3", "ok.test")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
		t.Errorf("third probe at once: %d, Retry-After %q; want 429, 1", rec.Code, rec.Header().Get("Retry-After"))
	}
	close(release)
	for range 2 {
		if c := <-done; c != http.StatusOK {
			t.Errorf("tarpit probe: %d", c)
		}
	}
	// The refused probe cost 127.0.0.3 nothing: it has its 3 per minute.
	for i := range 3 {
		if rec := from("127.0.0.3", "ok.test"); rec.Code != http.StatusOK {
			t.Fatalf("probe %d of 3 in a minute: %d", i+1, rec.Code)
		}
	}
	rec = from("127.0.0.3", "ok.test")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "20" {
		t.Errorf("fourth probe in a minute: %d, Retry-After %q; want 429, 20 (one probe per 20 s)", rec.Code, rec.Header().Get("Retry-After"))
	}
	if rec := from("127.0.0.4", "ok.test"); rec.Code != http.StatusOK {
		t.Errorf("another client: %d", rec.Code)
	}
	now.Add(int64(20 * time.Second))
	if rec := from("127.0.0.3", "ok.test"); rec.Code != http.StatusOK {
		t.Errorf("after Retry-After: %d", rec.Code)
	}
	if n := calls.Load(); n != 2+3+1+1 {
		t.Errorf("the probe ran %d times, want 7", n)
	}
}

// TestGetsHaveNoEffect asks every route, and every action path, with GET
// and HEAD: nothing may reach the engine, the probe or the TLS reporter,
// and the queue stays as it was.
func TestGetsHaveNoEffect(t *testing.T) {
	var effects atomic.Int64
	f := newFixture(t, func(o *Options) {
		o.Probe = func(context.Context, string) (any, error) { effects.Add(1); return "ok", nil }
		o.TLSReport = func(context.Context) (any, error) { effects.Add(1); return "ok", nil }
	})
	list := func() string {
		rows, _, err := f.q.List(queue.Filter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(rows)
	}
	before := list()
	id := f.m1.String()
	reads := []string{"/", "/healthz", "/readyz", "/metrics", "/api/stats", "/api/queue", "/api/queue/" + id,
		"/api/queue/" + id + "/headers", "/api/queue/" + id + "/body", "/api/shape", "/api/destinations",
		"/api/destinations/example.com"}
	acts := []string{"/api/probe?target=x.test", "/api/tls-report/send", "/api/destinations/forget?all=1"}
	for _, a := range []string{"retry", "hold", "release", "delete", "bounce"} {
		acts = append(acts, "/api/queue/"+id+"/"+a, "/api/queue/"+a+"?all=1")
	}
	for _, m := range []string{"GET", "HEAD"} {
		for _, p := range reads {
			f.do(t, m, p)
		}
		for _, p := range acts {
			// 405, or a read of the same path (GET /api/queue/{id} with
			// id "retry": 400), never the action.
			if rec := f.do(t, m, p); rec.Code < 400 {
				t.Errorf("%s %s: %d, want 405 (or a read's error)", m, p, rec.Code)
			}
		}
	}
	after := list()
	if n := effects.Load(); n != 0 || len(f.engine.Retried())+len(f.engine.Bounced())+len(f.engine.Forgotten())+f.engine.Kicks() != 0 {
		t.Errorf("GETs had effects: probe/report %d, engine %v %v %v %d", n, f.engine.Retried(), f.engine.Bounced(), f.engine.Forgotten(), f.engine.Kicks())
	}
	if before != after {
		t.Errorf("GETs changed the queue:\n%v\n%v", before, after)
	}
}

func TestStartServesAndShutsDown(t *testing.T) {
	f := newFixture(t)
	if boundAddr(f.srv) != nil {
		t.Error("bound before Start")
	}
	if err := f.srv.Start(); err != nil {
		t.Fatal(err)
	}
	base := "http://" + boundAddr(f.srv).String()
	if code, body := httpGet(t, base+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("healthz %d %q", code, body)
	}
	if code, body := httpGet(t, base+"/readyz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("readyz %d %q", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get(base + "/readyz"); err == nil {
		resp.Body.Close()
		t.Errorf("readyz after shutdown: %s", resp.Status)
	}
}

func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{"", "status=deferred&limit=5", "older_than=1h&offset=3", "limit=%00", "older_than=9999999999h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		flt, err := parseFilter(q, testNow)
		if err != nil {
			return
		}
		if flt.Limit < 1 || flt.Limit > MaxLimit || flt.Offset < 0 || flt.ArrivedBefore.After(testNow) {
			t.Errorf("%q: accepted %+v", raw, flt)
		}
	})
}

// BenchmarkList100k lists one page of a filtered queue of 100,000
// recipients through the handler; the queue does the filtering.
func BenchmarkList100k(b *testing.B) {
	f := newFixture(b)
	const n, batch = 100_000, 500
	for i := 0; i < n; i += batch {
		ms := make([]queue.NewMessage, batch)
		for j := range ms {
			dom := fmt.Sprintf("d%d.test", (i+j)%100)
			ms[j] = queue.NewMessage{From: "bulk@example.org", Body: []byte("x\r\n"), Arrival: t0,
				To: []queue.NewRecipient{{Addr: "u@" + dom, Domain: dom}}}
		}
		if _, err := f.q.EnqueueBatch(ms); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		rec := f.do(b, "GET", "/api/queue?domain=d7.test&status=queued&offset=500&limit=100")
		if rec.Code != http.StatusOK {
			b.Fatal(rec.Code)
		}
	}
}

// TestForgetDestinations: POST /api/destinations/forget hands exactly one
// selector to the engine; without an engine it is not available.
func TestForgetDestinations(t *testing.T) {
	f := newFixture(t)
	var res ForgetResult
	f.getJSON(t, "POST", "/api/destinations/forget?domain=slow.test", http.StatusOK, &res)
	if res.Action != "forget" || res.Destinations != 1 {
		t.Errorf("answer %+v", res)
	}
	f.getJSON(t, "POST", "/api/destinations/forget?all=1", http.StatusOK, nil)
	if want := []string{"slow.test", "all"}; !slices.Equal(f.engine.Forgotten(), want) {
		t.Errorf("engine forgot %v, want %v", f.engine.Forgotten(), want)
	}
	for _, q := range []string{"", "?domain=a.test&all=1", "?all=0", "?domain=%20"} {
		f.getJSON(t, "POST", "/api/destinations/forget"+q, http.StatusBadRequest, nil)
	}
	f.do(t, "GET", "/api/destinations/forget?all=1") // reads the destination "forget"
	if len(f.engine.Forgotten()) != 2 {
		t.Errorf("refused requests or a GET reached the engine: %v", f.engine.Forgotten())
	}
	f = newFixture(t, func(o *Options) { o.Engine = nil })
	f.getJSON(t, "POST", "/api/destinations/forget?all=1", http.StatusServiceUnavailable, nil)
}

// The admin API takes a domain in any spelling and acts on the canonical
// one, the form recipients and destinations are kept under.
func TestDomainSpellings(t *testing.T) {
	f := newFixture(t)
	f.getJSON(t, "POST", "/api/destinations/forget?domain="+url.QueryEscape("Bücher.Test."), http.StatusOK, nil)
	if want := []string{"xn--bcher-kva.test"}; !slices.Equal(f.engine.Forgotten(), want) {
		t.Errorf("engine forgot %v, want %v", f.engine.Forgotten(), want)
	}
	var one Destinations
	f.getJSON(t, "GET", "/api/destinations/slow.test.", http.StatusOK, &one)
	if len(one.Destinations) != 1 {
		t.Errorf("slow.test. %+v", one)
	}
}

// TestShowGreyLikeEvidence: a recipient deferred as greylisted because
// its MX host behaved like a greylister (Exim's "451 Temporary local
// problem", no greylisting text) shows the evidence in `queue show`: the
// host's record and how many of its deferrals with that reply passed at
// the first retry. One greylisted by its reply's text shows none.
func TestShowGreyLikeEvidence(t *testing.T) {
	f := newFixture(t)
	exim := queue.Reply{Code: 451, Text: "Temporary local problem - please try later"}
	id := enqueue(t, f.q, "alice@example.org", testNow.Add(-time.Hour), "x@exim.test")
	deferKeys(t, f.q, testNow.Add(-time.Minute), "greylisted", exim, queue.Key{ID: id})
	if _, err := f.q.Apply(queue.Update{Destinations: []queue.Destination{{Domain: "[198.51.100.7]",
		GreyLike: exim.Text, GreyLikePassed: 3, GreyLikeRefused: 1, Updated: testNow}}}); err != nil {
		t.Fatal(err)
	}
	var m Message
	f.getJSON(t, "GET", "/api/queue/"+id.String(), http.StatusOK, &m)
	want := GreyLike{Host: "[198.51.100.7]", Reply: exim.Text, Passed: 3, Refused: 1}
	if g := m.Recipients[0].GreyLike; g == nil || *g != want {
		t.Errorf("grey_like %+v, want %+v", g, want)
	}
	var m1 Message // greylisted by its text at the same host
	f.getJSON(t, "GET", "/api/queue/"+f.m1.String(), http.StatusOK, &m1)
	if g := m1.Recipients[0].GreyLike; g != nil {
		t.Errorf("greylisted by its text: grey_like %+v, want none", g)
	}
}
