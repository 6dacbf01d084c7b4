package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
)

// env is one benchmark invocation's workspace: a directory under the system
// temporary directory (on the same disk for every system under test) and a
// stack of cleanups that always runs, so no Postfix or greyrelay process
// outlives the command, even after an error or Ctrl-C.
type env struct {
	root string
	keep bool
	sets []string // -set overrides for every greyrelay config

	mu       sync.Mutex
	cleanups []func()
	n        int
	cgRoot   *cgroupRoot // made on first use; nil when cgErr is set
	cgErr    error
	cgTried  bool
	peers    *peerEnv // the other relays' cache, users and DNS server, made on first use
}

// group makes a fresh cgroup for one system or tool set, removed by
// close. It fails where no cgroup2 filesystem is mounted; callers that
// can count by /proc instead then do so.
func (e *env) group(name string) (*cgroup, error) {
	e.mu.Lock()
	if !e.cgTried {
		e.cgTried = true
		e.cgRoot, e.cgErr = newCgroupRoot()
		if e.cgErr == nil {
			root := e.cgRoot
			e.cleanups = append(e.cleanups, root.remove)
		}
	}
	root, err := e.cgRoot, e.cgErr
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	g, err := root.group(name)
	if err != nil {
		return nil, err
	}
	e.defer_(g.remove)
	return g, nil
}

func newEnv(base string, keep bool) (*env, error) {
	if base == "" {
		base = os.TempDir()
	}
	root, err := os.MkdirTemp(base, "greyrelay-bench-")
	if err != nil {
		return nil, err
	}
	return &env{root: root, keep: keep}, nil
}

// dir makes a fresh directory below the root.
func (e *env) dir(name string) (string, error) {
	e.mu.Lock()
	e.n++
	n := e.n
	e.mu.Unlock()
	d := filepath.Join(e.root, fmt.Sprintf("%03d-%s", n, name))
	return d, os.MkdirAll(d, 0o755)
}

// defer_ registers a cleanup, run in reverse order by close.
func (e *env) defer_(f func()) {
	e.mu.Lock()
	e.cleanups = append(e.cleanups, f)
	e.mu.Unlock()
}

// close runs the cleanups and removes the workspace (unless -keep).
func (e *env) close() {
	e.mu.Lock()
	cs := e.cleanups
	e.cleanups = nil
	e.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
	if e.keep {
		fmt.Fprintf(os.Stderr, "bench: kept %s\n", e.root)
		return
	}
	_ = os.RemoveAll(e.root)
}

// fatal is what tb.Fatalf panics with; main recovers it after cleanup.
type fatal struct{ msg string }

// tb lets this command use integration/peers, whose helpers take a
// testing.TB. It implements the methods peers calls; the embedded nil
// interface makes any other call panic loudly instead of misbehaving.
// Fatalf panics (main recovers and cleans up); Errorf reports and marks
// the run failed, as in a test.
type tb struct {
	testing.TB
	e      *env
	name   string
	failed bool
}

func (e *env) tb(name string) *tb { return &tb{e: e, name: name} }

func (t *tb) Helper()          {}
func (t *tb) Name() string     { return t.name }
func (t *tb) Failed() bool     { return t.failed }
func (t *tb) Cleanup(f func()) { t.e.defer_(f) }
func (t *tb) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: %s: %s\n", t.name, fmt.Sprintf(format, args...))
}
func (t *tb) Log(args ...any) { t.Logf("%s", fmt.Sprint(args...)) }
func (t *tb) Errorf(format string, args ...any) {
	t.failed = true
	t.Logf(format, args...)
}
func (t *tb) Fatalf(format string, args ...any) {
	t.failed = true
	panic(fatal{t.name + ": " + fmt.Sprintf(format, args...)})
}
func (t *tb) Fatal(args ...any)                { t.Fatalf("%s", fmt.Sprint(args...)) }
func (t *tb) Skipf(format string, args ...any) { t.Fatalf("needs: "+format, args...) }
func (t *tb) TempDir() string {
	d, err := t.e.dir(t.name)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return d
}

// freeAddr returns "ip:port" for a port that was free on ip a moment ago.
func freeAddr(ip string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return net.JoinHostPort(ip, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)), nil
}

// profileHarness writes a CPU profile of this process (load generator and
// sink) to path until the workspace is closed: the harness shares the CPUs
// with the system under test, so what it costs is part of every result.
func (e *env) profileHarness(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return err
	}
	e.mu.Lock()
	e.cleanups = append(e.cleanups, func() { pprof.StopCPUProfile(); f.Close() })
	e.mu.Unlock()
	return nil
}
