package integration

// Delivery events for applications with the real binary: a webhook
// receiver started here (failing for a while, hanging while the relay is
// SIGKILLed, restarting), the event file, and docs/events.md's Python verification
// snippet run as written on every POST.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// hookPost is one POST the receiver read.
type hookPost struct {
	Path      string `json:"path"`
	Timestamp string `json:"timestamp"`
	Signature string `json:"signature"`
	Body      []byte `json:"body"`
	status    int    // what the receiver answered; 0 if the client was gone
}

// hookReceiver is an application's webhook endpoint on loopback whose
// behaviour the test switches: "fail" answers 503, "hang" takes each
// request's events and holds it until released, then drops the
// connection without an answer, "slow" takes them and answers too late,
// "ok" answers 200.
type hookReceiver struct {
	t    *testing.T
	addr string

	mu    sync.Mutex
	mode  string
	srv   *http.Server
	posts []*hookPost
	hung  chan struct{} // a request is being held (capacity 1)
	free  chan struct{} // closed to release held requests
}

func startHookReceiver(t *testing.T, ip string) *hookReceiver {
	h := &hookReceiver{t: t, addr: peers.FreeAddr(t, ip), mode: "fail", hung: make(chan struct{}, 1), free: make(chan struct{})}
	h.listen()
	t.Cleanup(h.stop)
	return h
}

func (h *hookReceiver) listen() {
	var l net.Listener
	var err error
	for range 50 { // the address may linger a moment after a stop
		if l, err = net.Listen("tcp", h.addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		h.t.Fatalf("receiver: %v", err)
	}
	srv := &http.Server{Handler: h}
	h.mu.Lock()
	h.srv = srv
	h.mu.Unlock()
	go srv.Serve(l)
}

func (h *hookReceiver) stop() {
	h.mu.Lock()
	srv := h.srv
	h.mu.Unlock()
	srv.Close()
}

func (h *hookReceiver) setMode(m string) {
	h.mu.Lock()
	h.mode = m
	h.mu.Unlock()
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	p := &hookPost{Path: r.URL.Path, Timestamp: r.Header.Get("X-Greyrelay-Timestamp"),
		Signature: r.Header.Get("X-Greyrelay-Signature"), Body: body}
	h.mu.Lock()
	h.posts = append(h.posts, p)
	mode := h.mode
	h.mu.Unlock()
	switch mode {
	case "fail":
		w.WriteHeader(http.StatusServiceUnavailable)
		h.mu.Lock()
		p.status = 503
		h.mu.Unlock()
	case "hang":
		// The application takes the events in, and its answer never
		// reaches the relay: they must come again, with the same IDs.
		h.mu.Lock()
		p.status = 200
		h.mu.Unlock()
		select {
		case h.hung <- struct{}{}:
		default:
		}
		select {
		case <-h.free:
		case <-r.Context().Done():
		}
		// No answer at all: the connection is dropped.
		panic(http.ErrAbortHandler)
	case "slow":
		// Takes the events in and answers only once the relay has
		// given up on the answer (its events.timeout, 5s, ran out and it
		// closed the connection): the relay sends them again.
		h.mu.Lock()
		p.status = 200
		h.mu.Unlock()
		select {
		case h.hung <- struct{}{}:
		default:
		}
		<-r.Context().Done()
		w.WriteHeader(http.StatusOK)
	default:
		w.WriteHeader(http.StatusOK)
		h.mu.Lock()
		p.status = 200
		h.mu.Unlock()
	}
}

// received returns the events of the POSTs answered 200, by path.
func (h *hookReceiver) received(t *testing.T) map[string][]map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string][]map[string]any{}
	for _, p := range h.posts {
		if p.status != 200 {
			continue
		}
		var evs []map[string]any
		if err := json.Unmarshal(p.Body, &evs); err != nil {
			t.Fatalf("POST body is not a JSON array of events: %v\n%s", err, p.Body)
		}
		out[p.Path] = append(out[p.Path], evs...)
	}
	return out
}

