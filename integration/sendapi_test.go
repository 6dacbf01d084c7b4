package integration

// The HTTP sending API with the real binary: docs/sending-api.md's recipes
// (token add, curl, Python's urllib, Node's fetch) run as written against
// a relay delivering to a sink, and a message whose 202 was seen survives
// a SIGKILL right after it, as does its Idempotency-Key.

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	bolt "go.etcd.io/bbolt"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// apiDocAddr is the API address the recipes are written with.
const apiDocAddr = "127.0.0.1:8026"

// startAPIRelay makes a token with docs/sending-api.md's `token add`
// recipe in dir and starts a relay with the API on; it returns the relay,
// the API's base URL and the token.
func startAPIRelay(t *testing.T, n *mailNet, dir string, overrides ...string) (*testRelay, string, string) {
	t.Helper()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(peers.Binary(t), filepath.Join(bin, "greyrelay")); err != nil {
		t.Fatal(err)
	}
	add := apiRecipe(t, "sh", "greyrelay token add")
	runRecipe(t, dir, "sh", add, nil)
	token, err := os.ReadFile(filepath.Join(dir, "shop-token"))
	if err != nil {
		t.Fatal(err)
	}
	addr := peers.FreeAddr(t, "127.0.0.1")
	r := n.relay(append([]string{"api.address=" + addr, "api.tokens_file=" + filepath.Join(dir, "tokens")}, overrides...)...)
	return r, "http://" + addr, strings.TrimSpace(string(token))
}

// apiRecipe returns the one block of docs/sending-api.md in lang that
// contains marker.
func apiRecipe(t *testing.T, lang, marker string) string {
	t.Helper()
	var found []string
	for _, b := range recipeBlocks(t, "TestSendAPIRecipes") {
		if b.Lang == lang && strings.Contains(b.Text, marker) {
			found = append(found, b.Text)
		}
	}
	if len(found) != 1 {
		t.Fatalf("docs/sending-api.md: %d %s blocks with %q, want 1", len(found), lang, marker)
	}
	return found[0]
}

// runRecipe runs a recipe in dir, the documented addresses replaced by the
// test's (example.com is the sink's dest.test), with the binary first in
// PATH and the token in GREYRELAY_TOKEN. It returns the output.
func runRecipe(t *testing.T, dir, lang, text string, env []string) string {
	t.Helper()
	text = strings.NewReplacer("/etc/greyrelay/", dir+"/", "@example.com", "@dest.test").Replace(text)
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "API="); ok {
			text = strings.ReplaceAll(text, "http://"+apiDocAddr, v)
		}
	}
	var cmd *exec.Cmd
	switch lang {
	case "sh":
		cmd = exec.Command("sh", "-e", "-c", text)
	case "python":
		cmd = exec.Command("python3", "-c", text)
	case "js":
		file := filepath.Join(dir, "send.mjs")
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command("node", file)
	}
	cmd.Dir = dir
	cmd.Env = append(append(peers.CleanEnv(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH")), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s recipe: %v\n%s\n%s", lang, err, text, out)
	}
	return string(out)
}

