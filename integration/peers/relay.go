package peers

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// BinaryEnv names a prebuilt greyrelay binary to use instead of building
// cmd/greyrelay (a container image, a release build).
const BinaryEnv = "GREYRELAY_BINARY"

const (
	modulePath   = "github.com/greyrelay/greyrelay"
	readyTimeout = 20 * time.Second
	stopGrace    = 10 * time.Second
)

// built caches the result of building cmd/greyrelay: once per test binary.
var built struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of a greyrelay binary: $GREYRELAY_BINARY if set,
// otherwise cmd/greyrelay built once per test binary with `go build`. The
// build goes to one fixed file per user under the system temporary
// directory (written next to it, then renamed into place), so that repeated
// runs do not leave binaries behind.
func Binary(t testing.TB) string {
	t.Helper()
	SkipShort(t)
	if p := os.Getenv(BinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("peers: %s: %v", BinaryEnv, err)
		}
		return p
	}
	built.once.Do(func() { built.path, built.err = build() })
	if built.err != nil {
		t.Fatalf("peers: building greyrelay: %v", built.err)
	}
	return built.path
}

// build compiles cmd/greyrelay of the enclosing module.
func build() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	// One directory per checkout: two checkouts tested at the same time
	// (git worktrees) must never run each other's build.
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("greyrelay-peers-%d-%x", os.Getuid(), sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := statSources(root); err != nil {
		return "", err
	}
	final := filepath.Join(dir, "greyrelay")
	tmp := fmt.Sprintf("%s.%d.tmp", final, os.Getpid())
	// go test puts its own GOROOT/bin first on the PATH of the tests it
	// runs, so "go" is the toolchain that runs this test.
	goBin := "go"
	cmd := exec.Command(goBin, "build", "-o", tmp, "./cmd/greyrelay")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("go build ./cmd/greyrelay in %s: %w\n%s", root, err, out)
	}
	// Rename is atomic: a concurrent test binary keeps running its copy.
	if err := os.Rename(tmp, final); err != nil {
		return "", err
	}
	return final, nil
}

// statSources stats every file of the module that the binary is built
// from. go test caches a package's result keyed on the files its test
// process opened or stated; the binary is built by a child process, whose
// reads it does not see, so without this a change to the relay alone
// (not to the packages the integration tests import) would let
// `go test ./...` answer from the cache with results of the old binary.
func statSources(root string) error {
	return filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir // .git, .ci
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".yaml", ".yml", ".json", ".mod", ".sum", ".cf", ".service", ".html":
		default:
			if d.Name() != "Dockerfile" {
				return nil
			}
		}
		_, err = os.Stat(path)
		return err
	})
}

