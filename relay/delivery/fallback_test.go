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

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
)

// TestDeliver_NextMXAfter421: a 421 from the first MX after the handshake
// (at MAIL, at RCPT, after the data) sends the recipients that got no
// definite answer to the second MX in the same attempt; a recipient the
// first MX refused with 550 before its 421 keeps that answer.
func TestDeliver_NextMXAfter421(t *testing.T) {
	t.Parallel()
	closing := reply(421, [3]int{4, 7, 0}, "Try again later, closing connection")
	for i, c := range []struct {
		name  string
		first fakeOpt
		to    []string
		moved []string // what the second MX gets
	}{
		{"at MAIL", fakeOpt{mail: func(int) error { return closing }}, []string{"a@next.test"}, []string{"a@next.test"}},
		{"at RCPT", fakeOpt{rcpt: func(_ int, to string) error {
			switch {
			case strings.HasPrefix(to, "bad@"):
				return reply(550, [3]int{5, 1, 1}, "no such user")
			case strings.HasPrefix(to, "c@"):
				return closing
			}
			return nil
		}}, []string{"bad@next.test", "b@next.test", "c@next.test", "d@next.test"}, []string{"b@next.test", "c@next.test", "d@next.test"}},
		{"after the data", fakeOpt{data: func(int) error { return closing }}, []string{"a@next.test"}, []string{"a@next.test"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ip1, ip2 := fmt.Sprintf("127.0.0.%d", 70+2*i), fmt.Sprintf("127.0.0.%d", 71+2*i)
			h.dns.MX("next.test", 10, "mx1.next.test").A("mx1.next.test", ip1).
				MX("next.test", 20, "mx2.next.test").A("mx2.next.test", ip2)
			first := startMX(t, ip1, h.port, c.first)
			second := startMX(t, ip2, h.port, fakeOpt{})
			id := h.enqueue("alice@sender.test", c.to...)
			h.start()
			eventually(t, wait, "all recipients final", func() bool { return h.gone(id) })
			if txs := second.delivered(); len(txs) != 1 || !slices.Equal(txs[0].accepted, c.moved) {
				t.Fatalf("second MX got %+v, want one transaction for %v", txs, c.moved)
			}
			if n := len(first.delivered()); n != 0 || len(first.connections()) != 1 {
				t.Errorf("first MX: %d deliveries on %d connections, want none on 1", n, len(first.connections()))
			}
			for _, rc := range c.moved {
				outs := h.outcomes(rc)
				if len(outs) != 1 || outs[0]["outcome"] != "delivered" || outs[0]["mx_addr"] != ip2 || outs[0]["attempt"] != int64(1) {
					t.Errorf("%s: logged %v, want delivered at %s in the first attempt", rc, outs, ip2)
				}
			}
			if !slices.Contains(c.to, "bad@next.test") {
				return
			}
			if outs := h.outcomes("bad@next.test"); len(outs) != 1 || outs[0]["outcome"] != "failed" || outs[0]["code"] != int64(550) {
				t.Errorf("bad@: logged %v, want failed with the first MX's 550", outs)
			}
			if tx := second.transactions(); slices.Contains(tx[0].tried, "bad@next.test") {
				t.Errorf("the second MX was asked about bad@ after the first refused it: %v", tx[0].tried)
			}
			eventually(t, wait, "the DSN", func() bool { return len(h.dsns()) == 1 })
			if d := h.dsns()[0].data; !strings.Contains(d, "bad@next.test") || strings.Contains(d, "b@next.test") {
				t.Errorf("DSN:\n%s", d)
			}
		})
	}
}

