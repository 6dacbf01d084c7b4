package events

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/metrics"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// The signature matches one computed by Python's hmac module:
// hmac.new(b'k3y', b'1700000000.[{"id":"x"}]', hashlib.sha256).hexdigest()
func TestSignMatchesPython(t *testing.T) {
	got := Sign([]byte("k3y"), "1700000000", []byte(`[{"id":"x"}]`))
	if want := "sha256=8ebfa0dfde0f84f353f86610148c96258365bdc9a69de08c68ee90456ef9cc44"; got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func newMsg(to ...string) queue.NewMessage {
	m := queue.NewMessage{From: "app@x.test", Arrival: t0, EnvID: "env-1",
		Body: []byte("Message-ID: <m1@x.test>\r\nX-Greyrelay-Tag: order-7\r\nSubject: hi\r\n\r\nbody\r\n")}
	for _, a := range to {
		m.To = append(m.To, queue.NewRecipient{Addr: a, Domain: a[strings.IndexByte(a, '@')+1:]})
	}
	return m
}

func openQueue(t *testing.T, path string, ev *Events) *queue.Queue {
	t.Helper()
	q, err := queue.Open(path, queue.Options{OnAccept: ev.Accept, OnEvents: ev.Stored})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// recorder is a webhook receiver: it answers with the statuses of fail in
// turn (then 200) and keeps what it accepted.
type recorder struct {
	mu     sync.Mutex
	fail   []int
	times  []time.Time
	events []Event
	bodies [][]byte
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.times = append(r.times, time.Now())
	status := http.StatusOK
	if len(r.fail) > 0 {
		status, r.fail = r.fail[0], r.fail[1:]
	}
	if status == 200 {
		var evs []Event
		if err := json.Unmarshal(body, &evs); err != nil {
			return nil, err
		}
		if req.Header.Get(SignatureHeader) != Sign([]byte("s"), req.Header.Get(TimestampHeader), body) {
			return nil, errors.New("bad signature")
		}
		r.events = append(r.events, evs...)
		r.bodies = append(r.bodies, body)
	}
	return &http.Response{StatusCode: status, Status: http.StatusText(status), Body: io.NopCloser(strings.NewReader("")),
		Request: req}, nil
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	resp, err := r.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	w.WriteHeader(resp.StatusCode)
}

// A failing receiver is tried again after 1 s, 2 s, 4 s; the events leave
// the queue only once it took them, and the metrics say so.
func TestWebhookRetriesWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{fail: []int{503, 500, 502}}
		m := metrics.NewEvents(prometheus.NewRegistry())
		ev := New(Options{Webhooks: []Webhook{{URL: "https://app.test/hook", Secret: []byte("s")}},
			Client: &http.Client{Transport: rec}, Metrics: m})
		q := openQueue(t, filepath.Join(t.TempDir(), "q.db"), ev)
		defer q.Close()
		if _, err := q.Enqueue(newMsg("a@b.test", "c@d.test")); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { ev.Run(ctx, q); close(done) }()
		time.Sleep(time.Minute)
		synctest.Wait()
		rec.mu.Lock()
		var gaps []time.Duration
		for i := 1; i < len(rec.times); i++ {
			gaps = append(gaps, rec.times[i].Sub(rec.times[i-1]))
		}
		if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}; !equalDurations(gaps, want) {
			t.Errorf("gaps between POSTs %v, want %v", gaps, want)
		}
		if len(rec.events) != 2 || rec.events[0].Tag != "order-7" || rec.events[0].MessageID != "<m1@x.test>" {
			t.Errorf("received %+v", rec.events)
		}
		rec.mu.Unlock()
		label := "https://app.test/hook"
		for name, tt := range map[string]struct {
			c    prometheus.Collector
			want float64
		}{
			"failed":  {m.Failed.WithLabelValues(label), 3},
			"sent":    {m.Sent.WithLabelValues(label), 2},
			"pending": {m.Pending.WithLabelValues(label), 0},
		} {
			if got := testutil.ToFloat64(tt.c); got != tt.want {
				t.Errorf("%s = %v, want %v", name, got, tt.want)
			}
		}
		if n, _ := q.OutboxLen("webhook https://app.test/hook"); n != 0 {
			t.Errorf("%d events left in the queue", n)
		}
		cancel()
		<-done
	})
}

func equalDurations(a, b []time.Duration) bool {
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

// A receiver that is gone for longer than MaxAge loses the oldest events,
// counted and logged; the backoff never grows past five minutes.
func TestWebhookMaxAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fail := make([]int, 1000)
		for i := range fail {
			fail[i] = 503
		}
		rec := &recorder{fail: fail}
		m := metrics.NewEvents(prometheus.NewRegistry())
		ev := New(Options{Webhooks: []Webhook{{URL: "https://app.test/hook", Secret: []byte("s")}},
			Client: &http.Client{Transport: rec}, Metrics: m, MaxAge: time.Hour})
		q := openQueue(t, filepath.Join(t.TempDir(), "q.db"), ev)
		defer q.Close()
		msg := newMsg("a@b.test")
		msg.Arrival = time.Now()
		if _, err := q.Enqueue(msg); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { ev.Run(ctx, q); close(done) }()
		time.Sleep(59 * time.Minute)
		synctest.Wait()
		if got := testutil.ToFloat64(m.Dropped.WithLabelValues("https://app.test/hook")); got != 0 {
			t.Errorf("dropped %v before max_age", got)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if got := testutil.ToFloat64(m.Dropped.WithLabelValues("https://app.test/hook")); got != 1 {
			t.Errorf("dropped %v after max_age, want 1", got)
		}
		if n, _ := q.OutboxLen("webhook https://app.test/hook"); n != 0 {
			t.Errorf("%d events left in the queue", n)
		}
		rec.mu.Lock()
		for i := 1; i < len(rec.times); i++ {
			if gap := rec.times[i].Sub(rec.times[i-1]); gap > maxBackoff {
				t.Errorf("gap %v between POSTs", gap)
			}
		}
		rec.mu.Unlock()
		cancel()
		<-done
	})
}