// moduleRoot finds the greyrelay module: walking up from the working
// directory (a test runs in its package directory), then from this source
// file (a command run from elsewhere).
func moduleRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for d := dir; ; d = filepath.Dir(d) {
			b, err := os.ReadFile(filepath.Join(d, "go.mod"))
			if err == nil && strings.Contains(string(b), "module "+modulePath+"\n") {
				return d, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return "", fmt.Errorf("no go.mod for %s above %v", modulePath, starts)
}

// Relay is a running greyrelay process (`greyrelay serve -config FILE`).
type Relay struct {
	Dir        string   // working directory of the process: relative paths in the config land here
	ConfigPath string   // the config file, Dir/greyrelay.yaml
	SMTPAddr   string   // the first listener's address
	Listeners  []string // every listener's address, in config order
	AdminAddr  string   // the admin server's address; "" when the config disables it
	LogPath    string   // stdout and stderr of every run, appended: Dir/relay.log
	Cmd        *exec.Cmd

	t       testing.TB
	bin     string
	env     []string
	args    []string // after "serve -config FILE" (WithArgs)
	modes   []string // listener modes, parallel to Listeners
	proxied []bool   // listeners that expect a PROXY header, parallel to Listeners
	token   string   // admin bearer token, if the config sets one
	current *proc
}

// RelayOption adjusts StartRelay.
type RelayOption func(*Relay)

// WithBinary runs the given greyrelay binary instead of Binary(t).
func WithBinary(path string) RelayOption { return func(r *Relay) { r.bin = path } }

// WithEnv adds "KEY=value" entries to the relay's environment. The
// inherited environment is passed on without any GREYRELAY_* variables, so
// a developer's shell cannot change what a test configured.
func WithEnv(kv ...string) RelayOption { return func(r *Relay) { r.env = append(r.env, kv...) } }

// WithArgs adds arguments after "serve -config FILE" (e.g. "-check-queue").
func WithArgs(args ...string) RelayOption { return func(r *Relay) { r.args = append(r.args, args...) } }

// StartRelay writes yamlConfig into a fresh t.TempDir(), starts
// `greyrelay serve -config` there and waits (up to 20 s) until every
// listener answers 220 and the admin server's /readyz answers 200. The
// config must name listeners[].address and admin.address (empty to disable
// the admin server): the defaults are fixed ports that parallel tests would
// share. The relay is stopped in t.Cleanup; a relay that does not exit
// cleanly on SIGTERM fails the test.
func StartRelay(t testing.TB, yamlConfig string, opts ...RelayOption) *Relay {
	t.Helper()
	dir := t.TempDir()
	r := &Relay{Dir: dir, ConfigPath: filepath.Join(dir, "greyrelay.yaml"), LogPath: filepath.Join(dir, "relay.log"), t: t}
	for _, o := range opts {
		o(r)
	}
	if r.bin == "" {
		r.bin = Binary(t)
	}
	if err := r.readConfig(yamlConfig); err != nil {
		t.Fatalf("peers: relay config: %v", err)
	}
	if err := os.WriteFile(r.ConfigPath, []byte(yamlConfig), 0o600); err != nil {
		t.Fatalf("peers: %v", err)
	}
	t.Cleanup(func() {
		if done, _ := r.current.exited(); !done {
			if err := r.Stop(); err != nil {
				t.Errorf("peers: relay shutdown: %v\n%s", err, tail(r.Log(), 400))
			}
		}
		if t.Failed() {
			t.Logf("peers: relay log (last 100 lines):\n%s", tail(r.Log(), 100))
		}
	})
	r.start(t)
	return r
}

// relayConfigView is the part of the relay's config the harness needs.
type relayConfigView struct {
	Listeners []struct {
		Address       string `yaml:"address"`
		Mode          string `yaml:"mode"`
		ProxyProtocol bool   `yaml:"proxy_protocol"`
	} `yaml:"listeners"`
	Admin *struct {
		Address   *string `yaml:"address"`
		Token     string  `yaml:"token"`
		TokenFile string  `yaml:"token_file"`
	} `yaml:"admin"`
}

// readConfig fills the addresses from the YAML the test wrote.
func (r *Relay) readConfig(yamlConfig string) error {
	var v relayConfigView
	if err := yaml.Unmarshal([]byte(yamlConfig), &v); err != nil {
		return err
	}
	for _, l := range v.Listeners {
		if l.Address == "" {
			return fmt.Errorf("a listener without an address")
		}
		r.Listeners = append(r.Listeners, l.Address)
		r.modes = append(r.modes, l.Mode)
		r.proxied = append(r.proxied, l.ProxyProtocol)
	}
	if len(r.Listeners) == 0 {
		return fmt.Errorf("listeners[].address must be set (the default is a fixed port)")
	}
	if v.Admin == nil || v.Admin.Address == nil {
		return fmt.Errorf("admin.address must be set, empty to disable (the default is a fixed port)")
	}
	r.SMTPAddr, r.AdminAddr, r.token = r.Listeners[0], *v.Admin.Address, v.Admin.Token
	if f := v.Admin.TokenFile; f != "" && r.token == "" {
		if !filepath.IsAbs(f) {
			f = filepath.Join(r.Dir, f)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		r.token = strings.TrimSpace(string(b))
	}
	return nil
}

// start runs the process once and waits until it is ready.
func (r *Relay) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(r.bin, append([]string{"serve", "-config", r.ConfigPath}, r.args...)...)
	cmd.Dir = r.Dir
	cmd.Env = append(CleanEnv(), r.env...)
	marker := fmt.Sprintf("--- peers: %s starting %s ---\n", time.Now().Format(time.RFC3339Nano), strings.Join(cmd.Args, " "))
	appendFile(r.LogPath, marker)
	p, err := startProc(cmd, r.LogPath)
	if err != nil {
		t.Fatalf("peers: %v", err)
	}
	r.current, r.Cmd = p, cmd
	if err := poll(readyTimeout, r.ready); err != nil {
		p.kill()
		t.Fatalf("peers: relay not ready: %v\nrelay log:\n%s", err, tail(r.Log(), 100))
	}
}

// ready is one readiness probe: every listener greets with 220 and /readyz
// answers 200.
func (r *Relay) ready() error {
	if done, err := r.current.exited(); done {
		return fmt.Errorf("relay exited (%v): %w", err, errStopPolling)
	}
	for i, addr := range r.Listeners {
		greet := Greets
		if r.proxied[i] {
			greet = GreetsBehindProxy
		}
		if err := greet(addr, r.modes[i] == "submissions"); err != nil {
			return err
		}
	}
	if r.AdminAddr == "" {
		return nil
	}
	code, _, err := r.get("/readyz")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("/readyz: %d", code)
	}
	return nil
}