// TestDeliver_ReusedConnection421: a 421 at MAIL on a reused connection
// ("too many messages on this connection") is answered with a fresh
// connection in the same attempt.
func TestDeliver_ReusedConnection421(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.dns.MX("perconn.test", 10, "mx.perconn.test").A("mx.perconn.test", "127.0.0.78")
	f := startMX(t, "127.0.0.78", h.port, fakeOpt{mail: func(n int) error {
		if n == 1 {
			return reply(421, [3]int{4, 7, 0}, "Too many messages on this connection")
		}
		return nil
	}})
	a := h.enqueue("alice@sender.test", "a@perconn.test")
	b := h.enqueue("bob@sender.test", "b@perconn.test")
	h.start()
	eventually(t, wait, "both delivered", func() bool { return h.gone(a) && h.gone(b) })
	if d, c := len(f.delivered()), len(f.connections()); d != 2 || c != 2 {
		t.Errorf("%d deliveries on %d connections, want 2 on 2", d, c)
	}
	for _, rc := range []string{"a@perconn.test", "b@perconn.test"} {
		if outs := h.outcomes(rc); len(outs) != 1 || outs[0]["outcome"] != "delivered" {
			t.Errorf("%s: logged %v, want delivered in the first attempt", rc, outs)
		}
	}
	if n := counter(h.m.Deliveries, "deferred", "rate-limited"); n != 0 {
		t.Errorf("the 421 was stored as a deferral (%v)", n)
	}
}

// TestDeliver_LostFinalReplyDefers: when the data went through but the
// reply to the final dot never came, the message may have been delivered
// (RFC 1047): the recipient is deferred, not offered to the next MX at once.
func TestDeliver_LostFinalReplyDefers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) { c.Delivery.DataTimeout = 200 * time.Millisecond })
	h.dns.MX("slowdot.test", 10, "mx1.slowdot.test").A("mx1.slowdot.test", "127.0.0.79").
		MX("slowdot.test", 20, "mx2.slowdot.test").A("mx2.slowdot.test", "127.0.0.80")
	startMX(t, "127.0.0.79", h.port, fakeOpt{data: func(int) error {
		time.Sleep(500 * time.Millisecond)
		return nil
	}})
	second := startMX(t, "127.0.0.80", h.port, fakeOpt{})
	h.enqueue("alice@sender.test", "a@slowdot.test")
	h.start()
	eventually(t, wait, "the first attempt", func() bool { return len(h.outcomes("a@slowdot.test")) > 0 })
	if outs := h.outcomes("a@slowdot.test"); outs[0]["outcome"] != "deferred" || outs[0]["mx_addr"] != "127.0.0.79" {
		t.Errorf("first attempt %v, want deferred at the first MX", outs[0])
	}
	if n := len(second.transactions()); n != 0 {
		t.Errorf("the second MX got %d transactions in the same attempt, want none", n)
	}
}

// TestDeliver_InlineChunkLostReplyDefers: a one-recipient message goes
// out whole with its envelope (MAIL, RCPT, BDAT and the chunk in one
// write). When the RCPT's reply never comes, the peer holds the whole
// message and may deliver it; here it does, once its slow RCPT check
// returns. The recipient is deferred, not offered to the next MX at once.
func TestDeliver_InlineChunkLostReplyDefers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) { c.Delivery.CommandTimeout = 200 * time.Millisecond })
	h.dns.MX("slowrcpt.test", 10, "mx1.slowrcpt.test").A("mx1.slowrcpt.test", "127.0.0.83").
		MX("slowrcpt.test", 20, "mx2.slowrcpt.test").A("mx2.slowrcpt.test", "127.0.0.84")
	first := startMX(t, "127.0.0.83", h.port, fakeOpt{rcpt: func(int, string) error {
		time.Sleep(500 * time.Millisecond)
		return nil
	}})
	second := startMX(t, "127.0.0.84", h.port, fakeOpt{})
	h.enqueue("alice@sender.test", "a@slowrcpt.test")
	h.start()
	eventually(t, wait, "the first attempt", func() bool { return len(h.outcomes("a@slowrcpt.test")) > 0 })
	if outs := h.outcomes("a@slowrcpt.test"); outs[0]["outcome"] != "deferred" || outs[0]["mx_addr"] != "127.0.0.83" {
		t.Errorf("first attempt %v, want deferred at the first MX", outs[0])
	}
	eventually(t, wait, "the first MX to take the message anyway", func() bool { return len(first.delivered()) == 1 })
	if n := len(second.transactions()); n != 0 {
		t.Errorf("the second MX got %d transactions in the same attempt, want none (a duplicate)", n)
	}
}