// TestSendAPIRecipes runs every recipe of docs/sending-api.md: each
// message arrives once at the destination, with what its request asked
// for, and the repeated curl request (same Idempotency-Key) is answered
// again without a second message.
func TestSendAPIRecipes(t *testing.T) {
	peers.Require(t, "curl", "python3", "node")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	dir := t.TempDir()
	r, api, token := startAPIRelay(t, n, dir)
	env := []string{"API=" + api, "GREYRELAY_TOKEN=" + token}
	invoice := "From: Billing <billing@shop.example>\r\nTo: bob@dest.test\r\nSubject: Invoice\r\n" +
		"Message-ID: <invoice-7@shop.example>\r\n\r\nYour invoice.\r\n"
	if err := os.WriteFile(filepath.Join(dir, "invoice.eml"), []byte(invoice), 0o600); err != nil {
		t.Fatal(err)
	}

	curlJSON := apiRecipe(t, "sh", "Idempotency-Key")
	first := runRecipe(t, dir, "sh", curlJSON, env)
	again := runRecipe(t, dir, "sh", curlJSON, env)
	var a1, a2 map[string]any
	if json.Unmarshal([]byte(first), &a1) != nil || json.Unmarshal([]byte(again), &a2) != nil || a1["queue_id"] == nil ||
		a1["queue_id"] != a2["queue_id"] || a1["message_id"] != a2["message_id"] {
		t.Errorf("the repeated request's answer differs:\n%s\n%s", first, again)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(apiRecipe(t, "json", "queue_id")), &doc); err != nil {
		t.Fatalf("the documented answer is not JSON: %v", err)
	}
	if got, want := slices.Sorted(maps.Keys(a1)), slices.Sorted(maps.Keys(doc)); !slices.Equal(got, want) {
		t.Errorf("answer fields %v, documented %v", got, want)
	}
	runRecipe(t, dir, "sh", apiRecipe(t, "sh", "message/rfc822"), env)
	if out := runRecipe(t, dir, "python", apiRecipe(t, "python", "urllib"), env); !strings.HasPrefix(out, "202 ") {
		t.Errorf("python printed %q", out)
	}
	if out := runRecipe(t, dir, "js", apiRecipe(t, "js", "fetch"), env); !strings.HasPrefix(out, "202 ") {
		t.Errorf("node printed %q", out)
	}

	want := map[string][]string{
		"alice@dest.test": {"X-Greyrelay-Tag: order-confirmation", "multipart/alternative", "<p>Thank you for your order.</p>",
			"Received: from [127.0.0.1] ([127.0.0.1])", "From: \"Shop\" <noreply@shop.example>", "Subject: Your order 1001"},
		"bob@dest.test":   {"Message-ID: <invoice-7@shop.example>", "Your invoice."},
		"carol@dest.test": {"X-Greyrelay-Tag: password-reset", "Your code is 123456."},
		"dave@dest.test": {"X-Greyrelay-Tag: welcome", `filename=terms.txt`,
			base64.StdEncoding.EncodeToString([]byte("The terms.\n"))},
	}
	sink.WaitFor(t, len(want), 30*time.Second)
	r.waitQueueEmpty(30 * time.Second)
	msgs := sink.Messages()
	if len(msgs) != len(want) {
		t.Errorf("%d messages delivered, want %d (the repeated request must not send again)", len(msgs), len(want))
	}
	for _, m := range msgs {
		for _, s := range want[m.Rcpts[0]] {
			if !bytes.Contains(m.Data, []byte(s)) {
				t.Errorf("message to %s lacks %q:\n%s", m.Rcpts[0], s, m.Data)
			}
		}
		if bytes.Contains(m.Data, []byte("Bcc")) {
			t.Errorf("message to %s shows Bcc", m.Rcpts[0])
		}
	}
}

// apiPost posts a JSON message and returns the status and the answer.
func apiPost(t *testing.T, api, token, key string, msg map[string]any) (int, map[string]any) {
	t.Helper()
	body, _ := json.Marshal(msg)
	req, _ := http.NewRequest("POST", api+"/api/v1/messages", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var ans map[string]any
	if err := json.Unmarshal(raw, &ans); err != nil {
		t.Fatalf("%d %s: %v", resp.StatusCode, raw, err)
	}
	return resp.StatusCode, ans
}

// TestSendAPIKillAfter202: kill -9 right after each 202 loses no message,
// and the Idempotency-Key's answer survives the kill: the request repeated
// after the restart gets the same queue id and sends nothing more.
func TestSendAPIKillAfter202(t *testing.T) {
	peers.Require(t)
	t.Parallel()
	n := newMailNet(t)
	// Until the rounds are over the destination defers at MAIL, so at
	// every kill the message exists only in the relay's queue.
	var open atomic.Bool
	sink := n.sink("dest.test", peers.SinkOptions{Mail: func(string, int) *smtp.SMTPError {
		if !open.Load() {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "not yet"}
		}
		return nil
	}})
	r, api, token := startAPIRelay(t, n, t.TempDir())
	const rounds = 5
	ids := map[string]string{}
	for i := range rounds {
		key := fmt.Sprintf("kill-%d", i)
		msg := map[string]any{"from": "noreply@shop.example", "to": []string{fmt.Sprintf("u%d@dest.test", i)},
			"subject": key, "text": strings.Repeat("line of text\n", 200*i)}
		status, ans := apiPost(t, api, token, key, msg)
		if status != http.StatusAccepted {
			t.Fatalf("round %d: %d %v", i, status, ans)
		}
		r.Relay.Kill()
		r.Relay.Restart(t)
		ids[key] = ans["queue_id"].(string)
		status, again := apiPost(t, api, token, key, msg)
		if status != http.StatusAccepted || again["queue_id"] != ans["queue_id"] {
			t.Errorf("round %d: after the restart the same request got %d %v, want 202 %v", i, status, again, ans["queue_id"])
		}
	}
	// The instant between the queue's commit and the answer's record: the
	// last key is put back to pending, as a kill there would leave it, and
	// another key is left pending for a message that never reached the
	// queue. After the restart the first is answered from the queue (same
	// id, nothing sent again), the second is carried out once.
	if err := r.Relay.Stop(); err != nil {
		t.Fatal(err)
	}
	last := fmt.Sprintf("kill-%d", rounds-1)
	reopenPending(t, filepath.Join(r.Dir, "idempotency.db"), "shop", last, "")
	lostMsg := map[string]any{"from": "noreply@shop.example", "to": []string{"lost@dest.test"}, "text": "lost"}
	body, _ := json.Marshal(lostMsg)
	reopenPending(t, filepath.Join(r.Dir, "idempotency.db"), "shop", "lost", string(body))
	r.Relay.Restart(t)
	status, again := apiPost(t, api, token, last, map[string]any{"from": "noreply@shop.example",
		"to": []string{fmt.Sprintf("u%d@dest.test", rounds-1)}, "subject": last, "text": strings.Repeat("line of text\n", 200*(rounds-1))})
	if status != http.StatusAccepted || again["queue_id"] != ids[last] {
		t.Errorf("the interrupted key: %d %v, want 202 %s", status, again, ids[last])
	}
	for range 2 {
		if status, ans := apiPost(t, api, token, "lost", lostMsg); status != http.StatusAccepted {
			t.Errorf("the key whose message was never queued: %d %v", status, ans)
		}
	}
	open.Store(true)
	sink.WaitFor(t, rounds+1, 60*time.Second)
	r.waitQueueEmpty(30 * time.Second)
	got := map[string]int{}
	for _, m := range sink.Messages() {
		got[m.Rcpts[0]]++
	}
	for i := range rounds {
		if c := got[fmt.Sprintf("u%d@dest.test", i)]; c != 1 {
			t.Errorf("u%d: delivered %d times, want once", i, c)
		}
	}
	if got["lost@dest.test"] != 1 {
		t.Errorf("lost@: delivered %d times, want once", got["lost@dest.test"])
	}
}

