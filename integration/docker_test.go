package integration

// The container image test: it builds the image from the repository's
// Dockerfile, runs it the way the README tells operators to (read-only root
// filesystem, no capabilities, the queue on a named volume, configuration
// from the environment, credentials from a mounted secret) and checks that
// mail survives a `docker stop` and a new container on the same volume.
//
// Nothing is pulled: no registry is reachable on the test machines. The Go
// builder stage uses a base made locally by testdata/docker/build-base.sh
// (debootstrap + the host's Go), built once and then kept, and the module
// download inside the build is served from the host's module cache by an
// HTTP server on loopback. Docker runs with --iptables=false --bridge=none,
// so every build and container uses --network host, and every address below
// is on 127.0.0.1.
//
// The two tests that build the image (TestDockerImage and TestRecipeDocker,
// README's build command) run in parallel with the rest of the suite but
// build in turn, with the same arguments and module proxy (imageBuilds):
// the second build comes from the classic builder's layer cache, since a
// build compiles the whole module and takes minutes on 2 loaded cores.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

const (
	// requireDockerEnv turns "no Docker daemon" (or no dockerfile-utils, or
	// no way to build the base) from a skip into a failure; CI sets it.
	requireDockerEnv = "GREYRELAY_REQUIRE_DOCKER"
	// baseImage is the locally made stand-in for golang:1.26-bookworm.
	baseImage = "local/golang:bookworm"
	// imageSizeLimit is the size the README promises the image stays under.
	imageSizeLimit = 30 << 20
	spoolDir       = "/var/spool/greyrelay"
	usersSecret    = "/run/secrets/users"
	dockerUser     = "relayuser"
	dockerPassword = "correct horse battery staple"
	laterMessages  = 20
)

// TestDockerfileBuilderArg checks the convention TestDockerImage relies on:
// the builder image is a build argument whose default, the public Go image
// users build with, has the Go version go.mod asks for.
func TestDockerfileBuilderArg(t *testing.T) {
	root := moduleRoot(t)
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	for _, want := range []string{
		"ARG GO_IMAGE=golang:" + string(m[1]) + "-bookworm\n",
		"FROM ${GO_IMAGE} AS build\n",
		"FROM scratch\n",
	} {
		if !bytes.Contains(df, []byte(want)) {
			t.Errorf("Dockerfile lacks the line %q", strings.TrimSpace(want))
		}
	}
}

// TestDockerfileLint lints the Dockerfile with dockerfile-utils, which
// exits 1 when it finds an error.
func TestDockerfileLint(t *testing.T) {
	lint := requireTool(t, "dockerfile-utils")
	out, err := exec.Command(lint, "lint", filepath.Join(moduleRoot(t), "Dockerfile")).CombinedOutput()
	if err != nil {
		t.Fatalf("dockerfile-utils lint Dockerfile: %v\n%s", err, out)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Logf("dockerfile-utils lint (warnings only):\n%s", s)
	}
}