// TestGreylisting_StickyThrough421: a recipient greylisted by the second
// MX (reached after a 421 from the first) stays bound to it when every MX
// answers 421 on the next attempt, and is delivered there afterwards.
func TestGreylisting_StickyThrough421(t *testing.T) {
	t.Parallel()
	// Each attempt on new connections: a connection kept from the first
	// attempt would answer the second attempt's MAIL with the script's
	// 421, and the second MX would then take the message in that attempt.
	h := newHarness(t, func(c *config.Config) { c.Delivery.ConnectionCacheTime = 0 })
	const pref, grey = "127.0.0.81", "127.0.0.82"
	h.dns.MX("sticky.test", 10, "mx1.sticky.test").A("mx1.sticky.test", pref).
		MX("sticky.test", 20, "mx2.sticky.test").A("mx2.sticky.test", grey)
	closing := reply(421, [3]int{4, 3, 2}, "closing channel")
	p := startMX(t, pref, h.port, fakeOpt{mail: func(int) error { return closing }})
	g := startMX(t, grey, h.port, fakeOpt{
		mail: func(n int) error {
			if n == 1 {
				return closing
			}
			return nil
		},
		rcpt: func(n int, _ string) error {
			if n == 0 {
				return reply(451, [3]int{4, 7, 1}, "Greylisted, please try again later")
			}
			return nil
		}})
	id := h.enqueue("alice@sender.test", "s@sticky.test")
	h.start()
	eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	outs := h.outcomes("s@sticky.test")
	if len(outs) != 3 || outs[0]["reason"] != "greylisted" || outs[1]["outcome"] != "deferred" || outs[1]["reason"] == "greylisted" {
		t.Fatalf("attempts %v, want greylisted, deferred by the 421s, delivered", outs)
	}
	if outs[2]["mx_addr"] != grey || len(g.delivered()) != 1 {
		t.Errorf("delivered at %v, want the greylisting MX %s", outs[2]["mx_addr"], grey)
	}
	// The preferred MX is asked in the first two attempts only: the third
	// goes to the greylisting MX first, which takes the message.
	if n := len(p.transactions()); n != 2 {
		t.Errorf("preferred MX saw %d transactions, want 2 (stickiness lost after the 421s?)", n)
	}
}

// TestShutdown_PeerSilent: cancelling Run while a reused connection waits
// for a peer that never answers the next MAIL or QUIT ends Run within
// seconds, not after the command timeout.
func TestShutdown_PeerSilent(t *testing.T) {
	t.Parallel()
	for i, c := range []struct {
		name     string
		messages int
		verb     string // the command the peer never answers
		n        int    // its n-th time
	}{
		{"QUIT after the last message", 1, "QUIT", 1},
		{"MAIL of the next message", 2, "MAIL", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *config.Config) { c.Delivery.CommandTimeout = 10 * time.Minute })
			ip := fmt.Sprintf("127.0.0.%d", 83+i)
			h.dns.MX("mute.test", 10, "mx.mute.test").A("mx.mute.test", ip)
			p := startMutePeer(t, ip, h.port)
			for range c.messages {
				h.enqueue("alice@sender.test", "m@mute.test")
			}
			h.start()
			eventually(t, wait, c.verb+" sent", func() bool { return p.saw(c.verb) >= c.n })
			h.cancel()
			select {
			case err := <-h.done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("Run still running 5s after cancel (command_timeout %v)", h.cfg.Delivery.CommandTimeout)
			}
			h.cancel = nil
		})
	}
}

