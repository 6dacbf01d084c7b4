package admin

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/metrics"
)

func TestShowFinishedMessage(t *testing.T) {
	f := newFixture(t)
	finishKeys(t, f.q, testNow.Add(-10*time.Minute), queue.Delivered, "", queue.Reply{Code: 250, Text: "ok"}, queue.Key{ID: f.m3})
	var m Message
	f.getJSON(t, "GET", "/api/queue/"+f.m3.String(), http.StatusOK, &m)
	if m.Finished == nil || !m.Finished.Equal(testNow.Add(-10*time.Minute+time.Second)) || len(m.Recipients) != 1 {
		t.Fatalf("finished message %+v", m)
	}
	if r := m.Recipients[0]; r.Status != "delivered" || len(r.History) != 1 || r.History[0].Outcome != "delivered" ||
		r.MXHost != "mx.peer.test" || r.Finished == nil {
		t.Errorf("recipient %+v", r)
	}
	var l ListResult
	f.getJSON(t, "GET", "/api/queue?status=delivered", http.StatusOK, &l)
	if l.Total != 1 || l.Rows[0].ID != f.m3.String() || l.Rows[0].Finished == nil {
		t.Errorf("list of delivered: %+v", l)
	}
	f.getJSON(t, "GET", "/api/queue", http.StatusOK, &l)
	for _, r := range l.Rows {
		if r.ID == f.m3.String() {
			t.Errorf("the queue lists a finished message: %+v", r)
		}
	}
	rec := f.do(t, "GET", "/api/queue/"+f.m3.String()+"/headers")
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "content is not kept") {
		t.Errorf("headers of a finished message: %d %s", rec.Code, rec.Body)
	}
	rec = f.do(t, "GET", "/api/queue/ffffff")
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "history.retention") {
		t.Errorf("unknown message: %d %s", rec.Code, rec.Body)
	}
}

func TestContent(t *testing.T) {
	f := newFixture(t)
	base := "/api/queue/" + f.m1.String()
	tests := []struct {
		path       string
		code       int
		body, size string
	}{
		{base + "/headers", 200, "Subject: x\r\n", "12"},
		{base + "/body", 200, "hi\r\n", "4"},
		{base + "/headers?max=3", 200, "Sub", "12"},
		{base + "/headers?max=0", 400, "", ""},
		{base + "/headers?max=x", 400, "", ""},
		{"/api/queue/ffffff/body", 404, "", ""},
		{"/api/queue/zz/body", 400, "", ""},
	}
	for _, tc := range tests {
		rec := f.do(t, "GET", tc.path)
		if rec.Code != tc.code {
			t.Errorf("%s: %d, want %d (%s)", tc.path, rec.Code, tc.code, rec.Body)
			continue
		}
		if tc.code != 200 {
			continue
		}
		h := rec.Header()
		if rec.Body.String() != tc.body || h.Get(ContentSizeHeader) != tc.size ||
			h.Get("Content-Type") != "text/plain; charset=utf-8" || h.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %q, headers %v", tc.path, rec.Body, h)
		}
	}
}

func TestSplitMessage(t *testing.T) {
	tests := []struct{ in, header, body string }{
		{"A: 1\r\nB: 2\r\n\r\nbody\r\n\r\nmore\r\n", "A: 1\r\nB: 2\r\n", "body\r\n\r\nmore\r\n"},
		{"A: 1\r\n", "A: 1\r\n", ""},
		{"\r\nonly body\r\n", "", "only body\r\n"},
		{"", "", ""},
	}
	for _, tc := range tests {
		h, b := splitMessage([]byte(tc.in))
		if string(h) != tc.header || string(b) != tc.body {
			t.Errorf("splitMessage(%q) = %q, %q", tc.in, h, b)
		}
	}
}

