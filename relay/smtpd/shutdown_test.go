package smtpd

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func shutdownAsync(e *testEnv, timeout time.Duration) chan error {
	ch := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		ch <- e.srv.Shutdown(ctx)
	}()
	return ch
}

func inData(t *testing.T, e *testEnv) *client {
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "250 ")
	c.cmd("DATA", "354 ")
	c.write("Subject: x\r\n\r\nfirst part\r\n")
	// go-smtp writes 354 before it calls Data: wait until the session is
	// really inside Data, or a Shutdown may find it idle and close it.
	deadline := time.Now().Add(5 * time.Second)
	for e.srv.inData.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the session never entered Data")
		}
		time.Sleep(2 * time.Millisecond)
	}
	return c
}

// waitDraining waits until Shutdown has reached the connections.
func waitDraining(t *testing.T, e *testEnv) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.srv.lim.mu.Lock()
		d := e.srv.lim.drain
		e.srv.lim.mu.Unlock()
		if d {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("Shutdown did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestShutdown_IdleAndMidData(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	idle := dial(t, e.addr(0))
	idle.hello()
	busy := inData(t, e)
	done := shutdownAsync(e, 5*time.Second)
	waitDraining(t, e)
	idle.expect("421 4.3.2")
	idle.expectClosed()
	// New connections are not accepted.
	if c, err := net.DialTimeout("tcp", e.addr(0), time.Second); err == nil {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b, _ := io.ReadAll(c)
		if strings.HasPrefix(string(b), "220") {
			t.Error("greeted after Shutdown")
		}
		c.Close()
	}
	// The session in DATA finishes: commit, 250, close.
	busy.write("second part\r\n.\r\n")
	busy.expect("250 2.0.0 OK queued as")
	busy.expectClosed()
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if len(e.q.messages()) != 1 {
		t.Fatal("message not committed")
	}
}

func TestShutdown_DeadlineAbortsData(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	busy := inData(t, e)
	done := shutdownAsync(e, 200*time.Millisecond)
	busy.expect("421 4.3.2")
	busy.expectClosed()
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v", err)
	}
	if len(e.q.messages()) != 0 {
		t.Fatal("message committed without a final dot")
	}
}

// TestShutdown_CommitInProgress: a message already being committed when
// the deadline passes gets its 250 after the commit, never before.
func TestShutdown_CommitInProgress(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	gate, waiting := make(chan struct{}), make(chan struct{}, 1)
	e.q.mu.Lock()
	e.q.gate, e.q.waiting = gate, waiting
	e.q.mu.Unlock()
	busy := inData(t, e)
	busy.write(".\r\n")
	<-waiting // Data is now waiting in Enqueue
	done := shutdownAsync(e, 100*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned during a commit: %v", err)
	default:
	}
	if len(e.q.messages()) != 0 {
		t.Fatal("committed before the gate opened")
	}
	close(gate)
	busy.expect("250 2.0.0 OK queued as")
	if len(e.q.messages()) != 1 {
		t.Fatal("250 without a commit")
	}
	busy.expectClosed()
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestShutdown_BetweenCommands(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "250 ")
	// Shutdown reaches the connection between two commands: the next
	// command is not run, the client gets 421 4.3.2.
	tc := e.srv.lim.snapshot(false)[0]
	tc.mu.Lock()
	tc.draining = true
	tc.mu.Unlock()
	c.send("DATA")
	lines := c.reply()
	if strings.HasPrefix(lines[0], "354") {
		c.write("body\r\n.\r\n")
		lines = c.reply()
	}
	if !strings.HasPrefix(lines[0], "421 4.3.2") {
		t.Fatalf("reply %q", lines)
	}
	c.expectClosed()
	if len(e.q.messages()) != 0 {
		t.Fatal("message committed")
	}
}

func TestShutdown_NotStarted(t *testing.T) {
	srv, err := New(Options{Config: testConfig(t), Queue: &fakeQueue{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestShutdown_AwaitSessions: after the reads are stopped, Shutdown waits
// for the sessions to end, and no longer than that (it is told when one
// ends), or until replyFlush when one does not.
func TestShutdown_AwaitSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, err := New(Options{Config: testConfig(t), Queue: &fakeQueue{}})
		if err != nil {
			t.Fatal(err)
		}
		var ends []net.Conn
		admit := func() *conn {
			a, b := net.Pipe()
			ends = append(ends, a, b)
			c, refused := srv.lim.admit(a, false)
			if c == nil {
				t.Fatalf("not admitted: %s", refused)
			}
			return c
		}
		defer func() {
			for _, c := range ends {
				c.Close()
			}
		}()
		first, second := admit(), admit()
		go func() {
			time.Sleep(305 * time.Millisecond)
			first.kill()
			time.Sleep(207 * time.Millisecond)
			second.kill()
		}()
		start := time.Now()
		srv.awaitSessions(replyFlush)
		if waited := time.Since(start); waited != 512*time.Millisecond {
			t.Errorf("waited %v for sessions that ended after 512ms", waited)
		}
		srv.lim.mu.Lock()
		srv.lim.drain = false // admit one more
		srv.lim.mu.Unlock()
		admit()
		start = time.Now()
		srv.awaitSessions(replyFlush)
		if waited := time.Since(start); waited != replyFlush {
			t.Errorf("waited %v for a session that does not end, want %v", waited, replyFlush)
		}
	})
}
