package integration

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestRobustHostileNextHop: a hostile or slow next hop cannot hold a
// delivery worker past its timeouts or make it buffer without bound. Each
// of these destinations is a scripted raw TCP peer that misbehaves:
//
//	stall     220, then never answers EHLO
//	endless   answers EHLO with "250-" continuation lines forever
//	longline  answers EHLO with one 100 KB line without CRLF
//	garbage   answers MAIL with "999 ..." (no such reply class)
//	nocode    greets with a line that has no reply code
//	nodot     takes the whole message and never answers the final dot
//	inject    answers STARTTLS with "220" and "250 injected" in one write
//	          (the 2021 response injection), then refuses RCPT with 450
//	drip      drips its greeting one byte every 200 ms, without CRLF
//
// With delivery timeouts of 3 s, every connection to them ends within the
// timeouts (plus slack), every message is deferred (queue status deferred
// with a reason, never failed), the relay's RSS stays under 200 MB, and a
// healthy destination keeps receiving mail while the hostile connections
// are still open.
func TestRobustHostileNextHop(t *testing.T) {
	t.Parallel()
	const timeout = 3 * time.Second
	relayIP, healthyIP, clientIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	cert := peers.NewCert(t, "inject.test")
	scripts := []struct {
		name   string
		script func(*rbPeerConn)
	}{
		{"stall", rbStall},
		{"endless", rbEndless},
		{"longline", rbLongLine},
		{"garbage", rbGarbage},
		{"nocode", rbNoCode},
		{"nodot", rbNoDot},
		{"inject", func(c *rbPeerConn) { rbInject(c, cert.Config) }},
		{"drip", rbDrip},
	}
	routes := map[string]string{}
	hostile := map[string]*rbPeer{}
	var hostIPs []string // seven hostile hosts, each serving several scripts on its own ports
	for range 7 {
		hostIPs = append(hostIPs, relaytest.Loopback(t))
	}
	for i, s := range scripts {
		p := rbStartPeer(t, hostIPs[i%7], s.script)
		hostile[s.name] = p
		routes[s.name+".test"] = p.Addr
	}
	var openAtHealthy []int
	var mu sync.Mutex
	openHostile := func() int {
		n := 0
		for _, p := range hostile {
			n += p.open()
		}
		return n
	}
	sink := peers.StartSink(t, healthyIP+":0", peers.SinkOptions{Data: func([]string, int) *smtp.SMTPError {
		mu.Lock()
		openAtHealthy = append(openAtHealthy, openHostile())
		mu.Unlock()
		return nil
	}})
	routes["healthy.test"] = sink.Addr
	d := timeout.String()
	cfg := rbRelay{IP: relayIP, Routes: routes,
		Delivery: map[string]string{"tls": "may", "connect_timeout": d, "greeting_timeout": d, "command_timeout": d, "data_timeout": d},
		// One attempt each: the first retry would come long after the test.
		Retry: map[string]string{"initial_interval": "30m", "max_interval": "1h", "greylist_first_retry": "30m", "greylist_second_retry": "30m"}}
	r := peers.StartRelay(t, cfg.YAML(t))

	var maxRSS atomic.Int64
	stopRSS := make(chan struct{})
	rssDone := make(chan struct{})
	go func() {
		defer close(rssDone)
		for {
			if rss, err := rbRSS(r.Cmd.Process.Pid); err == nil && rss > maxRSS.Load() {
				maxRSS.Store(rss)
			}
			select {
			case <-stopRSS:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	c, err := rbDialSMTP(r.SMTPAddr, clientIP, false, "client.test")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ids := map[string]string{} // domain → queue id
	submitted := time.Now()
	for _, s := range scripts {
		data := []byte("Subject: to " + s.name + "\r\nMessage-ID: <" + s.name + "@hostile.test>\r\n\r\nhello\r\n")
		rep, err := c.Send(rbTx{From: "app@src.test", Rcpts: []string{"user@" + s.name + ".test"}, Data: data})
		if err != nil || rep.Code != 250 {
			t.Fatalf("submit to %s: %v %v", s.name, rep, err)
		}
		ids[s.name+".test"] = rep.Lines[0][strings.LastIndexByte(rep.Lines[0], ' ')+1:]
	}
	// While the hostile peers hold their connections, the healthy
	// destination must keep flowing.
	rbWaitUntil(t, 10*time.Second, "connections to the stalling peers", func() bool {
		return hostile["stall"].open() > 0 && hostile["nodot"].open() > 0 && hostile["drip"].open() > 0
	})
	const healthy = 10
	for i := range healthy {
		data := []byte(fmt.Sprintf("Subject: healthy %d\r\nMessage-ID: <healthy.%d@hostile.test>\r\n\r\nhello\r\n", i, i))
		if rep, err := c.Send(rbTx{From: "app@src.test", Rcpts: []string{"user@healthy.test"}, Data: data}); err != nil || rep.Code != 250 {
			t.Fatalf("submit healthy %d: %v %v", i, rep, err)
		}
	}
	sink.WaitFor(t, healthy, 10*time.Second)
	mu.Lock()
	if openAtHealthy[0] == 0 {
		t.Errorf("no hostile connection was open when the first healthy message arrived (%v): the test proves nothing", openAtHealthy)
	}
	mu.Unlock()

	// Every hostile attempt is settled as a deferral with a reason.
	for _, s := range scripts {
		dom := s.name + ".test"
		var rows []rbRow
		rbWaitUntil(t, 30*time.Second, dom+" deferred", func() bool {
			rows, _ = rbQueue(t, r, "domain="+dom)
			return len(rows) == 1 && rows[0].Status != "queued" && rows[0].Status != "active"
		})
		row := rows[0]
		if row.Status != "deferred" || row.Reason == "" {
			t.Errorf("%s: status %q reason %q, want deferred with a reason", dom, row.Status, row.Reason)
		}
		show := rbShowMessage(t, r, ids[dom])
		for _, h := range show.Recipients[0].History {
			if h.End == nil {
				t.Errorf("%s: attempt without an end", dom)
				continue
			}
			// Each attempt ends within its timeouts: at most two
			// connections (the plaintext retry of TLS "may"), each with
			// one timeout, plus slack.
			if took := h.End.Sub(h.Start); took > 2*timeout+3*time.Second {
				t.Errorf("%s: attempt took %v", dom, took)
			}
		}
		for _, h := range show.Recipients[0].History {
			took := "?"
			if h.End != nil {
				took = h.End.Sub(h.Start).Round(time.Millisecond).String()
			}
			t.Logf("%-14s %s/%s: attempt at stage %s took %s", dom, row.Status, row.Reason, h.Stage, took)
		}
	}
	// The injected reply was not taken for the reply to EHLO: the attempt
	// got as far as RCPT and ended with the peer's own 450.
	if rows, _ := rbQueue(t, r, "domain=inject.test"); len(rows) == 1 {
		if lr := rows[0].LastReply; lr == nil || lr.Code != 450 || !strings.Contains(lr.Text, "inject-marker") {
			t.Errorf("inject.test: last reply %+v, want the peer's 450 at RCPT", lr)
		}
	}
	// Connections, as the peers saw them, ended in time too. (A peer
	// notices the close at its next read or write: wait for that.)
	rbWaitUntil(t, 5*time.Second, "the hostile peers to see their connections closed", func() bool { return openHostile() == 0 })
	for name, p := range hostile {
		ds := p.durations()
		for _, d := range ds {
			if d > timeout+2*time.Second {
				t.Errorf("%s: a connection stayed open %v (timeouts are %v)", name, d, timeout)
			}
		}
		t.Logf("%-8s saw %d connection(s) lasting %v", name, len(ds), ds)
	}
	close(stopRSS)
	<-rssDone
	if rss := maxRSS.Load(); rss > 200<<20 || rss == 0 {
		t.Errorf("relay RSS peaked at %d MB, want under 200 MB", rss>>20)
	} else {
		t.Logf("relay RSS peak: %.1f MB; hostile attempts settled %v after submission", float64(rss)/(1<<20), time.Since(submitted).Round(time.Millisecond))
	}
	if st := rbStats(t, r); st.ByStatus["failed"] != 0 {
		t.Errorf("%d recipients failed: a hostile peer's nonsense must defer, not bounce", st.ByStatus["failed"])
	}
	if !r.Running() {
		t.Errorf("the relay died")
	}
}

// rbPeer is a scripted raw TCP server: each connection runs script.
type rbPeer struct {
	Addr string
	ln   net.Listener
	stop chan struct{}

	mu    sync.Mutex
	live  int
	spans []time.Duration
}

// rbPeerConn is one connection to an rbPeer.
type rbPeerConn struct {
	net.Conn
	br   *bufio.Reader
	stop chan struct{}
}

func rbStartPeer(t testing.TB, ip string, script func(*rbPeerConn)) *rbPeer {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	p := &rbPeer{Addr: ln.Addr().String(), ln: ln, stop: make(chan struct{})}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.track(+1, 0)
				start := time.Now()
				_ = c.SetDeadline(time.Now().Add(time.Minute))
				script(&rbPeerConn{Conn: c, br: bufio.NewReader(c), stop: p.stop})
				c.Close()
				p.track(-1, time.Since(start))
			}()
		}
	}()
	t.Cleanup(func() { close(p.stop); ln.Close(); wg.Wait() })
	return p
}