// TestDSNLifetime: a DSN that cannot be delivered is given up after
// retry.dsn_lifetime, logged and dropped without a DSN about it, while an
// ordinary message to the same place keeps its retry.lifetime.
func TestDSNLifetime(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) { c.Retry.DSNLifetime = 600 * time.Millisecond })
	h.dns.MX("stuck.test", 10, "mx.stuck.test").A("mx.stuck.test", "127.0.0.85")
	startMX(t, "127.0.0.85", h.port, fakeOpt{rcpt: func(int, string) error {
		return reply(451, [3]int{4, 7, 1}, "Greylisted, please try again later")
	}})
	arrival := time.Now()
	bounce := h.enqueueMsg(queue.NewMessage{From: "", DSN: true, Arrival: arrival}, "x@stuck.test")
	plain := h.enqueueMsg(queue.NewMessage{From: "alice@sender.test", Arrival: arrival}, "y@stuck.test")
	h.start()
	eventually(t, wait, "the DSN given up", func() bool { return h.gone(bounce) })
	outs := h.outcomes("x@stuck.test")
	if last := outs[len(outs)-1]; last["outcome"] != "failed" || last["reason"] != "greylisted" {
		t.Errorf("last attempt %v, want failed (expired), reason greylisted", last)
	}
	if n := h.logs.FilterMessageSnippet("lifetime expired").Len(); n != 1 {
		t.Errorf("%d expiry log lines, want 1", n)
	}
	if n := h.logs.FilterMessageSnippet("no DSN about a bounce").Len(); n != 1 {
		t.Errorf("%d 'no DSN about a bounce' log lines, want 1", n)
	}
	if r, ok := h.rcpt(plain, 0); !ok || r.Status == queue.Failed {
		t.Errorf("ordinary message: %+v, want still being retried", r)
	}
	if n := len(h.dsns()); n != 0 {
		t.Errorf("%d DSNs, want none", n)
	}
}

func TestLifetime(t *testing.T) {
	for _, c := range []struct {
		name           string
		lifetime, dsnL time.Duration
		dsn            bool
		want           time.Duration
	}{
		{"ordinary message", 120 * time.Hour, 48 * time.Hour, false, 120 * time.Hour},
		{"DSN", 120 * time.Hour, 48 * time.Hour, true, 48 * time.Hour},
		{"DSN, lifetime shorter", 10 * time.Minute, 48 * time.Hour, true, 10 * time.Minute},
	} {
		cfg := &config.Config{Retry: config.Retry{Lifetime: c.lifetime, DSNLifetime: c.dsnL}}
		e := &Engine{cfg: cfg, policy: cfg.Retry.Policy()}
		if got := e.lifetime(queue.Message{DSN: c.dsn}); got != c.want {
			t.Errorf("%s: lifetime %v, want %v", c.name, got, c.want)
		}
	}
}

// mutePeer is a minimal SMTP server that answers the first transaction of
// each connection and then reads on but never answers again, like a peer
// that hangs after a delivery.
type mutePeer struct {
	mu    sync.Mutex
	lines []string
}

func startMutePeer(t *testing.T, ip string, port int) *mutePeer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	p := &mutePeer{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return p
}

func (p *mutePeer) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	say := func(s string) { _, _ = io.WriteString(c, s+"\r\n") }
	say("220 mute.test ESMTP")
	mute := false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		verb, _, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
		p.mu.Lock()
		p.lines = append(p.lines, verb)
		p.mu.Unlock()
		switch verb = strings.ToUpper(verb); {
		case mute:
		case verb == "EHLO", verb == "MAIL", verb == "RCPT":
			say("250 ok")
		case verb == "DATA":
			say("354 go ahead")
			for l := ""; l != ".\r\n"; {
				if l, err = br.ReadString('\n'); err != nil {
					return
				}
			}
			say("250 queued")
			mute = true
		default:
			say("502 not implemented")
		}
	}
}

// saw returns how many commands with verb the peer has received.
func (p *mutePeer) saw(verb string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.lines {
		if l == verb {
			n++
		}
	}
	return n
}
