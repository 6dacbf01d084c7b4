// Package peers runs the real greyrelay binary and the real software it
// talks to (Postfix, postgrey, swaks, a recording go-smtp sink, a DNS server)
// on loopback, for integration tests and the benchmark command.
//
// Design notes:
//
//   - Every peer belongs to one test. Its files live under t.TempDir(), it
//     listens on its own loopback address and a free port, and it is stopped
//     in t.Cleanup (politely first, then by force), so tests may run side by
//     side and leave nothing running.
//   - Nothing sleeps a fixed time. Starting a peer polls what a client would
//     see (an SMTP 220, an HTTP 200, a policy answer) until a deadline; waiting
//     for mail polls the recorded state the same way.
//   - A missing program skips the test (Require), unless
//     GREYRELAY_REQUIRE_PEERS is set: CI sets it so that a broken image fails
//     loudly instead of skipping quietly.
//   - `go test -short` is the inner loop: it skips every test that starts a
//     real peer or the real binary (Require, Binary), whatever the
//     environment says, so that it stays under a minute. The full suite,
//     which CI runs, never passes -short.
//   - When a peer fails to start, the failure message carries its log, so that
//     a refused config (Postfix says why only in its log) is visible in the
//     test output.
//   - Postfix and postgrey need root (they switch users); StartPostfix and
//     StartPostgrey call Require themselves.
//
// A typical test, relay delivering to a greylisting Postfix:
//
//	peers.Require(t, "postfix", "postgrey", "swaks")
//	sink := peers.StartSink(t, "", peers.SinkOptions{})
//	grey := peers.StartPostgrey(t, "", 3*time.Second)
//	mx := peers.StartPostfix(t, peers.PostfixConfig{Listen: peers.FreeAddr(t, relaytest.Loopback(t)),
//		RelayDomains: []string{"dest.test"}, DeliverTo: sink.Addr, Postgrey: grey})
//	relay := peers.StartRelay(t, config) // config routes dest.test to mx.Listen
//	peers.SwaksMessage{Server: relay.SMTPAddr, From: "a@src.test", To: []string{"b@dest.test"}}.Send(t)
//	msgs := sink.WaitFor(t, 1, 30*time.Second)
package peers

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequireEnv is the environment variable that turns a missing peer program
// from a skip into a test failure.
const RequireEnv = "GREYRELAY_REQUIRE_PEERS"

// rootOnly lists programs that can only be run as root here: Postfix's master
// and postgrey switch users, and Postfix binds port 25 in some tests.
var rootOnly = map[string]bool{"postfix": true, "postgrey": true}

// Require skips the test when one of the named programs is not installed
// (or needs root and we are not root). With GREYRELAY_REQUIRE_PEERS set it
// fails the test instead.
func Require(t testing.TB, bins ...string) {
	t.Helper()
	SkipShort(t)
	var missing []string
	for _, b := range bins {
		if _, err := lookPath(b); err != nil {
			missing = append(missing, b)
		} else if rootOnly[b] && os.Geteuid() != 0 {
			missing = append(missing, b+" (needs root)")
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "peers: not available: " + strings.Join(missing, ", ")
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("%s (%s is set)", msg, RequireEnv)
	}
	t.Skipf("%s (set %s=1 to fail instead)", msg, RequireEnv)
}

// SkipShort skips the test under `go test -short`: real peers and the real
// binary belong to the full suite, not to the one-minute inner loop.
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skipf("peers: real peers and the real binary run in the full suite, not under -short")
	}
}

// lookPath finds a program on PATH or in the sbin directories, which are
// often missing from a non-login PATH.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("peers: %s not found", name)
}

// mustLookPath is lookPath for callers that already passed Require.
func mustLookPath(t testing.TB, name string) string {
	t.Helper()
	p, err := lookPath(name)
	if err != nil {
		t.Fatalf("%v (call peers.Require first)", err)
	}
	return p
}

// FreePort returns a TCP port that was free on ip a moment ago: one that
// ip:port could be bound to, and that FreePort has not returned before.
// It picks below the kernel's ephemeral range (ip_local_port_range),
// where binding ip:0 would choose: a port from that range may become the
// source port of an outgoing connection from ip (a relay delivering from
// its own address) between the moment it is returned and the moment the
// server it is meant for binds it.
func FreePort(t testing.TB, ip string) int {
	t.Helper()
	low := ephemeralLow()
	for range 200 {
		port := 0 // the kernel's choice, when no range lies below the ephemeral one
		if low > minPort+100 {
			port = minPort + rand.IntN(low-minPort)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			if port == 0 {
				t.Fatalf("peers: free port on %s: %v", ip, err)
			}
			continue // taken
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if handOut(ip, port) {
			return port
		}
	}
	t.Fatalf("peers: no fresh free port on %s", ip)
	return 0
}

// minPort is the lowest port FreePort returns: above the well-known and
// most registered services' ports.
const minPort = 10000

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default, 32768, where it cannot be read).
func ephemeralLow() int {
	var low int
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if _, err := fmt.Sscan(string(b), &low); err == nil {
			return low
		}
	}
	return 32768
}

// handedOut remembers every port FreePort returned in this test process.
// The kernel may hand a port out again as soon as its listener closes, so
// two servers of one test (say the relay's SMTP and admin listeners) could
// otherwise be given the same port and one of them fail to start.
var handedOut = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

func handOut(ip string, port int) bool {
	k := net.JoinHostPort(ip, strconv.Itoa(port))
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.m[k] {
		return false
	}
	handedOut.m[k] = true
	return true
}

// FreeAddr returns "ip:port" for a free TCP port on ip.
func FreeAddr(t testing.TB, ip string) string {
	t.Helper()
	return net.JoinHostPort(ip, strconv.Itoa(FreePort(t, ip)))
}

// poll calls check until it returns nil or the timeout passes, and then
// returns check's last error. The interval grows from 10 ms to 200 ms:
// quick when things are quick, cheap when they are slow.
func poll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	interval := 10 * time.Millisecond
	for {
		err := check()
		if err == nil || errors.Is(err, errStopPolling) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(interval)
		interval = min(interval*3/2, 200*time.Millisecond)
	}
}

// errStopPolling, wrapped into a check's error, ends poll early (the process
// being waited for has died, say).
var errStopPolling = errors.New("stop polling")

// traversable makes dir and its parents up to (not including) the system
// temporary directory searchable by everyone. Postfix and postgrey drop to
// their own users and must reach directories below t.TempDir(), which Go
// creates with mode 0700.
func traversable(t testing.TB, dir string) {
	t.Helper()
	top := filepath.Clean(os.TempDir())
	for d := filepath.Clean(dir); d != top && d != "/" && d != "."; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatalf("peers: %v", err)
		}
		if err := os.Chmod(d, fi.Mode().Perm()|0o711); err != nil {
			t.Fatalf("peers: %v", err)
		}
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// readFile returns a file's contents, or a note saying why it could not.
func readFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return string(b)
}