func (p *rbPeer) track(delta int, span time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live += delta
	if delta < 0 {
		p.spans = append(p.spans, span)
	}
}

func (p *rbPeer) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live
}

func (p *rbPeer) durations() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.spans...)
}

func (c *rbPeerConn) say(s string) bool {
	_, err := io.WriteString(c, s)
	return err == nil
}

// line reads one command line ("" on error).
func (c *rbPeerConn) line() string {
	l, err := c.br.ReadString('\n')
	if err != nil {
		return ""
	}
	return strings.TrimRight(l, "\r\n")
}

// drain reads until the client closes the connection: the peer never
// closes first, so the connection's lifetime is the relay's decision.
func (c *rbPeerConn) drain() {
	_, _ = io.Copy(io.Discard, c.br)
}

func rbStall(c *rbPeerConn) {
	c.say("220 stall.test ESMTP\r\n")
	c.drain()
}

func rbEndless(c *rbPeerConn) {
	c.say("220 endless.test ESMTP\r\n")
	c.line()
	go c.drain() // notices the close
	line := "250-" + strings.Repeat("x", 70) + "\r\n"
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		if !c.say(line) {
			return
		}
	}
}

func rbLongLine(c *rbPeerConn) {
	c.say("220 longline.test ESMTP\r\n")
	c.line()
	c.say("250-" + strings.Repeat("a", 100<<10))
	c.drain()
}