// TestDockerImage builds the image and runs the relay in it.
func TestDockerImage(t *testing.T) {
	requireDocker(t)
	peers.Require(t, "swaks")
	t.Parallel()
	root := moduleRoot(t)
	image := buildImage(t, root)

	d := newDockerRelay(t, image)
	sink := peers.StartSink(t, "", peers.SinkOptions{})
	d.env["GREYRELAY_DELIVERY_SMARTHOST_ADDRESS"] = sink.Addr
	d.start(t)

	// One message with AUTH: accepted, logged, relayed to the sink.
	if out, code := d.submit(t, 0); code != 0 {
		t.Fatalf("swaks with AUTH: exit %d\n%s\n%s", code, out, d.logs(t))
	}
	got := sink.WaitFor(t, 1, 30*time.Second)
	if got[0].From != "sender@client.test" || !slices.Equal(got[0].Rcpts, []string{rcptFor(0)}) {
		t.Fatalf("sink got MAIL <%s> RCPT %v, want <sender@client.test> %v", got[0].From, got[0].Rcpts, rcptFor(0))
	}

	// The sink goes away; 20 more messages are queued and deferred.
	sinkAddr := sink.Addr
	sink.Close()
	for i := 1; i <= laterMessages; i++ {
		if out, code := d.submit(t, i); code != 0 {
			t.Fatalf("swaks message %d: exit %d\n%s\n%s", i, code, out, d.logs(t))
		}
	}
	d.waitLog(t, 30*time.Second, "a deferred delivery attempt", func(l logLine) bool {
		return l.has("rcpt") && l.str("outcome") == "deferred"
	})

	// docker stop sends the image's STOPSIGNAL; the relay must exit cleanly
	// within docker's default grace period. A new container takes over the
	// volume, and the sink comes back on the same address.
	d.stop(t)
	if code := d.inspect(t, "{{.State.ExitCode}}"); code != "0" {
		t.Fatalf("exit code after docker stop = %s, want 0 (clean SIGTERM shutdown)\n%s", code, d.logs(t))
	}
	firstLogs := d.logLines(t)
	d.start(t)
	sink2 := peers.StartSink(t, sinkAddr, peers.SinkOptions{})
	// Wait for every recipient, not for a count: delivery is at least once,
	// and the first message may arrive again (the first sink was closed
	// right after taking it, possibly before its 250 reached the relay).
	deadline := time.Now().Add(90 * time.Second)
	for missingRecipients(sink2.Messages()) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	checkRecipients(t, sink2.Messages())

	d.waitHealthy(t, 60*time.Second)
	checkLogFields(t, append(firstLogs, d.logLines(t)...))
}

// checkRecipients checks that each of the later messages arrived (at least
// once: a crash-free restart should not duplicate, but at-least-once is
// what the queue promises).
func checkRecipients(t *testing.T, msgs []peers.Received) {
	t.Helper()
	seen := recipientsSeen(msgs)
	for i := 1; i <= laterMessages; i++ {
		if !seen[rcptFor(i)] {
			t.Errorf("message %d (to %s) never reached the sink after the restart", i, rcptFor(i))
		}
	}
}

func recipientsSeen(msgs []peers.Received) map[string]bool {
	seen := map[string]bool{}
	for _, m := range msgs {
		for _, r := range m.Rcpts {
			seen[r] = true
		}
	}
	return seen
}

// missingRecipients counts the later messages not yet seen at the sink.
func missingRecipients(msgs []peers.Received) int {
	seen, n := recipientsSeen(msgs), 0
	for i := 1; i <= laterMessages; i++ {
		if !seen[rcptFor(i)] {
			n++
		}
	}
	return n
}

// Fields of the two log lines operators grep (docs/operations.md documents them).
var (
	acceptedFields = []string{"queue_id", "client", "user", "from", "rcpts", "size", "tls"}
	attemptFields  = []string{"queue_id", "rcpt", "domain", "mx", "source_ip", "attempt", "outcome", "reason", "code", "reply", "delay"}
)

// checkLogFields checks that every log line is JSON, that accepted
// messages and delivery attempts are logged with the documented fields,
// and that deferred attempts say when the next one is due.
func checkLogFields(t *testing.T, lines []logLine) {
	t.Helper()
	var accepted, attempts, deferred []logLine
	for _, l := range lines {
		switch {
		case l.fields == nil:
			t.Errorf("log line is not JSON: %s", l.raw)
		case l.has("rcpt") && l.has("outcome"):
			attempts = append(attempts, l)
			if l.str("outcome") == "deferred" {
				deferred = append(deferred, l)
			}
		case l.has("queue_id") && l.has("from"):
			accepted = append(accepted, l)
		}
	}
	if len(accepted) < 1+laterMessages {
		t.Errorf("%d log lines for accepted messages (with queue_id and from), want %d\n%s", len(accepted), 1+laterMessages, dumpQueueLines(lines))
	}
	for _, l := range accepted {
		if missing := l.missing(acceptedFields); len(missing) > 0 {
			t.Errorf("accepted-message log line lacks %v: %s", missing, l.raw)
			break
		}
		if u := l.str("user"); u != dockerUser {
			t.Errorf("accepted-message log line: user = %q, want %q: %s", u, dockerUser, l.raw)
			break
		}
	}
	if len(attempts) == 0 || len(deferred) == 0 {
		t.Errorf("%d delivery-attempt log lines, %d deferred; want both > 0\n%s", len(attempts), len(deferred), dumpQueueLines(lines))
	}
	for _, l := range attempts {
		if missing := l.missing(attemptFields); len(missing) > 0 {
			t.Errorf("delivery-attempt log line lacks %v: %s", missing, l.raw)
			break
		}
	}
	for _, l := range deferred {
		if !l.has("next_attempt") {
			t.Errorf("deferred delivery-attempt log line lacks next_attempt: %s", l.raw)
			break
		}
	}
}