// The fixture's live recipients are 120 (m1, two), 90 (m2), 60 (m3) and
// 30 (m4, held) minutes old.
func TestShape(t *testing.T) {
	f := newFixture(t)
	var sh Shape
	f.getJSON(t, "GET", "/api/shape", http.StatusOK, &sh)
	if sh.By != "domain" || len(sh.BucketMinutes) != 9 || sh.Total.Total != 5 ||
		!equalInts(sh.Total.Counts, []int{0, 0, 0, 1, 1, 3, 0, 0, 0, 0}) {
		t.Fatalf("shape %+v", sh)
	}
	want := []ShapeRow{
		{"greylist.test", 3, []int{0, 0, 0, 1, 0, 2, 0, 0, 0, 0}},
		{"new.test", 1, []int{0, 0, 0, 0, 1, 0, 0, 0, 0, 0}},
		{"slow.test", 1, []int{0, 0, 0, 0, 0, 1, 0, 0, 0, 0}},
	}
	if len(sh.Rows) != len(want) {
		t.Fatalf("rows %+v", sh.Rows)
	}
	for i, w := range want {
		if r := sh.Rows[i]; r.Name != w.Name || r.Total != w.Total || !equalInts(r.Counts, w.Counts) {
			t.Errorf("row %d = %+v, want %+v", i, r, w)
		}
	}
	f.getJSON(t, "GET", "/api/shape?by=reason&limit=2", http.StatusOK, &sh)
	if len(sh.Rows) != 2 || sh.Rows[0].Name != "greylisted" || sh.Rows[0].Total != 3 || sh.More != 1 {
		t.Errorf("by reason: %+v", sh)
	}
	f.getJSON(t, "GET", "/api/shape?status=held", http.StatusOK, &sh)
	if sh.Total.Total != 1 {
		t.Errorf("held only: %+v", sh)
	}
	// A final recipient of a message still queued is not waiting.
	finishKeys(t, f.q, testNow, queue.Delivered, "", queue.Reply{}, queue.Key{ID: f.m1, Rcpt: 1})
	f.getJSON(t, "GET", "/api/shape", http.StatusOK, &sh)
	if sh.Total.Total != 4 {
		t.Errorf("after one delivery: %+v", sh.Total)
	}
	for _, bad := range []string{"by=sender", "status=delivered", "status=x", "limit=0"} {
		f.getJSON(t, "GET", "/api/shape?"+bad, http.StatusBadRequest, nil)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAgeBucket(t *testing.T) {
	tests := []struct {
		age  time.Duration
		want int
	}{
		{0, 0}, {5 * time.Minute, 0}, {5*time.Minute + 1, 1}, {80 * time.Minute, 4},
		{1280 * time.Minute, 8}, {1281 * time.Minute, 9}, {-time.Minute, 0},
	}
	for _, tc := range tests {
		if got := ageBucket(tc.age); got != tc.want {
			t.Errorf("ageBucket(%v) = %d, want %d", tc.age, got, tc.want)
		}
	}
}

// statusFixture adds what the status page's new sections show: outcomes
// per minute, a bounced (finished) message and a second greylisted one.
func statusFixture(t testing.TB) *fixture {
	recent := metrics.NewRecent()
	for i := range 30 {
		for range i % 7 {
			recent.Add("delivered", testNow.Add(-time.Duration(i)*time.Minute))
		}
		recent.Add("deferred", testNow.Add(-time.Duration(2*i)*time.Minute))
	}
	recent.Add("failed", testNow.Add(-3*time.Minute))
	f := newFixture(t, func(o *Options) { o.Recent = recent })
	bad := enqueue(t, f.q, "alice@example.org", testNow.Add(-20*time.Minute), "nobody@gone.test")
	finishKeys(t, f.q, testNow.Add(-3*time.Minute), queue.Failed, "no-such-user", noSuchUser, queue.Key{ID: bad})
	return f
}

func TestStatusPageSections(t *testing.T) {
	f := statusFixture(t)
	body := f.do(t, "GET", "/").Body.String()
	for _, want := range []string{
		`id="chart-delivered"`, `id="chart-deferred"`, `id="chart-bounced"`, `fill="#c62828"`,
		`id="shape"`, "<th>1280</th>", "<th>TOTAL</th>",
		`id="destinations"`, "new.test", "nothing learned", // queued, nothing learned
		`id="bounced"`, "nobody@gone.test", "550 5.1.1 no such user &lt;b&gt;here&lt;/b&gt;",
		`id="explanations"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	// Three greylisted rows (two deferrals shown, oldest messages) link
	// to one explanation, shown once.
	if n := strings.Count(body, "Nothing to fix: greyrelay retries from the same"); n != 1 {
		t.Errorf("the greylisting explanation is shown %d times, want once", n)
	}
	if n := strings.Count(body, `href="#why-1"`); n < 3 {
		t.Errorf("%d rows link to the first explanation, want at least 3", n)
	}
	if strings.Contains(body, "quiet.test") {
		t.Error("a destination with nothing queued and nothing learned is shown")
	}
}

// TestStatusPageNodeNameConflict: a node name two running processes share
// is said below the cluster table, with both admin URLs and the remedy.
func TestStatusPageNodeNameConflict(t *testing.T) {
	tests := []struct {
		name     string
		conflict string
		want     bool
	}{
		{"conflict", "http://10.0.0.2:8025", true},
		{"none", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, func(o *Options) {
				o.Nodes = func(context.Context) ([]ClusterNode, error) {
					return []ClusterNode{{Name: "relay1", AdminURL: "http://10.0.0.1:8025", ConflictWith: tt.conflict}}, nil
				}
				o.NodeStats = func(context.Context, ClusterNode) (Stats, error) { return Stats{}, nil }
			})
			body := f.do(t, "GET", "/").Body.String()
			const want = "Node name relay1 is used by two running processes (admin http://10.0.0.1:8025 and http://10.0.0.2:8025)"
			if !strings.Contains(body, `id="cluster"`) || strings.Contains(body, want) != tt.want ||
				strings.Contains(body, "cluster.node_name") != tt.want {
				t.Errorf("status page (cluster section %v) says the conflict: %v, want %v", strings.Contains(body, `id="cluster"`), !tt.want, tt.want)
			}
		})
	}
}

func TestStatusPageWithoutCharts(t *testing.T) {
	f := newFixture(t)
	if body := f.do(t, "GET", "/").Body.String(); strings.Contains(body, "chart-") {
		t.Error("charts shown without Options.Recent")
	}
}

// A chart spans the last hour, or 3 or 6 hours when its oldest outcome
// is older: a new relay's first outcomes are bars several pixels wide,
// not a one-pixel line at the edge of six hours. The relay's start is
// marked when it falls in the span.
func TestCharts(t *testing.T) {
	tests := []struct {
		name      string
		ago       []time.Duration // a delivery this long before testNow
		started   time.Duration   // the relay started this long before testNow
		span      string
		bars      []chartBar // of the delivered chart
		startedX  int
		firstTick string
		wantEmpty bool
	}{
		{name: "new relay, nothing yet", started: 2 * time.Minute, span: "hour", startedX: 57 * 6, wantEmpty: true,
			firstTick: testNow.Add(-59 * time.Minute).UTC().Format("15:04")},
		{name: "new relay, one delivery", ago: []time.Duration{time.Minute}, started: 2 * time.Minute, span: "hour",
			bars: []chartBar{{X: 58 * 6, Y: 0, W: 5, H: chartHeight}}, startedX: 57 * 6},
		{name: "busy minute and a quiet one", ago: []time.Duration{0, 0, 0, 0, 50 * time.Minute}, started: 2 * time.Hour, span: "hour",
			bars: []chartBar{{X: 9 * 6, Y: chartHeight - 12, W: 5, H: 12}, {X: 59 * 6, Y: 0, W: 5, H: chartHeight}}, startedX: -1},
		{name: "restored from an hour ago", ago: []time.Duration{time.Hour, 0}, started: time.Minute, span: "3 hours",
			bars: []chartBar{{X: 119 * 2, Y: 0, W: 2, H: chartHeight}, {X: 179 * 2, Y: 0, W: 2, H: chartHeight}}, startedX: 178 * 2},
		{name: "five hours", ago: []time.Duration{5 * time.Hour}, started: 10 * time.Hour, span: "6 hours",
			bars: []chartBar{{X: 59, Y: 0, W: 1, H: chartHeight}}, startedX: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := metrics.NewRecent()
			for _, d := range tt.ago {
				r.Add("delivered", testNow.Add(-d))
			}
			cs, ax := charts(r, testNow, testNow.Add(-tt.started))
			if ax.Span != tt.span || ax.Started != tt.startedX || ax.Empty != tt.wantEmpty || len(ax.Ticks) != 3 {
				t.Errorf("axis %+v, want span %q, started at %d, empty %v", ax, tt.span, tt.startedX, tt.wantEmpty)
			}
			if tt.firstTick != "" && ax.Ticks[0] != tt.firstTick {
				t.Errorf("first tick %q, want %q", ax.Ticks[0], tt.firstTick)
			}
			if d := cs[0]; d.ID != "delivered" || d.Total != len(tt.ago) || !slices.Equal(d.Bars, tt.bars) {
				t.Errorf("delivered chart: total %d, bars %+v; want %d, %+v", d.Total, d.Bars, len(tt.ago), tt.bars)
			}
			for _, c := range cs {
				for _, b := range c.Bars {
					if b.X < 0 || b.X+b.W > chartWidth {
						t.Errorf("%s: bar %+v outside the chart", c.ID, b)
					}
				}
			}
			if len(cs[2].Bars) != 0 || cs[2].Total != 0 {
				t.Errorf("bounced chart %+v", cs[2])
			}
		})
	}
}