// readmeEventsYAML returns docs/events.md's events example.
func readmeEventsYAML(t *testing.T) map[string]any {
	blocks := recipeBlocks(t, "TestEventsWebhookAndFile")
	if len(blocks) != 2 || blocks[0].Lang != "yaml" || blocks[1].Lang != "python" {
		t.Fatalf("docs/events.md's blocks for TestEventsWebhookAndFile: want the events example and the Python snippet: %+v", blocks)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(blocks[0].Text), &cfg); err != nil {
		t.Fatalf("docs/events.md's events example: %v", err)
	}
	return cfg["events"].(map[string]any)
}

// readmeVerify runs docs/events.md's Python snippet, as written, on every POST
// (and on each POST with its body changed, which must fail).
func readmeVerify(t *testing.T, dir string, secret []byte, posts []*hookPost) {
	if _, err := exec.LookPath("python3"); err != nil {
		if os.Getenv("GREYRELAY_REQUIRE_PEERS") != "" {
			t.Fatal("python3 is missing")
		}
		t.Skip("python3 is missing")
	}
	snippet := recipeBlocks(t, "TestEventsWebhookAndFile")[1].Text
	driver := `
import base64, json, sys
secret = open(sys.argv[1], "rb").read().rstrip(b"\r\n")
for p in json.load(open(sys.argv[2])):
    headers = {"X-Greyrelay-Timestamp": p["timestamp"], "X-Greyrelay-Signature": p["signature"]}
    body = base64.b64decode(p["body"])
    print(verify(secret, headers, body), verify(secret, headers, body + b" "))
`
	script := filepath.Join(dir, "verify.py")
	if err := os.WriteFile(script, append([]byte(snippet), driver...), 0o600); err != nil {
		t.Fatal(err)
	}
	secretPath, postsPath := filepath.Join(dir, "secret"), filepath.Join(dir, "posts.json")
	js, _ := json.Marshal(posts)
	if err := os.WriteFile(secretPath, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(postsPath, js, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("python3", script, secretPath, postsPath).CombinedOutput()
	if err != nil {
		t.Fatalf("docs/events.md's snippet: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(posts) {
		t.Fatalf("docs/events.md's snippet checked %d POSTs, want %d:\n%s", len(lines), len(posts), out)
	}
	for i, l := range lines {
		if l != "True False" {
			t.Errorf("POST %d: docs/events.md's snippet says %q (want the signature valid, and invalid for a changed body)", i, l)
		}
	}
}

// TestEventsWebhookAndFile: messages tagged by the application, delivered,
// deferred (greylisted first) and bounced, while the webhook receiver
// fails, then hangs while the relay is SIGKILLed, then restarts and
// answers too slowly for a while. Every
// event arrives (none lost) on the webhook that asked for all events and
// in the file, the filtered webhook gets only its kinds, duplicates carry
// the same ID and content, every signature passes docs/events.md's Python check,
// and the tag header (events.tag: strip) never reaches the destination.
func TestEventsWebhookAndFile(t *testing.T) {
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{Rcpt: func(rcpt string, attempt int) *smtp.SMTPError {
		switch {
		case strings.HasPrefix(rcpt, "bad"):
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		case strings.HasPrefix(rcpt, "grey") && attempt == 1:
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 7, 1}, Message: "greylisted, try again later"}
		}
		return nil
	}})
	hook := startHookReceiver(t, n.host(""))
	dir := t.TempDir()
	secret := []byte("s3cret-for-the-test\n")
	secretFile := filepath.Join(dir, "webhook.secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	// docs/events.md's example as written, with this test's receiver and files,
	// beside a webhook that takes every event.
	readme := readmeEventsYAML(t)
	filtered := readme["webhooks"].([]any)[0].(map[string]any)
	filtered["url"], filtered["secret_file"] = "http://"+hook.addr+"/filtered", secretFile
	all := map[string]any{"url": "http://" + hook.addr + "/all", "secret_file": secretFile}
	eventFile := filepath.Join(dir, "events.jsonl")
	evCfg, _ := json.Marshal(map[string]any{"file": eventFile, "tag": "strip", "timeout": "5s", "batch_size": 5,
		"webhooks": []any{filtered, all}})
	r := n.relay("events=" + string(evCfg))

	type sent struct{ id, tag string }
	var msgs []sent
	send := func(i int) {
		tag := fmt.Sprintf("order-%d", i)
		to := []string{fmt.Sprintf("ok%d@dest.test", i)}
		if i%3 == 0 {
			to = append(to, fmt.Sprintf("grey%d@dest.test", i))
		}
		if i%4 == 0 {
			to = append(to, fmt.Sprintf("bad%d@dest.test", i))
		}
		data := fmt.Sprintf("From: <app@src.test>\r\nTo: <%s>\r\nSubject: event %d\r\nMessage-ID: <%d@src.test>\r\nX-Greyrelay-Tag: %s\r\n\r\nbody %d\r\n",
			to[0], i, i, tag, i)
		id := r.send(peers.SwaksMessage{From: "app@src.test", To: to, Data: []byte(data)})
		msgs = append(msgs, sent{id, tag})
	}
	for i := range 8 {
		send(i)
	}
	// The receiver fails: POSTs come and are retried.
	relaytest.Eventually(t, 30*time.Second, "failed POSTs", func() error {
		if v := metricValue(r.metrics(), "greyrelay_events_failed_total", nil); v < 2 {
			return fmt.Errorf("%v failed POSTs", v)
		}
		return nil
	})

	// The receiver hangs; the relay dies in the middle of a POST.
	hook.setMode("hang")
	select {
	case <-hook.hung:
	case <-time.After(30 * time.Second):
		t.Fatal("no POST reached the hanging receiver")
	}
	r.Kill()
	close(hook.free)
	r.Restart(t)
	// The receiver restarts: refused connections for a while, then 200.
	hook.stop()
	for i := 8; i < 12; i++ {
		send(i)
	}
	relaytest.Eventually(t, 30*time.Second, "a POST refused while the receiver is away", func() error {
		if v := metricValue(r.metrics(), "greyrelay_events_failed_total", nil); v < 1 {
			return fmt.Errorf("%v failed POSTs since the restart", v)
		}
		return nil
	})
	select { // the hung POST's signal, if it came twice
	case <-hook.hung:
	default:
	}
	hook.setMode("slow")
	hook.listen()
	select {
	case <-hook.hung:
	case <-time.After(60 * time.Second):
		t.Fatal("no POST reached the slow receiver")
	}
	hook.setMode("ok")

	want := map[string]string{} // "queue_id rcpt event" → tag
	for i, m := range msgs {
		rcpts := []string{fmt.Sprintf("ok%d@dest.test", i)}
		for _, k := range []string{"accepted", "delivered"} {
			want[m.id+" "+rcpts[0]+" "+k] = m.tag
		}
		if i%3 == 0 {
			for _, k := range []string{"accepted", "deferred", "delivered"} {
				want[fmt.Sprintf("%s grey%d@dest.test %s", m.id, i, k)] = m.tag
			}
		}
		if i%4 == 0 {
			// 550 5.1.1 also puts the address on the suppression list
			// (on by default), which is an event of its own.
			for _, k := range []string{"accepted", "bounced", "suppressed"} {
				want[fmt.Sprintf("%s bad%d@dest.test %s", m.id, i, k)] = m.tag
			}
		}
	}
	key := func(e map[string]any) string { return fmt.Sprintf("%v %v %v", e["queue_id"], e["rcpt"], e["event"]) }
	relaytest.Eventually(t, 90*time.Second, "every event on the webhook", func() error {
		got := map[string]bool{}
		for _, e := range hook.received(t)["/all"] {
			got[key(e)] = true
		}
		for k := range want {
			if !got[k] {
				return fmt.Errorf("missing %s (of %d)", k, len(want))
			}
		}
		return nil
	})

	relaytest.Eventually(t, 30*time.Second, "no event pending", func() error {
		if v := metricValue(r.metrics(), "greyrelay_events_pending", nil); v != 0 {
			return fmt.Errorf("%v pending", v)
		}
		return nil
	})

	rcv := hook.received(t)
	// Every event names the node that holds the message: with no
	// cluster.node_name, its hostname.
	for _, e := range rcv["/all"] {
		if e["node"] != "relay.test" {
			t.Errorf("event %s names the node %v, want relay.test", key(e), e["node"])
			break
		}
	}
	dups := checkEvents(t, "/all", rcv["/all"], want, key, true)
	filteredWant := map[string]string{}
	for k, tag := range want {
		if strings.HasSuffix(k, " delivered") || strings.HasSuffix(k, " bounced") {
			filteredWant[k] = tag
		}
	}
	dups += checkEvents(t, "/filtered", rcv["/filtered"], filteredWant, key, true)
	if dups == 0 {
		t.Error("no event came twice, yet the relay was killed while a POST whose events were taken waited for its answer")
	}
	lines, err := os.ReadFile(eventFile)
	if err != nil {
		t.Fatal(err)
	}
	var fileEvents []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("event file line %q: %v", l, err)
		}
		fileEvents = append(fileEvents, e)
	}
	checkEvents(t, "event file", fileEvents, want, key, false)

	for _, m := range sink.Messages() {
		if bytes.Contains(bytes.ToLower(m.Data), []byte("x-greyrelay-tag")) {
			t.Errorf("the tag header reached the destination:\n%s", m.Data)
		}
	}
	// logrotate: the file is moved away and the relay told with SIGHUP;
	// the next events go to a new file of the same name.
	if err := os.Rename(eventFile, eventFile+".1"); err != nil {
		t.Fatal(err)
	}
	if err := r.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	send(12)
	relaytest.Eventually(t, 30*time.Second, "events in the reopened file", func() error {
		b, err := os.ReadFile(eventFile)
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte(`"queue_id":"`+msgs[12].id+`"`)) || !bytes.Contains(b, []byte(`"event":"delivered"`)) {
			return fmt.Errorf("the new file holds %q", b)
		}
		return nil
	})

	if b, _ := os.ReadFile(eventFile + ".1"); bytes.Contains(b, []byte(msgs[12].id)) {
		t.Error("an event after SIGHUP went to the rotated file")
	}

	hook.mu.Lock()
	posts := append([]*hookPost(nil), hook.posts...)
	hook.mu.Unlock()
	t.Logf("%d POSTs, %d events on /all, %d in the file", len(posts), len(rcv["/all"]), len(fileEvents))
	readmeVerify(t, t.TempDir(), secret, posts)
}

