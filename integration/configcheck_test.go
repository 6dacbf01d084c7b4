package integration

// `config check` predicts `serve`: what the relay would refuse at start
// (an address it cannot bind, a queue directory it cannot write, a key
// its user cannot read) is refused by the check too, at the line of the
// file to fix; every command says which configuration it read; and the
// queue's place does not depend on the directory serve was started from.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// lineOf is the 1-based line of the first line of text containing s.
func lineOf(t *testing.T, text, s string) int {
	t.Helper()
	for i, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("no line contains %q:\n%s", s, text)
	return 0
}

// errorLines are the lines of an invalid configuration's report.
func errorLines(res cliResult) []string {
	_, after, _ := strings.Cut(res.Stderr, "greyrelay: invalid configuration:\n")
	return strings.Split(strings.TrimSpace(after), "\n")
}

// TestConfigCheckPredictsServe: for each thing serve refuses at start,
// config check fails too (exit 2), with the key's line, and serve's own
// refusal names the path once; a listener the running relay holds is a
// warning, not an error.
func TestConfigCheckPredictsServe(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	blocker := write("not-a-dir", "")
	queueDir := filepath.Join(dir, "queue-is-a-dir.db")
	if err := os.Mkdir(queueDir, 0o700); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, key, want string
		cfg             rbRelay
	}{
		{"unbindable source address", "source_ipv4", "delivery.source_ipv4: 192.0.2.10 is not bindable on this host",
			rbRelay{IP: ip, Delivery: map[string]string{"source_ipv4": `"192.0.2.10"`}}},
		{"queue directory cannot be created", "path:", "queue.path: cannot create " + blocker + ": not a directory",
			rbRelay{IP: ip, QueuePath: filepath.Join(blocker, "queue.db")}},
		{"queue file is a directory", "path:", "queue.path: " + queueDir + ": is a directory",
			rbRelay{IP: ip, QueuePath: queueDir}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			text := tc.cfg.YAML(t)
			f := filepath.Join(t.TempDir(), "greyrelay.yaml")
			if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			check := runGreyrelay(t, dir, "", nil, "config", "check", "-config", f)
			want := fmt.Sprintf("%s: line %d: %s", f, lineOf(t, text, tc.key), tc.want)
			if check.Code != 2 || !strings.Contains(check.Stderr, want) {
				t.Errorf("config check: want exit 2 and %q:\n%s", want, check)
			}
			serve := runGreyrelay(t, dir, "", nil, "serve", "-config", f)
			if serve.Code == 0 || !strings.Contains(serve.Stderr, tc.want) {
				t.Errorf("serve: want a refusal naming %q:\n%s", tc.want, serve)
			}
			// A read error names its path once (it was "open X: open X: …").
			for _, l := range strings.Split(serve.Stderr, "\n") {
				if strings.HasPrefix(l, "greyrelay: ") && strings.Contains(l, "queue") && strings.Count(l, tc.cfg.QueuePath) > 1 {
					t.Errorf("serve repeats the path: %s", l)
				}
			}
		})
	}

	t.Run("beside the running relay", func(t *testing.T) {
		r := peers.StartRelay(t, (&rbRelay{IP: ip}).YAML(t))
		res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", r.ConfigPath)
		if res.Code != 0 || !strings.Contains(res.Stdout, "configuration is valid") ||
			!strings.Contains(res.Stderr, fmt.Sprintf("warning: listeners[0].address: %s is in use (the relay running?)", r.SMTPAddr)) ||
			!strings.Contains(res.Stderr, fmt.Sprintf("warning: admin.address: %s is in use (the relay running?)", r.AdminAddr)) {
			t.Errorf("config check beside the running relay: want valid with two in-use warnings:\n%s", res)
		}
	})

	t.Run("every error at its line", func(t *testing.T) {
		c := rbRelay{IP: ip, Limits: map[string]string{"max_connections": "0"},
			Delivery: map[string]string{"source_ipv4": `"192.0.2.10"`, "max_per_destination": "0"}}
		text := c.YAML(t)
		f := write("many.yaml", text)
		res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", f)
		lines := errorLines(res)
		if res.Code != 2 || len(lines) != 3 {
			t.Fatalf("want exit 2 and three errors:\n%s", res)
		}
		prev := 0
		for _, l := range lines {
			var n int
			if _, err := fmt.Sscanf(strings.TrimPrefix(l, f+": "), "line %d:", &n); err != nil || n < prev {
				t.Errorf("error %q: not at a line of %s, in order", l, f)
			}
			prev = n
		}
	})

	t.Run("the EHLO name", func(t *testing.T) {
		for _, tc := range []struct{ host, want string }{
			{`""`, "warning: hostname is not set: the relay names itself"},
			{"vm", `warning: hostname: "vm" is not a fully qualified domain name`},
		} {
			c := rbRelay{IP: ip, Hostname: tc.host}
			f := write("host.yaml", c.YAML(t))
			res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", f)
			if res.Code != 0 || !strings.Contains(res.Stderr, tc.want) {
				t.Errorf("hostname %s: want valid with %q:\n%s", tc.host, tc.want, res)
			}
		}
		// serve warns at start too.
		r := peers.StartRelay(t, (&rbRelay{IP: ip, Hostname: "vm"}).YAML(t))
		if !strings.Contains(r.Log(), "WARN\tconfiguration: hostname: \"vm\" is not a fully qualified domain name") {
			t.Errorf("serve did not warn about the hostname:\n%s", r.Log())
		}
	})
}