// Events stored before a restart (acceptance and an outcome, committed
// with them) reach a real receiver after it, each once, with the IDs they
// were stored with; the event file gets the same events, webhooks only
// the kinds they asked for.
func TestEventsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	path, file := filepath.Join(dir, "q.db"), filepath.Join(dir, "events.jsonl")
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	hooks := []Webhook{{URL: srv.URL + "/all", Secret: []byte("s")},
		{URL: srv.URL + "/bounces", Secret: []byte("s"), Kinds: []Kind{Bounced}}}
	opt := Options{Webhooks: hooks, File: file}

	ev := New(opt)
	q := openQueue(t, path, ev)
	id, err := q.Enqueue(newMsg("a@b.test", "c@d.test"))
	if err != nil {
		t.Fatal(err)
	}
	qm, _ := q.Message(id)
	body, _ := q.Body(id)
	rs := []queue.Recipient{{Key: queue.Key{ID: id, Rcpt: 0}, Addr: "a@b.test"}, {Key: queue.Key{ID: id, Rcpt: 1}, Addr: "c@d.test"}}
	u := queue.Update{Results: []queue.Result{
		{Key: rs[0].Key, Status: queue.Deferred, Reason: "greylisted", End: t0.Add(time.Minute), NextAttempt: t0.Add(6 * time.Minute),
			Reply: queue.Reply{Code: 451, Enhanced: "4.7.1", Text: "greylisted"}, MXHost: "mx.b.test"},
		{Key: rs[1].Key, Status: queue.Failed, Reason: "no-such-user", End: t0.Add(time.Minute),
			Reply: queue.Reply{Code: 550, Enhanced: "5.1.1", Text: "no such user"}, MXHost: "mx.d.test"},
	}}
	for i := range u.Results {
		u.Results[i].Events = ev.Outcome(Outcome{Msg: qm, Head: body, Rcpt: rs[i], Result: u.Results[i], Attempt: 1, Status: "5.1.1"})
	}
	if _, err := q.Apply(u); err != nil {
		t.Fatal(err)
	}
	stored := map[string]Event{}
	for _, sink := range []string{"webhook " + hooks[0].URL, "webhook " + hooks[1].URL, "file"} {
		recs, _ := q.Outbox(sink, 100)
		for _, r := range recs {
			_, js, _ := decodeRecord(r.Data)
			var e Event
			if err := json.Unmarshal(js, &e); err != nil {
				t.Fatal(err)
			}
			stored[sink+" "+e.ID] = e
		}
	}
	q.Close()
	if len(stored) != 4+4+1 {
		t.Fatalf("stored %d events, want 4 for each of /all and the file and 1 for /bounces", len(stored))
	}

	ev2 := New(opt)
	q2 := openQueue(t, path, ev2)
	defer q2.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ev2.Run(ctx, q2); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		n1, _ := q2.OutboxLen("webhook " + hooks[0].URL)
		n2, _ := q2.OutboxLen("webhook " + hooks[1].URL)
		n3, _ := q2.OutboxLen("file")
		if n1+n2+n3 == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	ev2.Close()

	got := map[string]Event{}
	rec.mu.Lock()
	for _, e := range rec.events {
		got[e.ID] = e
	}
	nposted := len(rec.events)
	rec.mu.Unlock()
	lines, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var inFile []string
	for _, l := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
		var e Event
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("event file line %q: %v", l, err)
		}
		inFile = append(inFile, string(e.Event)+" "+e.Rcpt)
		if _, ok := stored["file "+e.ID]; !ok {
			t.Errorf("file has event %s that was not stored", e.ID)
		}
	}
	sort.Strings(inFile)
	if want := "[accepted a@b.test accepted c@d.test bounced c@d.test deferred a@b.test]"; strings.Join(inFile, " ") != strings.Trim(want, "[]") {
		t.Errorf("event file holds %v, want %s", inFile, want)
	}
	if nposted != 5 {
		t.Errorf("receiver got %d events, want 5 (4 on /all, 1 on /bounces)", nposted)
	}
	for k, e := range stored {
		if strings.HasPrefix(k, "file ") {
			continue
		}
		if g, ok := got[e.ID]; !ok || g.Event != e.Event {
			t.Errorf("stored event %s (%s) not received", e.ID, e.Event)
		}
	}
	for _, e := range got {
		if e.Event == Deferred && (e.NextAttempt == nil || e.Reason != "greylisted" || e.Explanation == "" || e.Reply == nil || e.Reply.Code != 451) {
			t.Errorf("deferred event %+v lacks next attempt, reason, explanation or reply", e)
		}
		if e.Event == Bounced && (e.DSN == nil || e.DSN.Status != "5.1.1" || e.DSN.DiagnosticCode != "smtp; 550 5.1.1 no such user" || e.DSN.RemoteMTA != "dns; mx.d.test") {
			t.Errorf("bounced event %+v lacks its DSN fields", e)
		}
		if e.Tag != "order-7" || e.MessageID != "<m1@x.test>" || e.QueueID != id.String() || e.From != "app@x.test" {
			t.Errorf("event %+v lacks tag, message ID, queue ID or sender", e)
		}
	}
}
