package relaytest

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// firstLoopback is the lowest address Loopback hands out: 127.0.0.1 is
// every tool's default, 127.0.0.2 the relay's pinned source address in
// tests, and the rest up to 127.0.0.20 stay free for a test to name on
// purpose (a port probe, a second source).
const firstLoopback = 21

// loopbacks is the set of 127.0.0.x addresses handed out in this test
// process and not yet released. It is shared by every test of a package
// because parallel tests are exactly the ones that must not collide.
var loopbacks struct {
	mu   sync.Mutex
	used [256]bool
}

// Loopback hands out a 127.0.0.x address (x from 21 to 254) that no other
// running test of this process holds, and takes it back when t ends. Linux
// routes all of 127.0.0.0/8 to lo, so each address is a distinct host
// (a fake MX, a smarthost) without any setup.
func Loopback(t testing.TB) string {
	t.Helper()
	loopbacks.mu.Lock()
	defer loopbacks.mu.Unlock()
	// Each test process starts at its own place in the range: go test runs
	// several packages' processes at once, each handing out addresses on
	// its own, and two that both began at 127.0.0.21 put their fake
	// servers on the same addresses, where one random port in thousands
	// sometimes matched ("address already in use" in relay/delivery while
	// the integration and queue packages ran).
	n := 255 - firstLoopback
	start := os.Getpid() % n
	for i := range n {
		x := firstLoopback + (start+i)%n
		if !loopbacks.used[x] {
			loopbacks.used[x] = true
			t.Cleanup(func() {
				loopbacks.mu.Lock()
				loopbacks.used[x] = false
				loopbacks.mu.Unlock()
			})
			return fmt.Sprintf("127.0.0.%d", x)
		}
	}
	t.Fatal("relaytest: every 127.0.0.x address from 21 to 254 is in use")
	return ""
}