// dumpQueueLines returns the log lines that mention a queue ID, for a
// failure message that shows what the relay did log.
func dumpQueueLines(lines []logLine) string {
	var b strings.Builder
	for _, l := range lines {
		if l.has("queue_id") {
			b.WriteString(l.raw + "\n")
		}
	}
	return b.String()
}

func rcptFor(i int) string { return fmt.Sprintf("rcpt%02d@dest.test", i) }

// dockerRelay is the relay run as a container: the same image, volume,
// secret and environment for each container started in turn.
type dockerRelay struct {
	image, volume, prefix string
	usersFile             string
	smtpAddr, adminAddr   string
	env                   map[string]string
	name                  string // the current container
	runs                  int
}

// newDockerRelay prepares names, ports, the users secret and the
// environment; every container and the volume are removed in t.Cleanup.
func newDockerRelay(t *testing.T, image string) *dockerRelay {
	t.Helper()
	prefix := "greyrelay-test-" + randomHex(t)
	d := &dockerRelay{image: image, volume: prefix + "-spool", prefix: prefix,
		usersFile: writeUsersFile(t),
		smtpAddr:  peers.FreeAddr(t, "127.0.0.1"), adminAddr: peers.FreeAddr(t, "127.0.0.1")}
	d.env = map[string]string{
		"GREYRELAY_LISTENERS_0_ADDRESS":    d.smtpAddr,
		"GREYRELAY_ADMIN_ADDRESS":          d.adminAddr,
		"GREYRELAY_USERS_FILE":             usersSecret,
		"GREYRELAY_TRUSTED_NETWORKS":       "", // no IP trust: AUTH or nothing
		"GREYRELAY_DELIVERY_SMARTHOST_TLS": "none",
		"GREYRELAY_LOG_FORMAT":             "json",
		"GREYRELAY_HOSTNAME":               "relay.test",
		"GREYRELAY_RETRY_INITIAL_INTERVAL": "1s", // the restarted relay retries within seconds
		"GREYRELAY_RETRY_MAX_INTERVAL":     "2s",
		"GREYRELAY_RETRY_JITTER":           "0",
	}
	docker(t, "volume", "create", d.volume)
	t.Cleanup(func() {
		if t.Failed() && d.name != "" {
			t.Logf("logs of %s:\n%s", d.name, d.logs(t))
		}
		for i := 1; i <= d.runs; i++ {
			_, _ = dockerTry(context.Background(), "rm", "-f", "-v", fmt.Sprintf("%s-%d", d.prefix, i))
		}
		if out, err := dockerTry(context.Background(), "volume", "rm", "-f", d.volume); err != nil {
			t.Errorf("docker volume rm %s: %v\n%s", d.volume, err, out)
		}
	})
	return d
}