// TestConfigCheckAsUser: -user checks every key and certificate against
// the permissions of the user serve will run as, without switching to it:
// a 0600 key owned by another user (what `dkim keygen` and openssl write
// as root) is an error naming LoadCredential=; the same key owned by that
// user is not. A user that does not exist (a systemd DynamicUser while
// the unit is stopped) owns nothing.
func TestConfigCheckAsUser(t *testing.T) {
	t.Parallel()
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody on this host")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	if uid == os.Getuid() {
		t.Skip("the tests run as nobody")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	keygen := runGreyrelay(t, dir, "", nil, "dkim", "keygen", "-algorithm", "ed25519", "-out", filepath.Join(dir, "dkim.key"), "example.com", "s1")
	if keygen.Code != 0 {
		t.Fatalf("dkim keygen: %s", keygen)
	}
	ip := relaytest.Loopback(t)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	text := (&rbRelay{IP: ip, QueuePath: filepath.Join(state, "queue.db")}).YAML(t) +
		"dkim:\n  domains:\n    example.com:\n      selectors:\n        - selector: s1\n          key_file: " + filepath.Join(dir, "dkim.key") + "\n"
	f := filepath.Join(dir, "greyrelay.yaml")
	if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", f); res.Code != 0 {
		t.Fatalf("as this user: want valid:\n%s", res)
	}
	res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", f, "-user", "nobody")
	for _, want := range []string{
		fmt.Sprintf("%s: line %d: dkim.domains.example.com.selectors[0].key_file: %s is not readable by user nobody (owner %d:", f, lineOf(t, text, "key_file"), filepath.Join(dir, "dkim.key"), os.Getuid()),
		"LoadCredential=",
		fmt.Sprintf("line %d: queue.path: %s: user nobody may not write in directory %s", lineOf(t, text, "path:"), filepath.Join(state, "queue.db"), state),
	} {
		if res.Code != 2 || !strings.Contains(res.Stderr, want) {
			t.Errorf("-user nobody: want exit 2 and %q:\n%s", want, res)
		}
	}
	res = runGreyrelay(t, dir, "", nil, "config", "check", "-config", f, "-user", "greyrelay-no-such-user")
	if res.Code != 2 || !strings.Contains(res.Stderr, "user greyrelay-no-such-user does not exist on this host now") ||
		!strings.Contains(res.Stderr, "is not readable by user greyrelay-no-such-user") {
		t.Errorf("-user of a DynamicUser: %s", res)
	}
	// What systemd's LoadCredential= does: the key handed over, owned by
	// the service's user, mode 0400; and a state directory it owns.
	if os.Getuid() != 0 {
		return // only root can give files away
	}
	for _, p := range []string{filepath.Join(dir, "dkim.key"), state} {
		if err := os.Chown(p, uid, -1); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "dkim.key"), 0o400); err != nil {
		t.Fatal(err)
	}
	if res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", f, "-user", "nobody"); res.Code != 0 {
		t.Errorf("-user nobody, key and state directory owned by nobody: want valid:\n%s", res)
	}
}