// checkEvents: every wanted event is there with its tag, each (queue ID,
// recipient, kind) has one ID but deferrals (one per attempt), a repeated
// ID repeats the same event, and nothing unwanted came when exact.
func checkEvents(t *testing.T, where string, evs []map[string]any, want map[string]string, key func(map[string]any) string, exact bool) (dups int) {
	t.Helper()
	byID := map[string]string{}
	ids := map[string]map[string]bool{}
	for _, e := range evs {
		js, _ := json.Marshal(e)
		id, _ := e["id"].(string)
		if id == "" {
			t.Errorf("%s: event without id: %s", where, js)
			continue
		}
		if prev, ok := byID[id]; ok {
			dups++
			if prev != string(js) {
				t.Errorf("%s: id %s came twice with different content:\n%s\n%s", where, id, prev, js)
			}
			continue
		}
		byID[id] = string(js)
		k := key(e)
		if ids[k] == nil {
			ids[k] = map[string]bool{}
		}
		ids[k][id] = true
		tag, ok := want[k]
		switch {
		case !ok && exact:
			t.Errorf("%s: unexpected event %s", where, js)
		case ok && e["tag"] != tag:
			t.Errorf("%s: event %s has tag %v, want %s", where, k, e["tag"], tag)
		}
		if ok && e["message_id"] == nil {
			t.Errorf("%s: event %s has no message_id", where, k)
		}
	}
	for k := range want {
		switch {
		case len(ids[k]) == 0:
			t.Errorf("%s: %s missing", where, k)
		case len(ids[k]) > 1 && !strings.HasSuffix(k, " deferred"):
			t.Errorf("%s: %s came with %d different IDs", where, k, len(ids[k]))
		}
	}
	t.Logf("%s: %d events, %d distinct, %d duplicates", where, len(evs), len(byID), dups)
	return dups
}
