package integration

// Hot reload of users_file and api.tokens_file with the real binary: a
// user or token added while the relay runs works after SIGHUP, or by
// itself within seconds of the file's change, and a session authenticated
// before the reload keeps working.

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// userLine runs `greyrelay user add NAME` with NAME-pw as the password.
func userLine(t *testing.T, name string) string {
	t.Helper()
	cmd := exec.Command(peers.Binary(t), "user", "add", name)
	cmd.Stdin = strings.NewReader(name + "-pw\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("user add %s: %v", name, err)
	}
	return string(out)
}

func TestUsersAndTokensReloadWithoutRestart(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	dir := t.TempDir()
	users := filepath.Join(dir, "users")
	if err := os.WriteFile(users, []byte(userLine(t, "alice")), 0o600); err != nil {
		t.Fatal(err)
	}
	r, api, _ := startAPIRelay(t, n, dir, "users_file="+users, "trusted_networks=[]")
	reloads := func(cause string) int {
		return strings.Count(r.Log(), cause+": users_file and api.tokens_file reloaded")
	}
	waitReload := func(cause string, before int) {
		t.Helper()
		relaytest.Eventually(t, 20*time.Second, cause+" reload", func() error {
			if reloads(cause) <= before {
				return os.ErrNotExist
			}
			return nil
		})

	}
	send := func(user string) (string, int) {
		m := peers.SwaksMessage{Server: r.SMTPAddr, From: user + "@users.test", To: []string{user + "@dest.test"},
			Args: []string{"--auth", "PLAIN", "--auth-user", user, "--auth-password", user + "-pw"}}
		return m.Send(t)
	}

	// alice's session, authenticated before any reload.
	held, err := smtp.Dial(r.SMTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := held.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	if err := held.Auth(sasl.NewPlainClient("", "alice", "alice-pw")); err != nil {
		t.Fatal(err)
	}
	if out, code := send("bob"); code == 0 || !strings.Contains(out, "535 5.7.8") {
		t.Fatalf("bob before he was added: swaks exit %d\n%s", code, out)
	}

	// bob replaces alice in the file; SIGHUP.
	before := reloads("SIGHUP")
	if err := os.WriteFile(users+".new", []byte(userLine(t, "bob")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(users+".new", users); err != nil {
		t.Fatal(err)
	}
	if err := r.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitReload("SIGHUP", before)
	if out, code := send("bob"); code != 0 {
		t.Errorf("bob after SIGHUP: swaks exit %d\n%s", code, out)
	}
	if out, code := send("alice"); code == 0 || !strings.Contains(out, "535 5.7.8") {
		t.Errorf("alice, removed: swaks exit %d\n%s", code, out)
	}
	// The session authenticated before the reload is neither dropped nor
	// stripped of its identity.
	if err := held.SendMail("alice@users.test", []string{"held@dest.test"}, strings.NewReader("Subject: held\r\n\r\nstill here\r\n")); err != nil {
		t.Errorf("alice's open session after the reload: %v", err)
	}

	// carol is appended, without a signal: the change is noticed.
	before = reloads("file changed")
	f, err := os.OpenFile(users, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(userLine(t, "carol"))
	f.Close()
	waitReload("file changed", before)
	if out, code := send("carol"); code != 0 {
		t.Errorf("carol after the file changed: swaks exit %d\n%s", code, out)
	}

	// A token added with `greyrelay token add` works the same way.
	before = reloads("file changed")
	cmd := exec.Command(peers.Binary(t), "token", "add", "-file", filepath.Join(dir, "tokens"), "crm")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	waitReload("file changed", before)
	if status, ans := apiPost(t, api, strings.TrimSpace(string(out)), "", map[string]any{"from": "crm@crm.test",
		"to": []string{"token@dest.test"}, "text": "hi"}); status != http.StatusAccepted {
		t.Errorf("the new token: %d %v", status, ans)
	}
	sink.WaitFor(t, 4, 30*time.Second)
}

// TestUserLimitsAtTheDoor: with user_limits, an AUTH user over its message
// rate gets 451 4.7.1 at MAIL from swaks, a token over its rate gets 429
// with Retry-After from the HTTP API, and the counts are per identity.
func TestUserLimitsAtTheDoor(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	dir := t.TempDir()
	users := filepath.Join(dir, "users")
	if err := os.WriteFile(users, []byte(userLine(t, "alice")+userLine(t, "bob")), 0o600); err != nil {
		t.Fatal(err)
	}
	r, api, token := startAPIRelay(t, n, dir, "users_file="+users, "trusted_networks=[]",
		"user_limits.messages_per_hour=2", "user_limits.recipients_per_day=3")
	send := func(user string, to ...string) (string, int) {
		m := peers.SwaksMessage{Server: r.SMTPAddr, From: user + "@users.test", To: to,
			Args: []string{"--auth", "PLAIN", "--auth-user", user, "--auth-password", user + "-pw"}}
		return m.Send(t)
	}
	for i := range 2 {
		if out, code := send("alice", "a@dest.test"); code != 0 {
			t.Fatalf("alice's message %d: swaks exit %d\n%s", i, code, out)
		}
	}
	if out, code := send("alice", "a@dest.test"); code == 0 || !strings.Contains(out, "451 4.7.1 Sending rate limit reached for alice: 2 messages per hour") {
		t.Errorf("alice's third message: swaks exit %d\n%s", code, out)
	}
	if out, code := send("bob", "b1@dest.test", "b2@dest.test", "b3@dest.test", "b4@dest.test"); code != 0 ||
		!strings.Contains(out, "452 4.5.3 Recipient rate limit reached for bob: 3 recipients per day") {
		t.Errorf("bob's four recipients: swaks exit %d\n%s", code, out)
	}
	msg := map[string]any{"from": "noreply@shop.example", "to": []string{"t@dest.test"}, "text": "hi"}
	for i := range 2 {
		if status, ans := apiPost(t, api, token, "", msg); status != http.StatusAccepted {
			t.Fatalf("token's message %d: %d %v", i, status, ans)
		}
	}
	if status, ans := apiPost(t, api, token, "", msg); status != http.StatusTooManyRequests || !strings.Contains(ans["smtp"].(string), "451 4.7.1") {
		t.Errorf("token's third message: %d %v", status, ans)
	}
	sink.WaitFor(t, 5, 30*time.Second)
	if v := metricValue(r.metrics(), "greyrelay_user_limited_total", map[string]string{"user": "alice", "limit": "messages"}); v != 1 {
		t.Errorf("greyrelay_user_limited_total{alice,messages} = %v", v)
	}
}
