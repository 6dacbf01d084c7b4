package integration

// Intake: a 250 means the message is on disk; the queue file has
// one owner; configuration files are checked before anything runs; users
// made with `greyrelay user add` can authenticate.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestIntakeSurvivesSIGKILL kills the relay with SIGKILL right after a 250
// (delivery is blocked: every MX address has nothing listening) and checks
// that after a restart the messages are still queued with every recipient
// pending, and that a second instance on the same queue file is refused.
func TestIntakeSurvivesSIGKILL(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	n.mxAddr("dest.test") // nothing listens there: connection refused
	n.mxAddr("other.test")
	r := n.relay()

	id1 := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"x@dest.test", "y@dest.test", "z@other.test"},
		Data: message("a@src.test", "x@dest.test", "kill one")})
	// The second one is cut off between the 250 and QUIT: the client has
	// its 250, the relay dies at once.
	id2 := submitThenKill(t, r, "b@src.test", "w@dest.test", message("b@src.test", "w@dest.test", "kill two"))
	if r.Running() {
		t.Fatal("relay still running after SIGKILL")
	}

	r.Restart(t)
	res := r.cli("queue", "list", "-json")
	if res.Code != 0 {
		t.Fatalf("queue list -json: %s", res)
	}
	var l apiList
	if err := json.Unmarshal([]byte(res.Stdout), &l); err != nil {
		t.Fatalf("queue list -json is not JSON: %v\n%s", err, res.Stdout)
	}
	want := map[string][]string{id1: {"x@dest.test", "y@dest.test", "z@other.test"}, id2: {"w@dest.test"}}
	for id, rcpts := range want {
		var got []string
		for _, row := range l.Rows {
			if row.ID != id {
				continue
			}
			got = append(got, row.Recipient)
			if !slices.Contains([]string{"queued", "deferred", "active"}, row.Status) {
				t.Errorf("after SIGKILL and restart, %s is %s, want it pending (queued, deferred or active)", row.Key, row.Status)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, rcpts) {
			t.Errorf("after SIGKILL and restart, message %s has recipients %v in the queue, want %v\n%s", id, got, rcpts, res.Stdout)
		}
	}

	// A second instance on the same queue file must refuse to start,
	// quickly (queue.lock_timeout is 2s), saying why.
	start := time.Now()
	second := runGreyrelay(t, r.Dir, "", nil, "serve", "-config", r.ConfigPath)
	took := time.Since(start)
	if second.Code == 0 || !strings.Contains(second.Stderr, "queue is locked by another greyrelay") {
		t.Errorf("second instance on the same queue: want a non-zero exit with \"queue is locked by another greyrelay\", got %s", second)
	}
	if took > 8*time.Second {
		t.Errorf("second instance took %v to give up, want a few seconds (lock_timeout 2s)", took)
	}
	if !r.Running() {
		t.Errorf("the first relay died when a second one tried the same queue")
	}
}