func rbGarbage(c *rbPeerConn) {
	c.say("220 garbage.test ESMTP\r\n")
	for {
		l := c.line()
		switch verb := strings.ToUpper(strings.SplitN(l, " ", 2)[0]); {
		case l == "":
			return
		case verb == "EHLO" || verb == "HELO":
			c.say("250 garbage.test\r\n")
		case verb == "MAIL":
			c.say("999 what is this\r\n")
		case verb == "QUIT":
			c.say("221 bye\r\n")
			return
		default:
			c.say("999 what is this\r\n")
		}
	}
}

func rbNoCode(c *rbPeerConn) {
	c.say("hello there, no reply code here\r\n")
	c.drain()
}

func rbNoDot(c *rbPeerConn) {
	c.say("220 nodot.test ESMTP\r\n")
	for {
		l := c.line()
		switch verb := strings.ToUpper(strings.SplitN(l, " ", 2)[0]); {
		case l == "":
			return
		case verb == "DATA":
			c.say("354 go ahead\r\n")
			if _, err := rbReadRawData(c.br); err != nil {
				return
			}
			c.drain() // and never answer
			return
		case verb == "QUIT":
			c.say("221 bye\r\n")
			return
		default:
			c.say("250 OK\r\n")
		}
	}
}

// rbInject offers STARTTLS and answers it with 220 followed, in the same
// write, by "250 injected" (NO STARTTLS, response injection). Inside TLS,
// and on a plaintext retry, it refuses RCPT with a recognisable 450.
func rbInject(c *rbPeerConn, cfg *tls.Config) {
	c.say("220 inject.test ESMTP\r\n")
	for {
		l := c.line()
		switch verb := strings.ToUpper(strings.SplitN(l, " ", 2)[0]); {
		case l == "":
			return
		case verb == "EHLO":
			c.say("250-inject.test\r\n250 STARTTLS\r\n")
		case verb == "STARTTLS":
			if !c.say("220 2.0.0 go ahead\r\n250 injected\r\n") {
				return
			}
			tc := tls.Server(c.Conn, cfg)
			if err := tc.Handshake(); err != nil {
				return
			}
			c.Conn, c.br = tc, bufio.NewReader(tc)
		case verb == "RCPT":
			c.say("450 4.2.0 inject-marker mailbox busy\r\n")
		case verb == "QUIT":
			c.say("221 bye\r\n")
			return
		default:
			c.say("250 OK\r\n")
		}
	}
}

func rbDrip(c *rbPeerConn) {
	go c.drain()
	if !c.say("220 ") {
		return
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
			if !c.say("x") {
				return
			}
		}
	}
}
