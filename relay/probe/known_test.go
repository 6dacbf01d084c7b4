package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
	"github.com/greyrelay/greyrelay/relay/admin/admintest"
	"github.com/greyrelay/greyrelay/relay/config"
)

var (
	knownNow  = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	greyReply = queue.Reply{Code: 450, Enhanced: "4.2.0", Text: "Greylisted"}
)

const knownToken = "s3cret"

// knownQueue is a real queue that learned that example.test greylists,
// throttles and has a dead host, and that holds a deferred recipient
// there and a never-tried one at fresh.test, about which nothing was
// learned.
func knownQueue(t *testing.T) *queue.Queue {
	t.Helper()
	q, err := queue.Open(filepath.Join(t.TempDir(), "queue.db"), queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	id, err := q.Enqueue(queue.NewMessage{From: "a@relay.test", Body: []byte("Subject: x\r\n\r\nhi\r\n"),
		Arrival: knownNow.Add(-5 * time.Minute), To: []queue.NewRecipient{
			{Addr: "user@example.test", Domain: "example.test"}, {Addr: "new@fresh.test", Domain: "fresh.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	key, at := queue.Key{ID: id}, knownNow.Add(-4*time.Minute)
	if err := q.Begin(queue.Start{Keys: []queue.Key{key}, Time: at, LeaseUntil: at.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	_, err = q.Apply(queue.Update{
		Results: []queue.Result{{Key: key, Status: queue.Deferred, Reason: "greylisted", Reply: greyReply,
			Stage: "rcpt", End: at.Add(time.Second), NextAttempt: knownNow.Add(6 * time.Minute)}},
		Destinations: []queue.Destination{{Domain: "example.test", Greylists: true, GreylistSeen: 3, GreylistPassed: 2,
			LearnedDelay: 5 * time.Minute, ThrottleLevel: 1, ThrottledUntil: knownNow.Add(time.Hour),
			DeadHosts: map[string]time.Time{"mx2.example.test": knownNow.Add(30 * time.Minute)},
			LastReply: greyReply, Updated: at}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// adminClient serves q with the real admin server, which requires
// knownToken, started as serve starts it, and returns a client that
// presents token.
func adminClient(t *testing.T, q *queue.Queue, token string) *adminclient.Client {
	t.Helper()
	log, base := admintest.Listening(t)
	srv, err := admin.New(admin.Options{Queue: q, Now: func() time.Time { return knownNow }, Logger: log,
		Config: &config.Config{Admin: config.Admin{Address: "127.0.0.1:0", Token: knownToken}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return &adminclient.Client{Base: base(), Token: token}
}

// downClient is a client of an admin API where nothing listens.
func downClient() *adminclient.Client {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	return &adminclient.Client{Base: down.URL}
}

func TestAdminKnown(t *testing.T) {
	k, err := AdminKnown(adminClient(t, knownQueue(t), knownToken))(context.Background(), "example.test")
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
	rep := Report{Domain: "example.test", Time: knownNow, Knowledge: k, Verdict: Deferred, ExitCode: 1}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"greylists: seen 3 time(s), passed 2, learned delay 5m0s", "throttled (level 1) until",
		"dead host mx2.example.test", "1 recipient(s) queued", "<user@example.test>: deferred greylisted"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
}

// TestQueueKnown: in process, the probe sees exactly what it sees through
// the admin API, JSON and all.
func TestQueueKnown(t *testing.T) {
	q := knownQueue(t)
	now := func() time.Time { return knownNow }
	c := adminClient(t, q, knownToken)
	for _, dom := range []string{"example.test", "fresh.test", "unknown.test"} {
		direct, err1 := QueueKnown(q, now)(context.Background(), dom)
		viaAPI, err2 := AdminKnown(c)(context.Background(), dom)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v, %v", dom, err1, err2)
		}
		j1, _ := json.Marshal(direct)
		j2, _ := json.Marshal(viaAPI)
		if string(j1) != string(j2) {
			t.Errorf("%s: in process %s\nover HTTP %s", dom, j1, j2)
		}
	}
	k, _ := QueueKnown(q, now)(context.Background(), "example.test")
	if k.Destination == nil || k.QueuedTotal != 1 || k.Queued[0].Recipient != "user@example.test" {
		t.Errorf("knowledge %+v", k)
	}
}

func TestAdminKnown_NothingLearned(t *testing.T) {
	k, err := AdminKnown(adminClient(t, knownQueue(t), knownToken))(context.Background(), "fresh.test")
	if err != nil || k.Destination != nil || k.QueuedTotal != 1 || k.Queued[0].Status != "queued" {
		t.Errorf("knowledge %+v, %v", k, err)
	}
	var m map[string]any
	if b, _ := json.Marshal(k); json.Unmarshal(b, &m) != nil || m["destination"] != nil {
		t.Errorf("JSON %s", b)
	}
}

func TestAdminKnown_Errors(t *testing.T) {
	c := adminClient(t, knownQueue(t), "wrong")
	if _, err := AdminKnown(c)(context.Background(), "example.test"); err == nil ||
		errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong token: %v", err)
	}
	for _, c := range []*adminclient.Client{downClient(), {}} {
		_, err := AdminKnown(c)(context.Background(), "example.test")
		if !errors.Is(err, ErrNotRunning) || !strings.HasPrefix(err.Error(), "relay not running: ") {
			t.Errorf("base %q: %v", c.Base, err)
		}
	}
}

// TestRun_Knowledge: the probe reports the running relay's knowledge, or
// why it has none.
func TestRun_Knowledge(t *testing.T) {
	e := newEnv(t, 25)
	e.dns.NullMX("example.test")
	e.opt.Known = AdminKnown(downClient())
	rep, m := e.run(t, "example.test")
	if !strings.HasPrefix(rep.KnowledgeError, "relay not running") || rep.Knowledge != nil {
		t.Errorf("knowledge %+v, error %q", rep.Knowledge, rep.KnowledgeError)
	}
	if !strings.HasPrefix(get(t, m, "knowledge_error").(string), "relay not running") {
		t.Errorf("JSON %v", m["knowledge_error"])
	}
	e.opt.Known = QueueKnown(knownQueue(t), nil)
	rep, m = e.run(t, "example.test")
	if rep.Knowledge == nil || rep.KnowledgeError != "" || get(t, m, "knowledge", "destination", "greylists") != true ||
		get(t, m, "knowledge", "destination", "learned_delay_seconds") != 300.0 {
		t.Errorf("knowledge %+v, error %q", rep.Knowledge, rep.KnowledgeError)
	}
}
