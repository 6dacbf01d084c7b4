package integration

// Admission under a connection flood: strangers cannot take the slots kept
// for trusted and authenticated clients, and under stress their idle
// sessions are cut after limits.stress_command_timeout.

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// raiseFileLimit makes room for n more open files in this process and in
// the relay it starts (which inherits the limit), or skips the test.
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Skipf("ulimit -n: hard limit %d, the test needs %d open files", lim.Max, n)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("ulimit -n: cannot raise to %d: %v", n, err)
	}
}

// flood keeps conns idle connections open to addr from addrs source
// addresses, as an attack does: a connection refused or closed by the
// server is opened again.
type flood struct {
	held     atomic.Int64 // connections greeted with 220 and open now
	refused  atomic.Int64 // 421 4.7.0 at connect
	cut      atomic.Int64 // 421 4.4.2 (idle timeout) after the greeting
	stop     chan struct{}
	finished sync.WaitGroup
}

func startFlood(addr string, addrs []string, perAddr int) *flood {
	f := &flood{stop: make(chan struct{})}
	for _, src := range addrs {
		for range perAddr {
			f.finished.Add(1)
			go func() {
				defer f.finished.Done()
				for {
					select {
					case <-f.stop:
						return
					default:
					}
					f.once(addr, src)
				}
			}()
		}
	}
	return f
}

// once opens one connection, holds it idle until the server ends it or
// the flood stops, and notes what happened.
func (f *flood) once(addr, src string) {
	c, err := rbDial(addr, src, false)
	if err != nil {
		time.Sleep(50 * time.Millisecond) // the listen queue is full: an attacker just tries again
		return
	}
	defer c.Close()
	c.timeout = 10 * time.Minute
	rep, err := c.Read()
	if err != nil || rep.Code != 220 {
		if rep.Code == 421 {
			f.refused.Add(1)
		}
		select { // refused: again, a little later
		case <-f.stop:
		case <-time.After(200 * time.Millisecond):
		}
		return
	}
	f.held.Add(1)
	defer f.held.Add(-1)
	done := make(chan struct{})
	go func() {
		select {
		case <-f.stop:
			c.Close()
		case <-done:
		}
	}()
	rep, _ = c.Read() // idle until the server speaks
	close(done)
	if rep.Code == 421 && strings.HasPrefix(rep.Text(), "4.4.2") {
		f.cut.Add(1)
	}
}

func (f *flood) Stop() {
	close(f.stop)
	f.finished.Wait()
}

// TestTrustedClientOutlastsFlood is the goal of limits.reserved_connections_percent
// and stress mode, with the real binary and default limits (1000
// connections, 50 per address): 25 untrusted addresses keep 40 idle
// connections each open, re-opening whatever is closed, and the trusted
// application at 127.0.0.1 still gets 250 for every message, alone and
// several sessions at once. The flood holds at most the strangers' share
// (900), is refused beyond it, and its idle sessions are cut with
// 421 4.4.2 once the server is under stress.
func TestTrustedClientOutlastsFlood(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	raiseFileLimit(t, 8192)
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	r := n.relay("trusted_networks=[127.0.0.1/32]")

	var attackers []string
	for range 25 {
		attackers = append(attackers, relaytest.Loopback(t))
	}
	f := startFlood(r.SMTPAddr, attackers, 40)
	defer f.Stop()
	// Full: refused at the strangers' share, or (were there none) with
	// every connection taken.
	relaytest.Eventually(t, 2*time.Minute, "the flood to fill the strangers' share", func() error {
		if h, x := f.held.Load(), f.refused.Load(); h < 880 || x == 0 && h < 1000 {
			return fmt.Errorf("%d attack connections open, %d refused", h, x)
		}
		return nil
	})

	if h := f.held.Load(); h > 900 {
		t.Errorf("the flood holds %d connections, more than the strangers' 900 (1000 less 10%%)", h)
	}

	const sessions, perSession = 5, 4
	var wg sync.WaitGroup
	errs := make(chan error, sessions*perSession)
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := rbDialSMTP(r.SMTPAddr, "127.0.0.1", false, "app.test")
			if err != nil {
				errs <- fmt.Errorf("session %d: %w", s, err)
				return
			}
			defer c.Close()
			for m := range perSession {
				to := fmt.Sprintf("s%dm%d@dest.test", s, m)
				rep, err := c.Send(rbTx{From: "app@src.test", Rcpts: []string{to},
					Data: []byte("From: app@src.test\r\nTo: " + to + "\r\nSubject: during the flood\r\n\r\nhello\r\n")})
				if err != nil || rep.Code != 250 {
					errs <- fmt.Errorf("session %d message %d: %v %v, want 250", s, m, rep, err)
				}
				if _, err := c.Cmd("RSET"); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A new session for each message, as a simple application makes.
	for i := range 5 {
		out, code := peers.SwaksMessage{Server: r.SMTPAddr, LocalIP: "127.0.0.1", From: "app@src.test",
			To: []string{fmt.Sprintf("single%d@dest.test", i)}}.Send(t)
		if code != 0 || !strings.Contains(out, "250 2.0.0 OK queued as") {
			t.Errorf("swaks from the trusted application during the flood: exit %d\n%s", code, out)
		}
	}
	sink.WaitFor(t, sessions*perSession+5, 60*time.Second)

	// Under stress (750 connections and more), idle strangers go after
	// limits.stress_command_timeout (10 s), not command_timeout (5 min).
	relaytest.Eventually(t, time.Minute, "idle attack connections cut with 421 4.4.2", func() error {
		if c := f.cut.Load(); c < 100 {
			return fmt.Errorf("%d cut", c)
		}
		return nil
	})

	t.Logf("flood: %d open, %d refused at connect, %d cut when idle", f.held.Load(), f.refused.Load(), f.cut.Load())
}
