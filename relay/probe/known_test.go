package probe

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// fakeAdmin serves the two admin API routes the probe reads, with the
// answers the real admin server gives, and records the requests.
func fakeAdmin(t *testing.T, learned bool) (*httptest.Server, *[]string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/destinations/{domain}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		mu.Lock()
		seen = append(seen, r.URL.String())
		mu.Unlock()
		if !learned {
			http.Error(w, `{"error":"nothing learned about example.test"}`, http.StatusNotFound)
			return
		}
		w.Write([]byte(`{"now":"2026-01-02T03:04:05Z","destinations":[{"domain":"example.test","greylists":true,
			"greylist_seen":3,"greylist_passed":2,"learned_delay_seconds":300,"throttle_level":1,
			"throttled_until":"2026-01-02T04:00:00Z","dead_hosts":[{"host":"mx2.example.test","until":"2026-01-02T03:30:00Z"}],
			"last_reply":{"code":450,"enhanced":"4.2.0","text":"Greylisted"}}]}`))
	})
	mux.HandleFunc("GET /api/queue", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.String())
		mu.Unlock()
		if r.URL.Query().Get("status") != "deferred" {
			w.Write([]byte(`{"now":"2026-01-02T03:04:05Z","total":0,"offset":0,"limit":20,"rows":[]}`))
			return
		}
		w.Write([]byte(`{"now":"2026-01-02T03:04:05Z","total":1,"offset":0,"limit":20,"rows":[{"id":"0000000000000001",
			"key":"0000000000000001/0","rcpt":0,"status":"deferred","reason":"greylisted","attempts":1,
			"next_attempt":"2026-01-02T03:10:00Z","last_reply":{"code":450,"enhanced":"4.2.0","text":"Greylisted"},
			"sender":"a@relay.test","recipient":"user@example.test","domain":"example.test",
			"arrival":"2026-01-02T03:00:00Z","age_seconds":245}]}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, &seen
}

func TestAdminKnown(t *testing.T) {
	srv, seen := fakeAdmin(t, true)
	k, err := AdminKnown(srv.URL, "s3cret", nil)(context.Background(), "example.test")
	if err != nil {
		t.Fatal(err)
	}
	d := k.Destination
	if d == nil || !d.Greylists || d.GreylistSeen != 3 || d.LearnedDelaySeconds != 300 || d.ThrottleLevel != 1 ||
		len(d.DeadHosts) != 1 || d.DeadHosts[0].Host != "mx2.example.test" || d.LastReply.Code != 450 {
		t.Errorf("destination %+v", d)
	}
	if k.QueuedTotal != 1 || len(k.Queued) != 1 || k.Queued[0].Reason != "greylisted" || k.Queued[0].NextAttempt == nil {
		t.Errorf("queued %+v", k.Queued)
	}
	if len(*seen) != 5 || !strings.Contains((*seen)[1], "domain=example.test") {
		t.Errorf("requests %q", *seen)
	}
	rep := Report{Domain: "example.test", Knowledge: k, Verdict: Deferred, ExitCode: 1}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"greylists: seen 3 time(s), passed 2, learned delay 5m0s", "dead host mx2.example.test",
		"1 recipient(s) queued", "<user@example.test>: deferred greylisted"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
}

func TestAdminKnown_NothingLearned(t *testing.T) {
	srv, _ := fakeAdmin(t, false)
	k, err := AdminKnown(srv.URL, "s3cret", nil)(context.Background(), "example.test")
	if err != nil || k.Destination != nil || k.QueuedTotal != 1 {
		t.Errorf("knowledge %+v, %v", k, err)
	}
}

func TestAdminKnown_Errors(t *testing.T) {
	srv, _ := fakeAdmin(t, true)
	if _, err := AdminKnown(srv.URL, "wrong", nil)(context.Background(), "example.test"); err == nil ||
		errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong token: %v", err)
	}
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	for _, base := range []string{down.URL, ""} {
		_, err := AdminKnown(base, "", nil)(context.Background(), "example.test")
		if !errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), "relay not running") {
			t.Errorf("base %q: %v", base, err)
		}
	}
}

// TestRun_Knowledge: the probe reports the running relay's knowledge, or
// why it has none.
func TestRun_Knowledge(t *testing.T) {
	e := newEnv(t, 25)
	e.dns.NullMX("example.test")
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	e.opt.Known = AdminKnown(down.URL, "", nil)
	rep, m := e.run(t, "example.test")
	if !strings.HasPrefix(rep.KnowledgeError, "relay not running") || rep.Knowledge != nil {
		t.Errorf("knowledge %+v, error %q", rep.Knowledge, rep.KnowledgeError)
	}
	if !strings.HasPrefix(get(t, m, "knowledge_error").(string), "relay not running") {
		t.Errorf("JSON %v", m["knowledge_error"])
	}
	srv, _ := fakeAdmin(t, true)
	e.opt.Known = AdminKnown(srv.URL, "s3cret", nil)
	rep, m = e.run(t, "example.test")
	if rep.Knowledge == nil || rep.KnowledgeError != "" || get(t, m, "knowledge", "destination", "greylists") != true {
		t.Errorf("knowledge %+v, error %q", rep.Knowledge, rep.KnowledgeError)
	}
}
