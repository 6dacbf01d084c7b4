package admin

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// TestParseSelector: an action's selection takes the list filters,
// validated the same way (the error lists the valid values), tag, all and
// dry_run; it never defaults to the whole queue.
func TestParseSelector(t *testing.T) {
	tests := []struct {
		query string
		want  queue.Selector
		err   string
	}{
		{query: "domain=GREYLIST.Test.", want: queue.Selector{Domain: "greylist.test"}},
		{query: "status=deferred&reason=dns&dry_run=1", want: queue.Selector{Status: queue.Deferred, Reason: "dns", DryRun: true}},
		{query: "sender=a%40b.test&tag=news", want: queue.Selector{Sender: "a@b.test", Tag: "news"}},
		{query: "older_than=2d", want: queue.Selector{ArrivedBefore: testNow.Add(-48 * time.Hour)}},
		{query: "all=1", want: queue.Selector{All: true}},
		{query: "", err: "give a selection"},
		{query: "dry_run=1", err: "give a selection"},
		{query: "all=1&status=held", err: "takes no other selection"},
		{query: "status=defered", err: "want queued, deferred"},
		{query: "reason=greylist", err: "want one of greylisted"},
		{query: "older_than=2x", err: "older_than"},
		{query: "dry_run=yes&all=1", err: "dry_run"},
		{query: "domian=a.test", err: `unknown parameter "domian"`},
		{query: "limit=5&all=1", err: `unknown parameter "limit"`},
	}
	for _, tt := range tests {
		q, _ := url.ParseQuery(tt.query)
		got, err := parseSelector(q, testNow, true)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: %+v, %v; want an error with %q", tt.query, got, err, tt.err)
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("%q: %+v, %v; want %+v", tt.query, got, err, tt.want)
		}
	}
}

// TestSuspendAPI: suspend and resume through the API, in any spelling;
// the suspension shows in the destinations, the rows of its domain and
// the status page; bad requests are refused.
func TestSuspendAPI(t *testing.T) {
	f := newFixture(t)
	rec := f.do(t, "POST", "/api/destinations/suspend?domain=Greylist.TEST.&reason=migration&for=2h")
	var res SuspendResult
	if err := json.Unmarshal(rec.Body.Bytes(), &res); rec.Code != 200 || err != nil || res.Domain != "greylist.test" ||
		res.Suspension == nil || res.Suspension.Until == nil || !res.Suspension.Until.Equal(testNow.Add(2*time.Hour)) {
		t.Fatalf("suspend: %d %s", rec.Code, rec.Body)
	}
	var d Destinations
	if err := json.Unmarshal(f.do(t, "GET", "/api/destinations/greylist.test").Body.Bytes(), &d); err != nil ||
		len(d.Destinations) != 1 || d.Destinations[0].Suspended == nil || d.Destinations[0].Suspended.Reason != "migration" {
		t.Errorf("destination: %+v %v", d, err)
	}
	var l ListResult
	if err := json.Unmarshal(f.do(t, "GET", "/api/queue?domain=greylist.test").Body.Bytes(), &l); err != nil || len(l.Rows) == 0 {
		t.Fatalf("list: %+v %v", l, err)
	}
	for _, r := range l.Rows {
		if r.Suspended == nil {
			t.Errorf("row %s of the suspended domain is not marked", r.Key)
		}
	}
	if page := f.do(t, "GET", "/").Body.String(); !strings.Contains(page, "greylist.test: suspended, resumes in 2h (migration)") {
		t.Error("the status page does not show the suspension")
	}
	for _, bad := range []string{"domain=", "domain=%5B192.0.2.1%5D", "domain=a.test&for=-1h", "domain=a.test&for=soon",
		"domain=a.test&reason=" + strings.Repeat("x", 201), "domain=a.test&reason=a%0Ab"} {
		if rec := f.do(t, "POST", "/api/destinations/suspend?"+bad); rec.Code != 400 {
			t.Errorf("suspend?%s: %d %s", bad, rec.Code, rec.Body)
		}
	}
	rec = f.do(t, "POST", "/api/destinations/resume?domain=greylist.test")
	if err := json.Unmarshal(rec.Body.Bytes(), &res); rec.Code != 200 || err != nil || !res.WasSuspended {
		t.Errorf("resume: %d %s", rec.Code, rec.Body)
	}
	if page := f.do(t, "GET", "/").Body.String(); strings.Contains(page, "suspended") {
		t.Error("the status page still shows a suspension after resume")
	}
	nf := newFixture(t, func(o *Options) { o.Engine = nil })
	if rec := nf.do(t, "POST", "/api/destinations/suspend?domain=a.test"); rec.Code != 503 {
		t.Errorf("suspend without an engine: %d", rec.Code)
	}
}