// TestCommandsSayWhichConfiguration: every command that reads the
// configuration says on stderr which file it used (stdout stays JSON),
// and finds the running relay's through $GREYRELAY_CONFIG as well as
// -config; an empty GREYRELAY_CONFIG is the embedded default.
func TestCommandsSayWhichConfiguration(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	sink := peers.StartSink(t, ip+":0", peers.SinkOptions{})
	r := peers.StartRelay(t, (&rbRelay{IP: ip, Routes: map[string]string{"ok.test": sink.Addr}}).YAML(t))
	env := []string{"GREYRELAY_CONFIG=" + r.ConfigPath}
	viaEnv := fmt.Sprintf("greyrelay: using configuration %s ($GREYRELAY_CONFIG)\n", r.ConfigPath)

	list := runGreyrelay(t, r.Dir, "", env, "queue", "list", "-json")
	var v any
	if list.Code != 0 || !strings.HasPrefix(list.Stderr, viaEnv) || json.Unmarshal([]byte(list.Stdout), &v) != nil && strings.TrimSpace(list.Stdout) != "" {
		t.Errorf("queue list -json: want JSON on stdout and %q on stderr:\n%s", viaEnv, list)
	}
	probe := runGreyrelay(t, t.TempDir(), "", env, "probe", "-json", "user@ok.test")
	var rep probeReport
	if probe.Code != 0 || !strings.HasPrefix(probe.Stderr, viaEnv) || json.Unmarshal([]byte(probe.Stdout), &rep) != nil || rep.Verdict != "accepted" {
		t.Errorf("probe with $GREYRELAY_CONFIG: want the relay's route (accepted):\n%s", probe)
	}
	health := runGreyrelay(t, t.TempDir(), "", nil, "health", "-config", r.ConfigPath)
	if want := fmt.Sprintf("greyrelay: using configuration %s (-config)\n", r.ConfigPath); health.Code != 0 || !strings.HasPrefix(health.Stderr, want) {
		t.Errorf("health -config: want %q:\n%s", want, health)
	}
	check := runGreyrelay(t, t.TempDir(), "", env, "config", "check")
	if check.Code != 0 || !strings.HasPrefix(check.Stdout, r.ConfigPath+": configuration is valid") {
		t.Errorf("config check with $GREYRELAY_CONFIG: %s", check)
	}
	embedded := runGreyrelay(t, t.TempDir(), "", []string{"GREYRELAY_CONFIG="}, "config", "check")
	if !strings.HasPrefix(embedded.Stdout, "(embedded default): configuration is valid") {
		t.Errorf("config check with an empty $GREYRELAY_CONFIG: %s", embedded)
	}
	if !strings.Contains(r.Log(), fmt.Sprintf(`using configuration %s (-config)`, r.ConfigPath)) {
		t.Errorf("serve does not log which configuration it read:\n%s", r.Log())
	}
}