// reopenPending rewrites user's Idempotency-Key key in the relay's
// (stopped) idempotency store as a process killed before it recorded the
// answer leaves it: pending, from another run. With body, a fresh record
// for that JSON request is written, naming a Message-ID no message has.
func reopenPending(t *testing.T, path, user, key, body string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	k := append([]byte{byte(len(user))}, user+key...)
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("keys"))
		rec := map[string]any{}
		if body == "" {
			if err := json.Unmarshal(b.Get(k), &rec); err != nil {
				return err
			}
		} else {
			h := sha256.New()
			fmt.Fprintf(h, "%s\x00%s\x00%s\x00", "application/json", "", user)
			h.Write([]byte(body))
			rec["fingerprint"], rec["created"], rec["message_id"] = h.Sum(nil), time.Now(), "<never-queued@relay.test>"
		}
		rec["run"], rec["done"] = "killed", false
		delete(rec, "status")
		delete(rec, "body")
		v, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		return b.Put(k, v)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSendAPIFindMessages runs docs/sending-api.md's queue commands: they
// find the messages by tag, ENVID and Message-ID while queued and, from
// the history, once delivered.
func TestSendAPIFindMessages(t *testing.T) {
	peers.Require(t)
	t.Parallel()
	n := newMailNet(t)
	var open atomic.Bool
	sink := n.sink("dest.test", peers.SinkOptions{Mail: func(string, int) *smtp.SMTPError {
		if !open.Load() {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "not yet"}
		}
		return nil
	}})
	dir := t.TempDir()
	r, api, token := startAPIRelay(t, n, dir)
	if status, ans := apiPost(t, api, token, "", map[string]any{"from": "noreply@shop.example",
		"to": []string{"alice@dest.test"}, "text": "hi", "tag": "order-confirmation"}); status != 202 {
		t.Fatalf("%d %v", status, ans)
	}
	raw := "From: billing@shop.example\r\nMessage-ID: <invoice-7@shop.example>\r\n\r\nYour invoice.\r\n"
	req, _ := http.NewRequest("POST", api+"/api/v1/messages?from=billing@shop.example&to=bob@dest.test&envid=invoice-7", strings.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "message/rfc822")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 202 {
		t.Fatalf("raw: %v %v", resp, err)
	}
	resp.Body.Close()

	env := []string{"GREYRELAY_CONFIG=" + r.ConfigPath}
	blocks := recipeBlocks(t, "TestSendAPIFindMessages")
	lines := strings.Split(strings.TrimSpace(blocks[0].Text), "\n")
	if len(lines) != 3 {
		t.Fatalf("the recipe has %d lines, want 3", len(lines))
	}
	want := []string{"alice@dest.test", "bob@dest.test", "<invoice-7@shop.example>"}
	run := func(when, status string) {
		for i, line := range lines {
			out := runRecipe(t, dir, "sh", line, env)
			if !strings.Contains(out, want[i]) || !strings.Contains(out, status) || strings.Contains(out, want[1-min(i, 1)]) {
				t.Errorf("%s: %s printed:\n%s\nwant %q and %q only", when, line, out, want[i], status)
			}
		}
	}
	relaytest.Eventually(t, 20*time.Second, "both messages deferred", func() error {
		if rows := r.rows(); len(rows) != 2 || rows[0].Status != "deferred" || rows[1].Status != "deferred" {
			return fmt.Errorf("%+v", rows)
		}
		return nil
	})

	run("queued", "deferred")
	open.Store(true)
	sink.WaitFor(t, 2, 30*time.Second)
	r.waitQueueEmpty(30 * time.Second)
	run("delivered", "delivered")
}
