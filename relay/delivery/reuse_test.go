package delivery

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
)

// TestDeliver_IdleConnectionClosed: the peer closes the connection once
// the first transaction is done, while it sits idle. The next message is
// sent on it without RSET, fails at MAIL with no recipient answered, and
// goes over a fresh connection in the same attempt: delivered at the first
// attempt, nothing deferred. With and without PIPELINING.
func TestDeliver_IdleConnectionClosed(t *testing.T) {
	t.Parallel()
	for i, pipelining := range []bool{true, false} {
		t.Run(fmt.Sprintf("pipelining=%v", pipelining), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ip := fmt.Sprintf("127.0.0.%d", 90+i)
			h.dns.MX("idle.test", 10, "mx.idle.test").A("mx.idle.test", ip)
			p := startCloser(t, ip, h.port, pipelining)
			a := h.enqueue("alice@sender.test", "a@idle.test")
			b := h.enqueue("bob@sender.test", "b@idle.test")
			h.start()
			eventually(t, wait, "both delivered", func() bool { return h.gone(a) && h.gone(b) })
			for _, rc := range []string{"a@idle.test", "b@idle.test"} {
				if outs := h.outcomes(rc); len(outs) != 1 || outs[0]["outcome"] != "delivered" || outs[0]["attempt"] != int64(1) {
					t.Errorf("%s: %v, want delivered at the first attempt", rc, outs)
				}
			}
			if n := counter(h.m.Deliveries, "delivered", "none"); n != 2 {
				t.Errorf("%v deliveries counted, want 2", n)
			}
			conns := p.conns()
			if len(conns) != 2 {
				t.Fatalf("%d connections, want 2: %q", len(conns), conns)
			}
			if got := strings.Join(conns[0], " "); got != "EHLO MAIL RCPT DATA" {
				t.Errorf("first connection: %s, want one transaction (the next MAIL found it closed)", got)
			}
			if slices.Contains(conns[1], "RSET") || slices.Contains(conns[0], "RSET") {
				t.Errorf("RSET sent: %q", conns)
			}
			if p.delivered() != 2 {
				t.Errorf("%d messages delivered, want 2", p.delivered())
			}
		})
	}
}

// closer is a line-based SMTP server that accepts everything and, after
// the first transaction of its first connection, closes that connection
// instead of waiting for the next command, like a peer whose idle timeout
// is shorter than our reuse. It records the verbs of every connection.
type closer struct {
	pipelining bool
	mu         sync.Mutex
	verbs      [][]string
	done       int
}

func startCloser(t *testing.T, ip string, port int, pipelining bool) *closer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	p := &closer{pipelining: pipelining}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			n := len(p.verbs)
			p.verbs = append(p.verbs, nil)
			p.mu.Unlock()
			wg.Go(func() { p.serve(c, n) })
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return p
}

func (p *closer) serve(c net.Conn, n int) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	say := func(s string) { _, _ = io.WriteString(c, s+"\r\n") }
	say("220 closer.test ESMTP")
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		verb, _, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
		verb, _, _ = strings.Cut(strings.ToUpper(verb), ":")
		p.mu.Lock()
		p.verbs[n] = append(p.verbs[n], verb)
		p.mu.Unlock()
		switch verb {
		case "EHLO":
			if p.pipelining {
				say("250-closer.test\r\n250 PIPELINING")
			} else {
				say("250 closer.test")
			}
		case "MAIL", "RCPT", "RSET":
			say("250 ok")
		case "DATA":
			say("354 go ahead")
			for l := ""; l != ".\r\n"; {
				if l, err = br.ReadString('\n'); err != nil {
					return
				}
			}
			say("250 queued")
			p.mu.Lock()
			p.done++
			p.mu.Unlock()
			if n == 0 {
				return
			}
		case "QUIT":
			say("221 bye")
			return
		default:
			say("502 not implemented")
		}
	}
}

// conns returns the verbs received on each connection.
func (p *closer) conns() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([][]string, len(p.verbs))
	for i, v := range p.verbs {
		out[i] = slices.Clone(v)
	}
	return out
}

// delivered returns how many messages the peer accepted.
func (p *closer) delivered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// TestDeliver_ConnectionKeptForNextMessage: a message that arrives after
// the previous one to its destination was sent goes over the connection
// that carried it, kept open for delivery.connection_cache_time, instead
// of waiting for that connection to close and a new one to open. With the
// cache time 0 the connection closes when no job waits.
func TestDeliver_ConnectionKeptForNextMessage(t *testing.T) {
	t.Parallel()
	for i, tc := range []struct {
		keep  time.Duration
		conns int
	}{
		{time.Minute, 1},
		{0, 2},
	} {
		t.Run(fmt.Sprintf("keep=%v", tc.keep), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *config.Config) { c.Delivery.ConnectionCacheTime = tc.keep })
			ip := fmt.Sprintf("127.0.0.%d", 94+i)
			h.dns.MX("kept.test", 10, "mx.kept.test").A("mx.kept.test", ip)
			mx := startMX(t, ip, h.port, fakeOpt{})
			h.start()
			a := h.enqueue("alice@sender.test", "a@kept.test")
			eventually(t, wait, "the first delivered", func() bool { return h.gone(a) })
			b := h.enqueue("bob@sender.test", "b@kept.test")
			eventually(t, wait, "the second delivered", func() bool { return h.gone(b) })
			txs := mx.delivered()
			if len(txs) != 2 {
				t.Fatalf("%d messages delivered, want 2", len(txs))
			}
			if n := len(mx.connections()); n != tc.conns {
				t.Errorf("%d connections for two messages, want %d", n, tc.conns)
			}
		})
	}
}