// writeUsersFile makes the users secret with the host-built binary's
// `greyrelay user add`, the password on stdin as an operator would.
func writeUsersFile(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(peers.Binary(t), "user", "add", dockerUser)
	cmd.Stdin = strings.NewReader(dockerPassword + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	line, err := cmd.Output()
	if err != nil {
		t.Fatalf("greyrelay user add: %v\n%s", err, stderr.Bytes())
	}
	if !bytes.HasPrefix(line, []byte(dockerUser+":")) {
		t.Fatalf("greyrelay user add printed %q, want a %q line", line, dockerUser+":hash")
	}
	path := filepath.Join(t.TempDir(), "users")
	// World-readable: the container's user (65532) must read the bind mount.
	if err := os.WriteFile(path, line, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// start runs a new container on the volume and waits for the SMTP greeting.
func (d *dockerRelay) start(t *testing.T) {
	t.Helper()
	d.runs++
	d.name = fmt.Sprintf("%s-%d", d.prefix, d.runs)
	args := []string{"run", "-d", "--name", d.name,
		"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--network", "host", "--health-interval", "1s",
		"-v", d.volume + ":" + spoolDir,
		"-v", d.usersFile + ":" + usersSecret + ":ro"}
	keys := make([]string, 0, len(d.env))
	for k := range d.env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		args = append(args, "-e", k+"="+d.env[k])
	}
	docker(t, append(args, d.image)...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := peers.Greets(d.smtpAddr, false)
		if err == nil {
			return
		}
		if state := d.inspect(t, "{{.State.Status}}"); state != "running" || time.Now().After(deadline) {
			t.Fatalf("container %s (%s) does not greet on %s: %v\n%s", d.name, state, d.smtpAddr, err, d.logs(t))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// submit sends message i with swaks, authenticating with the secret's user.
func (d *dockerRelay) submit(t *testing.T, i int) (string, int) {
	t.Helper()
	return peers.SwaksMessage{
		Server: d.smtpAddr, From: "sender@client.test", To: []string{rcptFor(i)},
		Data: []byte(fmt.Sprintf("From: sender@client.test\r\nTo: %s\r\nSubject: docker %d\r\n\r\nmessage %d\r\n", rcptFor(i), i, i)),
		Args: []string{"--auth", "PLAIN", "--auth-user", dockerUser, "--auth-password", dockerPassword},
	}.Send(t)
}

// stop is `docker stop` with docker's default grace period.
func (d *dockerRelay) stop(t *testing.T) {
	t.Helper()
	docker(t, "stop", d.name)
}

func (d *dockerRelay) inspect(t *testing.T, format string) string {
	t.Helper()
	return strings.TrimSpace(docker(t, "inspect", "--format", format, d.name))
}

// waitHealthy waits for Docker's health check (`greyrelay health`) to
// report the container healthy.
func (d *dockerRelay) waitHealthy(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		status := d.inspect(t, "{{.State.Health.Status}}")
		if status == "healthy" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health status %q after %v, want healthy\n%s\n%s", status, timeout,
				d.inspect(t, "{{json .State.Health}}"), d.logs(t))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// logs returns the current container's stdout and stderr.
func (d *dockerRelay) logs(t *testing.T) string {
	t.Helper()
	out, err := dockerTry(context.Background(), "logs", d.name)
	if err != nil {
		return fmt.Sprintf("(docker logs %s: %v)\n%s", d.name, err, out)
	}
	return out
}

// logLine is one line of the relay's log, decoded when it is JSON.
type logLine struct {
	raw    string
	fields map[string]any // nil when the line is not a JSON object
}

func (l logLine) has(k string) bool { _, ok := l.fields[k]; return ok }

func (l logLine) str(k string) string { s, _ := l.fields[k].(string); return s }

func (l logLine) missing(keys []string) []string {
	var out []string
	for _, k := range keys {
		if !l.has(k) {
			out = append(out, k)
		}
	}
	return out
}

func (d *dockerRelay) logLines(t *testing.T) []logLine {
	t.Helper()
	var lines []logLine
	sc := bufio.NewScanner(strings.NewReader(d.logs(t)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		raw := strings.TrimSpace(sc.Text())
		if raw == "" {
			continue
		}
		l := logLine{raw: raw}
		if err := json.Unmarshal([]byte(raw), &l.fields); err != nil {
			l.fields = nil
		}
		lines = append(lines, l)
	}
	return lines
}

// waitLog waits until a line of the current container's log matches.
func (d *dockerRelay) waitLog(t *testing.T, timeout time.Duration, what string, match func(logLine) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if slices.ContainsFunc(d.logLines(t), match) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line for %s after %v\n%s", what, timeout, d.logs(t))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// requireDocker skips the test when no Docker daemon answers, or fails it
// when GREYRELAY_REQUIRE_DOCKER is set.
func requireDocker(t *testing.T) {
	t.Helper()
	requireTool(t, "docker")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if out, err := dockerTry(ctx, "info", "--format", "{{.ServerVersion}}"); err != nil {
		unavailable(t, fmt.Sprintf("no Docker daemon reachable (docker info: %v: %s)", err, strings.TrimSpace(out)))
	}
}

// requireTool returns the path of a program, or skips (fails, with
// GREYRELAY_REQUIRE_DOCKER set) when it is not installed.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		for _, dir := range []string{"/usr/sbin", "/sbin"} {
			if fi, e := os.Stat(filepath.Join(dir, name)); e == nil && !fi.IsDir() {
				return filepath.Join(dir, name)
			}
		}
		unavailable(t, name+" is not installed")
	}
	return p
}

func unavailable(t *testing.T, why string) {
	t.Helper()
	if os.Getenv(requireDockerEnv) != "" {
		t.Fatalf("%s (%s is set)", why, requireDockerEnv)
	}
	t.Skipf("%s; set %s=1 to fail instead of skipping", why, requireDockerEnv)
}

// ensureBaseImage builds the local builder base unless it already exists.
func ensureBaseImage(t *testing.T, root string) {
	t.Helper()
	if _, err := dockerTry(context.Background(), "image", "inspect", baseImage); err == nil {
		return
	}
	requireTool(t, "debootstrap")
	if os.Geteuid() != 0 {
		unavailable(t, "building "+baseImage+" needs root (debootstrap)")
	}
	script := filepath.Join(root, "integration", "testdata", "docker", "build-base.sh")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, baseImage)
	cmd.Env = append(os.Environ(), "GOROOT="+goEnv(t, root, "GOROOT"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
}

// buildImage builds the Dockerfile with the local base (made first if
// missing) and returns a tag unique to this run, removed in t.Cleanup. It
// also checks the image's size and its configuration.
func buildImage(t *testing.T, root string) string {
	t.Helper()
	proxy := shareImageBuilds(t, root)
	tag := "greyrelay-test:" + randomHex(t)
	var start time.Time
	var out string
	var err error
	imageBuilds.inTurn(t, func() {
		ensureBaseImage(t, root)
		start = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err = dockerTry(ctx, "build", "--network", "host", "--build-arg", "GO_IMAGE="+baseImage,
			"--build-arg", "GOPROXY="+proxy, "-t", tag, root)
	})
	if err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	t.Cleanup(func() { imageBuilds.inTurn(t, func() { _, _ = dockerTry(context.Background(), "rmi", tag) }) })

	var size int64
	fmt.Sscan(docker(t, "image", "inspect", "--format", "{{.Size}}", tag), &size)
	t.Logf("image built in %v; size %d bytes (%.1f MB)", time.Since(start).Round(time.Second), size, float64(size)/1e6)
	if size <= 0 || size > imageSizeLimit {
		t.Errorf("image size %d bytes, want under %d (README)", size, imageSizeLimit)
	}
	var cfg struct {
		User        string
		StopSignal  string
		Volumes     map[string]any
		Healthcheck struct{ Test []string }
	}
	if err := json.Unmarshal([]byte(docker(t, "image", "inspect", "--format", "{{json .Config}}", tag)), &cfg); err != nil {
		t.Fatal(err)
	}
	if uid, err := strconv.Atoi(strings.Split(cfg.User, ":")[0]); err != nil || uid == 0 {
		t.Errorf("image USER = %q, want a non-root numeric user", cfg.User)
	}
	if cfg.StopSignal != "SIGTERM" {
		t.Errorf("image STOPSIGNAL = %q, want SIGTERM", cfg.StopSignal)
	}
	if _, ok := cfg.Volumes[spoolDir]; !ok {
		t.Errorf("image volumes %v, want %s", cfg.Volumes, spoolDir)
	}
	if !slices.Equal(cfg.Healthcheck.Test, []string{"CMD", "/greyrelay", "health"}) {
		t.Errorf("image HEALTHCHECK %v, want CMD /greyrelay health", cfg.Healthcheck.Test)
	}
	return tag
}

// moduleProxy serves the host's module download cache on loopback, so the
// build's `go mod download` needs no network beyond 127.0.0.1, and returns
// its URL and how to stop it. It first runs `go mod download` on the host,
// which fills the cache with every module the build can ask for (a no-op
// when they are there already).
func moduleProxy(t *testing.T, root string) (string, func()) {
	t.Helper()
	cmd := exec.Command("go", "mod", "download")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go mod download: %v\n%s", err, out)
	}
	dir := filepath.Join(goEnv(t, root, "GOMODCACHE"), "cache", "download")
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	return srv.URL, srv.Close
}

// imageBuilds is what the tests that build the image share: builds take
// turns (a second one, with the same Dockerfile, arguments and context,
// then comes from the layer cache), one module proxy (the GOPROXY build
// argument must be the same for that), and the builder stage's layers,
// which the classic builder keeps as cache and which are removed when the
// last of those tests is done (repeated runs must not pile up half a
// gigabyte each).
var imageBuilds sharedBuilds

type sharedBuilds struct {
	turn  sync.Mutex // held for a build, and for removing an image another build may reuse
	mu    sync.Mutex // guards the fields below
	users int        // tests between shareImageBuilds and their cleanup
	proxy string
	stop  func()
}

// inTurn runs f while no other test builds or removes an image.
func (b *sharedBuilds) inTurn(t *testing.T, f func()) {
	t.Helper()
	b.turn.Lock()
	defer b.turn.Unlock()
	f()
}

// shareImageBuilds registers t as a test that builds the image and returns
// the module proxy's URL for its GOPROXY build argument.
func shareImageBuilds(t *testing.T, root string) string {
	t.Helper()
	b := &imageBuilds
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.users == 0 {
		b.proxy, b.stop = moduleProxy(t, root)
	}
	b.users++
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.users--; b.users > 0 {
			return
		}
		b.stop()
		b.inTurn(t, func() {
			_, _ = dockerTry(context.Background(), "image", "prune", "-f", "--filter", "label=greyrelay.stage=build")
		})
	})
	return b.proxy
}

// goEnv returns `go env NAME`. go test puts its own go first on PATH.
func goEnv(t *testing.T, root, name string) string {
	t.Helper()
	cmd := exec.Command("go", "env", name)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// docker runs the docker client and fails the test on error.
func docker(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := dockerTry(ctx, args...)
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// dockerTry runs the docker client and returns its combined output. The
// classic builder is asked for explicitly: it is what the daemon on the
// test machines supports with --network host and no buildx plugin.
func dockerTry(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=0")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if ctx.Err() != nil {
		err = errors.Join(err, ctx.Err())
	}
	return buf.String(), err
}

// moduleRoot is the repository root: the directory above integration/.
func moduleRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(wd)
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod above %s: %v", wd, err)
	}
	return root
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestRecipeDocker runs README's Docker blocks as written: the offline
// build (the builder base made only when it does not exist yet, GOPROXY
// pointed at the host's module cache served on loopback), then the
// secrets, `docker run` and `docker exec … queue list`. Substituted: the
// image, container and volume names (unique per run), the certificate's
// path, the smarthost's address (a closed port, so the message waits in
// the queue), and `-p 587:2525`, which needs a bridge network the test
// daemon does not have: it becomes --network host with the listener and
// admin addresses on free loopback ports.
func TestRecipeDocker(t *testing.T) {
	requireDocker(t)
	peers.Require(t, "swaks")
	t.Parallel()
	root, dir := moduleRoot(t), t.TempDir()
	blocks := recipeBlocks(t, "TestRecipeDocker")
	if len(blocks) != 2 {
		t.Fatalf("README.md: %d blocks for TestRecipeDocker, want the build and the run", len(blocks))
	}
	id := randomHex(t)
	tag, name, volume := "greyrelay-test:"+id, "greyrelay-test-"+id, "greyrelay-test-"+id+"-queue"
	proxy := shareImageBuilds(t, root)

	build := recipeText(t, blocks[0].File, blocks[0].Text, "https://proxy.golang.org", proxy, "-t greyrelay .", "-t "+tag+" .")
	lines := strings.SplitN(build, "\n", 2)
	t.Cleanup(func() {
		_, _ = dockerTry(context.Background(), "rm", "-f", "-v", name)
		_, _ = dockerTry(context.Background(), "volume", "rm", "-f", volume)
		imageBuilds.inTurn(t, func() { _, _ = dockerTry(context.Background(), "rmi", tag) })
	})
	var baseRes, buildRes cliResult
	imageBuilds.inTurn(t, func() {
		if _, err := dockerTry(context.Background(), "image", "inspect", baseImage); err != nil || !strings.Contains(lines[0], baseImage) {
			if baseRes = runDockerShell(t, root, lines[0]); baseRes.Code != 0 {
				return
			}
		}
		buildRes = runDockerShell(t, root, lines[1])
	})
	if baseRes.Code != 0 {
		t.Fatalf("README's %q: %s", lines[0], baseRes)
	}
	if buildRes.Code != 0 {
		t.Fatalf("README's docker build: %s", buildRes)
	}

	cert := peers.NewCert(t, "relay.test", "127.0.0.1")
	etc := filepath.Join(dir, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, cert.CertFile, filepath.Join(etc, "cert.pem"))
	copyFile(t, cert.KeyFile, filepath.Join(etc, "key.pem"))
	if err := os.WriteFile(filepath.Join(dir, "app-password"), []byte(dockerPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(peers.Binary(t), filepath.Join(bin, "greyrelay")); err != nil {
		t.Fatal(err)
	}
	smtpAddr, adminAddr := peers.FreeAddr(t, "127.0.0.1"), peers.FreeAddr(t, "127.0.0.1")
	run := recipeText(t, blocks[1].File, blocks[1].Text,
		"--name greyrelay ", "--name "+name+" ", "docker exec greyrelay ", "docker exec "+name+" ",
		"greyrelay-queue:", volume+":", "/etc/greyrelay/", etc+"/",
		"mail.example.net:587 greyrelay\n", peers.FreeAddr(t, "127.0.0.1")+" "+tag+"\n",
		"-p 587:2525 ", "--network host -e GREYRELAY_LISTENERS_0_ADDRESS="+smtpAddr+" -e GREYRELAY_ADMIN_ADDRESS="+adminAddr+" ")
	script := strings.TrimSpace(run)
	execLine := script[strings.LastIndex(script, "\n")+1:]
	if !strings.HasPrefix(execLine, "docker exec ") {
		t.Fatalf("README's run block no longer ends with docker exec: %q", execLine)
	}
	if res := runDockerShell(t, dir, "PATH="+bin+":$PATH\n"+strings.TrimSuffix(script, execLine)); res.Code != 0 {
		t.Fatalf("README's docker run block: %s", res)
	}
	deadline := time.Now().Add(30 * time.Second)
	for peers.Greets(smtpAddr, false) != nil {
		if time.Now().After(deadline) {
			logs, _ := dockerTry(context.Background(), "logs", name)
			t.Fatalf("the container does not greet on %s:\n%s", smtpAddr, logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	submitTLS(t, smtpAddr, "app", dockerPassword)
	res := runDockerShell(t, dir, execLine)
	if res.Code != 0 || !strings.Contains(res.Stdout, "user@dest.example") {
		logs, _ := dockerTry(context.Background(), "logs", name)
		t.Errorf("README's %q: want the queued recipient listed: %s\n%s", execLine, res, logs)
	}
	_, _ = dockerTry(context.Background(), "rm", "-f", "-v", name)

	// The same image under configs/docker-compose.yml (one build: on a
	// loaded machine a build takes minutes).
	t.Run("compose", func(t *testing.T) { recipeDockerCompose(t, tag) })
}

// runDockerShell runs README lines with sh in dir, with the classic
// builder (the test daemon's client has no buildx).
func runDockerShell(t *testing.T, dir, script string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "sh", "-e", "-c", script)
	cmd.WaitDelay = 10 * time.Second // sh's children (the docker client) may hold the pipes
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, &stdout, &stderr
	cmd.Env = append(peers.CleanEnv(), "DOCKER_BUILDKIT=0", "GOROOT="+goEnv(t, moduleRoot(t), "GOROOT"))
	err := cmd.Run()
	res := cliResult{Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.Code = ee.ExitCode()
	case err != nil:
		res.Code, res.Stderr = -1, res.Stderr+err.Error()
	}
	return res
}

// recipeDockerCompose runs configs/docker-compose.yml with Debian's
// docker-compose as its header says, in a project directory holding
// configs/container.yaml, the TLS files and the secrets; substituted: the
// image, the published host ports and the project name. The relay must
// take container.yaml (AUTH over STARTTLS on the published port, the admin
// server with its token on the other).
func recipeDockerCompose(t *testing.T, image string) {
	compose := requireTool(t, "docker-compose")
	root, dir := moduleRoot(t), t.TempDir()
	for _, sub := range []string{"configs", "tls", "secrets"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, filepath.Join(root, "configs", "container.yaml"), filepath.Join(dir, "configs", "container.yaml"))
	cert := peers.NewCert(t, "relay.example.com", "127.0.0.1")
	copyFile(t, cert.CertFile, filepath.Join(dir, "tls", "cert.pem"))
	copyFile(t, cert.KeyFile, filepath.Join(dir, "tls", "key.pem"))
	copyFile(t, writeUsersFile(t), filepath.Join(dir, "secrets", "users"))
	if err := os.WriteFile(filepath.Join(dir, "secrets", "admin_token"), []byte("compose-token\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "configs", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	smtpAddr, adminAddr := peers.FreeAddr(t, "127.0.0.1"), peers.FreeAddr(t, "127.0.0.1")
	file := recipeText(t, "configs/docker-compose.yml", string(b), "image: greyrelay\n", "image: "+image+"\n",
		`"587:2525"`, `"`+portOf(smtpAddr)+`:2525"`, `"127.0.0.1:8025:8025"`, `"`+adminAddr+`:8025"`)
	path := filepath.Join(dir, "docker-compose.yml")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	project := "greyrelaytest" + randomHex(t)
	dc := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, compose, append([]string{"-f", path, "--project-directory", dir, "-p", project}, args...)...)
		cmd.Env = peers.CleanEnv()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() { _, _ = dc("down", "-v") })
	if out, err := dc("up", "-d"); err != nil {
		t.Fatalf("docker-compose up: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for peers.Greets(smtpAddr, false) != nil {
		if time.Now().After(deadline) {
			out, _ := dc("logs")
			t.Fatalf("the service does not greet on %s:\n%s", smtpAddr, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	submitTLS(t, smtpAddr, dockerUser, dockerPassword)
	req, _ := http.NewRequest(http.MethodGet, "http://"+adminAddr+"/api/stats", nil)
	req.Header.Set("Authorization", "Bearer compose-token")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		out, _ := dc("logs")
		t.Fatalf("admin API through the published port with the token: %v %v\n%s", resp, err, out)
	}
	resp.Body.Close()
}