// Get fetches path from the admin server (with the config's bearer token)
// and returns the status code and body.
func (r *Relay) Get(t testing.TB, path string) (int, string) {
	t.Helper()
	code, body, err := r.get(path)
	if err != nil {
		t.Fatalf("peers: admin GET %s: %v", path, err)
	}
	return code, body
}

func (r *Relay) get(path string) (int, string, error) {
	if r.AdminAddr == "" {
		return 0, "", fmt.Errorf("the admin server is disabled")
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+r.AdminAddr+path, nil)
	if err != nil {
		return 0, "", err
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Stop sends SIGTERM and waits up to 10 s, then SIGKILLs. It returns nil
// only for a clean exit (status 0) in time.
func (r *Relay) Stop() error {
	return r.current.stop(stopGrace)
}

// Kill ends the relay with SIGKILL (a crash: no shutdown code runs) and
// waits for it to go.
func (r *Relay) Kill() {
	r.current.kill()
}

// Running reports whether the relay process is still alive.
func (r *Relay) Running() bool {
	done, _ := r.current.exited()
	return !done
}

// Restart starts the relay again on the same config and directory (stopping
// it first if it still runs) and waits until it is ready.
func (r *Relay) Restart(t testing.TB) {
	t.Helper()
	if r.Running() {
		if err := r.Stop(); err != nil {
			t.Errorf("peers: relay shutdown before restart: %v", err)
		}
	}
	r.start(t)
}

// Log returns everything the relay has written to stdout and stderr so far,
// over all runs (each begins with a "--- peers: ... starting" line).
func (r *Relay) Log() string {
	return readFile(r.LogPath)
}

// Greets dials addr and checks for a 220 greeting, then says QUIT.
func Greets(addr string, implicitTLS bool) error {
	return greets(addr, implicitTLS, "")
}

// proxyLocalV2 is a PROXY protocol v2 header with the LOCAL command: what
// HAProxy sends on its own health checks. A listener behind a balancer
// takes it as the balancer's own connection.
const proxyLocalV2 = "\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00"

// GreetsBehindProxy is Greets for a listener with proxy_protocol set: it
// dials from 127.0.0.1 (which such a test config trusts as its balancer)
// and sends a LOCAL header first, as a balancer's health check does.
func GreetsBehindProxy(addr string, implicitTLS bool) error {
	return greets(addr, implicitTLS, proxyLocalV2)
}

func greets(addr string, implicitTLS bool, preamble string) error {
	d := net.Dialer{Timeout: 2 * time.Second}
	if preamble != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, preamble); err != nil {
		return err
	}
	if implicitTLS {
		conn = tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) // a readiness probe, not a test of the certificate
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	r, _, err := smtpvocab.Read(br)
	if err != nil {
		return fmt.Errorf("%s: greeting: %w", addr, err)
	}
	if r.Code != 220 {
		return fmt.Errorf("%s: greeting %q", addr, r.Error())
	}
	_, _ = io.WriteString(conn, "QUIT\r\n")
	_, _ = br.ReadString('\n')
	return nil
}

// CleanEnv is the process environment without GREYRELAY_* variables and
// STATE_DIRECTORY (where a relative queue.path resolves), so that a
// developer's shell or service cannot change the relay's configuration.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GREYRELAY_") && !strings.HasPrefix(kv, "STATE_DIRECTORY=") {
			env = append(env, kv)
		}
	}
	return env
}

// appendFile appends s to the file at path, creating it.
func appendFile(path, s string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(s)
}