// TestServeQueueInStateDirectory: a relative queue.path (the default's
// ./greyrelay-data) resolves against $STATE_DIRECTORY, which systemd's
// StateDirectory= sets, so the directory serve was started from does not
// matter; without it, a directory that cannot be created is an error that
// names the absolute path and what to do.
func TestServeQueueInStateDirectory(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	text := strings.Replace((&rbRelay{IP: ip}).YAML(t), "queue:\n  path: \"queue.db\"\n", "", 1)
	if strings.Contains(text, "queue:") {
		t.Fatalf("the queue section is still there:\n%s", text)
	}
	cwd := t.TempDir() // stands for "/" run as a user who may not write there
	if err := os.WriteFile(filepath.Join(cwd, "greyrelay-data"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "greyrelay.yaml")
	if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	res := runGreyrelay(t, cwd, "", nil, "serve", "-config", f)
	want := "greyrelay: queue.path: cannot create " + filepath.Join(cwd, "greyrelay-data") + ": not a directory " +
		`(queue.path "./greyrelay-data/queue.db" is relative to the directory greyrelay was started from): set queue.path to an absolute path`
	if res.Code == 0 || !strings.Contains(res.Stderr, want) {
		t.Errorf("serve from a directory it cannot use: want %q:\n%s", want, res)
	}
	state := t.TempDir()
	r := peers.StartRelay(t, text, peers.WithEnv("STATE_DIRECTORY="+state))
	if _, err := os.Stat(filepath.Join(state, "greyrelay-data", "queue.db")); err != nil {
		t.Errorf("queue not in $STATE_DIRECTORY: %v\n%s", err, r.Log())
	}
	if _, err := os.Stat(filepath.Join(r.Dir, "greyrelay-data")); err == nil {
		t.Errorf("queue created in the working directory %s too", r.Dir)
	}
}

// TestRecipeSystemdCredentials runs docs/operations.md's LoadCredential=
// recipe: the drop-in, beside configs/greyrelay.service, passes
// systemd-analyze verify; and the configuration naming the copies checks
// as systemd leaves them (owned by the service's user, mode 0400) with
// `config check -user`, while the same files as keygen leaves them (0600,
// another owner) are refused with the way out.
func TestRecipeSystemdCredentials(t *testing.T) {
	t.Parallel()
	blocks := recipeBlocks(t, "TestRecipeSystemdCredentials")
	if len(blocks) != 2 || blocks[0].Lang != "ini" || blocks[1].Lang != "yaml" {
		t.Fatalf("want the drop-in (ini) and the configuration (yaml), got %d blocks", len(blocks))
	}
	peers.SkipShort(t) // the blocks are there; running them needs the binary and systemd
	analyze, err := exec.LookPath("systemd-analyze")
	switch {
	case err != nil && os.Getenv("GREYRELAY_REQUIRE_PEERS") != "":
		t.Fatal("systemd-analyze is not installed (GREYRELAY_REQUIRE_PEERS is set)")
	case err == nil:
		b, err := os.ReadFile(filepath.Join(moduleRoot(t), "configs", "greyrelay.service"))
		if err != nil {
			t.Fatal(err)
		}
		units := t.TempDir()
		unit := filepath.Join(units, "greyrelay.service")
		dropIn := filepath.Join(units, "greyrelay.service.d", "credentials.conf")
		if err := os.MkdirAll(filepath.Dir(dropIn), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(unit, []byte(recipeText(t, "configs/greyrelay.service", string(b), "/usr/local/bin/greyrelay", peers.Binary(t))), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dropIn, []byte(blocks[0].Text), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(analyze, "verify", unit).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify with the drop-in: %v\n%s", err, out)
		}
	}

	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody on this host")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	creds := t.TempDir() // stands for /run/credentials/greyrelay.service
	for _, d := range []string{filepath.Dir(creds), creds} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if res := runGreyrelay(t, creds, "", nil, "dkim", "keygen", "-out", filepath.Join(creds, "dkim.key"), "example.com", "s2026"); res.Code != 0 {
		t.Fatalf("dkim keygen: %s", res)
	}
	cert := peers.NewCert(t, "relay.example.com")
	copyFile(t, cert.CertFile, filepath.Join(creds, "tls.crt"))
	copyFile(t, cert.KeyFile, filepath.Join(creds, "tls.key"))
	if err := os.Chmod(filepath.Join(creds, "tls.key"), 0o600); err != nil {
		t.Fatal(err)
	}
	ip := relaytest.Loopback(t)
	cfg := recipeText(t, blocks[1].File, blocks[1].Text, "/run/credentials/greyrelay.service/", creds+"/", "0.0.0.0:587", peers.FreeAddr(t, ip)) +
		fmt.Sprintf("hostname: relay.example.com\nadmin:\n  address: %s\n", peers.FreeAddr(t, ip))
	f := filepath.Join(t.TempDir(), "greyrelay.yaml")
	if err := os.WriteFile(f, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"GREYRELAY_QUEUE_PATH=" + filepath.Join(t.TempDir(), "queue.db")}
	res := runGreyrelay(t, creds, "", env, "config", "check", "-config", f, "-user", "nobody")
	for _, key := range []string{"dkim.domains.example.com.selectors[0].key_file", "listeners[0].tls_key"} {
		if res.Code != 2 || !strings.Contains(res.Stderr, key+": ") || !strings.Contains(res.Stderr, "LoadCredential=") {
			t.Errorf("keys as keygen and openssl leave them: want %s refused, naming LoadCredential=:\n%s", key, res)
		}
	}
	if os.Getuid() != 0 {
		return // only root can give files away, as systemd does
	}
	for _, name := range []string{"dkim.key", "tls.crt", "tls.key"} {
		p := filepath.Join(creds, name)
		if err := os.Chown(p, uid, -1); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	// The queue's directory is the unit's StateDirectory, the user's own.
	state := t.TempDir()
	for _, d := range []string{filepath.Dir(state), state} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(state, uid, -1); err != nil {
		t.Fatal(err)
	}
	env = []string{"GREYRELAY_QUEUE_PATH=" + filepath.Join(state, "queue.db")}
	if res := runGreyrelay(t, creds, "", env, "config", "check", "-config", f, "-user", "nobody"); res.Code != 0 {
		t.Errorf("the copies as systemd hands them over: want valid:\n%s", res)
	}
}