// submitThenKill submits one message with a Go SMTP client and SIGKILLs
// the relay the moment the 250 arrives, before QUIT. It returns the queue
// id from the 250.
func submitThenKill(t *testing.T, r *testRelay, from, to string, msg []byte) string {
	t.Helper()
	c, err := smtp.Dial(r.SMTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.CommandTimeout, c.SubmissionTimeout = 10*time.Second, 10*time.Second
	if err := c.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	if err := c.Mail(from, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt(to, nil); err != nil {
		t.Fatal(err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	resp, err := w.CloseWithResponse()
	r.Kill()
	if err != nil {
		t.Fatalf("end of data: %v", err)
	}
	m := regexp.MustCompile(`queued as ([0-9a-f]{16})`).FindStringSubmatch(resp.StatusText)
	if m == nil {
		t.Fatalf("250 reply %q has no queue id", resp.StatusText)
	}
	return m[1]
}

// TestIntakeConfigCheck runs `greyrelay config check` on every relay
// configuration shipped in configs/ and on broken ones, and compares
// `greyrelay config default` with configs/default.yaml.
func TestIntakeConfigCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert := peers.NewCert(t)
	users := filepath.Join(dir, "users")
	token := filepath.Join(dir, "token")
	line := runGreyrelay(t, dir, "password\n", nil, "user", "add", "alice")
	if line.Code != 0 {
		t.Fatalf("user add: %s", line)
	}
	for path, text := range map[string]string{users: line.Stdout, token: "s3cret-token\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tlsEnv := func(i int) []string {
		return []string{fmt.Sprintf("GREYRELAY_LISTENERS_%d_TLS_CERT=%s", i, cert.CertFile),
			fmt.Sprintf("GREYRELAY_LISTENERS_%d_TLS_KEY=%s", i, cert.KeyFile)}
	}
	// config check binds the listeners and the source address and writes
	// in the queue's directory, as serve would: hostEnv stands in for the
	// production host's addresses (ports below 1024 need root) and state
	// directory.
	ip := relaytest.Loopback(t)
	hostEnv := func(listeners int) []string {
		env := []string{"GREYRELAY_QUEUE_PATH=" + filepath.Join(dir, "queue.db"), "GREYRELAY_ADMIN_ADDRESS=" + peers.FreeAddr(t, ip)}
		for i := range listeners {
			env = append(env, fmt.Sprintf("GREYRELAY_LISTENERS_%d_ADDRESS=%s", i, peers.FreeAddr(t, ip)))
		}
		return env
	}
	// Every YAML file in configs/ is listed here, so that a new one is
	// either checked or explicitly not a relay configuration. missing
	// names the keys a plain check must complain about (files and
	// addresses that exist only on a production host); env supplies
	// stand-ins for them.
	shipped := map[string]struct {
		missing []string
		env     []string
	}{
		"default.yaml": {},
		"greyrelay.example.yaml": {
			missing: []string{"listeners[1].tls_cert", "listeners[2].tls_cert", "users_file", "delivery.source_ipv4: 192.0.2.10 is not bindable"},
			env: slices.Concat(tlsEnv(1), tlsEnv(2), hostEnv(3),
				[]string{"GREYRELAY_USERS_FILE=" + users, "GREYRELAY_DELIVERY_SOURCE_IPV4=" + ip}),
		},
		"container.yaml": {
			missing: []string{"admin.token_file", "users_file", "listeners[0].tls_cert"},
			env:     slices.Concat(tlsEnv(0), hostEnv(1), []string{"GREYRELAY_USERS_FILE=" + users, "GREYRELAY_ADMIN_TOKEN_FILE=" + token}),
		},
	}
	files, err := filepath.Glob("../configs/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no configs/*.yaml found (%v)", err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		c, ok := shipped[name]
		if !ok {
			t.Errorf("configs/%s is not known to this test: add it to the table", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			abs, _ := filepath.Abs(f)
			if len(c.missing) > 0 {
				res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", abs)
				if res.Code != 2 {
					t.Errorf("check without the production files: want exit 2, got %s", res)
				}
				// Every problem is reported at once, each naming its key.
				for _, k := range c.missing {
					if !strings.Contains(res.Stderr, k) {
						t.Errorf("check without the production files does not name %s:\n%s", k, res.Stderr)
					}
				}
			}
			res := runGreyrelay(t, dir, "", c.env, "config", "check", "-config", abs)
			if res.Code != 0 || !strings.Contains(res.Stdout, "configuration is valid") {
				t.Errorf("config check %s: want exit 0 and \"configuration is valid\", got %s", name, res)
			}
		})
	}

	bad := []struct {
		name, yaml string
		want       []string // all must appear in stderr
	}{
		{"open relay v4", "trusted_networks: [0.0.0.0/0]\n", []string{"trusted_networks", "0.0.0.0/0"}},
		{"open relay v6", "trusted_networks: [\"::/0\"]\n", []string{"trusted_networks", "::/0"}},
		{"limit zero", "limits:\n  max_connections: 0\n", []string{"limits.max_connections"}},
		{"message size zero", "limits:\n  max_message_bytes: 0\n", []string{"limits.max_message_bytes"}},
		{"unknown key", "limits:\n  max_conections: 10\n", []string{"unknown key", "max_conections"}},
		{"unknown top-level key", "queu:\n  path: x.db\n", []string{"unknown key", "queu"}},
		// A value of the wrong type is reported by YAML line, not by key.
		{"bad duration", "retry:\n  lifetime: 5 days\n", []string{"line 2", "lifetime"}},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "bad.yaml")
			if err := os.WriteFile(f, []byte(b.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", f)
			if res.Code != 2 {
				t.Errorf("config check of %q: want exit 2, got %s", b.yaml, res)
			}
			for _, w := range b.want {
				if !strings.Contains(res.Stderr, w) {
					t.Errorf("config check of %q: stderr does not name %q:\n%s", b.yaml, w, res.Stderr)
				}
			}
		})
	}

	t.Run("config default", func(t *testing.T) {
		want, err := os.ReadFile("../configs/default.yaml")
		if err != nil {
			t.Fatal(err)
		}
		res := runGreyrelay(t, dir, "", nil, "config", "default")
		if res.Code != 0 || res.Stdout != string(want) {
			t.Errorf("config default differs from configs/default.yaml (exit %d, %d bytes vs %d)", res.Code, len(res.Stdout), len(want))
		}
	})
}

// TestIntakeUserAddAuth makes users with `greyrelay user add`, puts the
// lines in users_file and authenticates with swaks on a loopback listener
// where nobody is trusted by address.
func TestIntakeUserAddAuth(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	dir := t.TempDir()
	alice := runGreyrelay(t, dir, "correct horse battery staple\n", nil, "user", "add", "alice")
	bob := runGreyrelay(t, dir, "bobs-password\n", nil, "user", "add", "bob", "-sender", "bob@src.test")
	for _, res := range []cliResult{alice, bob} {
		if res.Code != 0 || !regexp.MustCompile(`^[a-z]+:\$2[aby]?\$\d\d\$`).MatchString(res.Stdout) {
			t.Fatalf("user add: want a name:bcrypt line, got %s", res)
		}
		if strings.Contains(res.Stdout, "correct horse") || strings.Contains(res.Stdout, "bobs-password") {
			t.Fatalf("user add printed the password: %s", res.Stdout)
		}
	}
	users := filepath.Join(dir, "users")
	if err := os.WriteFile(users, []byte(alice.Stdout+bob.Stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	r := n.relay("users_file="+users, "trusted_networks=[]")

	auth := func(user, pass string) []string {
		return []string{"--auth", "PLAIN", "--auth-user", user, "--auth-password", pass}
	}
	msg := func(from string, args []string) peers.SwaksMessage {
		return peers.SwaksMessage{Server: r.SMTPAddr, From: from, To: []string{"x@dest.test"},
			Data: message(from, "x@dest.test", "auth"), Args: args}
	}
	r.send(msg("alice@src.test", auth("alice", "correct horse battery staple")))
	if got := sink.WaitFor(t, 1, 20*time.Second)[0]; got.From != "alice@src.test" {
		t.Errorf("sink got MAIL FROM %q, want alice@src.test", got.From)
	}
	cases := []struct {
		name, from string
		args       []string
		code       int    // swaks exit status
		reply      string // in swaks's output
	}{
		{"no AUTH, not trusted", "alice@src.test", nil, 24, "554 5.7.1"},
		{"wrong password", "alice@src.test", auth("alice", "wrong"), 28, "535"},
		{"sender not allowed for bob", "alice@src.test", auth("bob", "bobs-password"), 23, "553 5.7.1"},
		{"bob as himself", "bob@src.test", auth("bob", "bobs-password"), 0, "250 2.0.0 OK queued as"},
	}
	for _, c := range cases {
		out, code := msg(c.from, c.args).Send(t)
		if code != c.code || !strings.Contains(out, c.reply) {
			t.Errorf("%s: want swaks exit %d with %q, got %d:\n%s", c.name, c.code, c.reply, code, out)
		}
	}
}

// TestIntakeCheckQueueAtStart: `serve -check-queue` decodes every record
// at start (after a disk problem) and says what it found; the queued
// message is still there afterwards.
func TestIntakeCheckQueueAtStart(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	n.mxAddr("dest.test") // nothing listens there: the message stays queued
	ip := n.host("")
	r := &testRelay{Relay: peers.StartRelay(t, n.relayYAML(ip), peers.WithArgs("-check-queue")), t: t, IP: ip}
	id := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"x@dest.test"}, Data: message("a@src.test", "x@dest.test", "check")})
	r.Restart(t)
	log := r.Log()
	if !strings.Contains(log, "queue checked: every record decoded") || !strings.Contains(log, `"recipients":1`) {
		t.Errorf("no report of the check with the queued recipient in the log:\n%s", log)
	}
	res := r.cli("queue", "show", id)
	if res.Code != 0 {
		t.Errorf("queue show %s after the checked start: %s", id, res)
	}
}
