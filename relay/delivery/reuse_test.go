package delivery

import (
	"fmt"
	"github.com/greyrelay/greyrelay/queue"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestDeliver_IdleConnectionClosed: the peer closes the connection once
// the first transaction is done, while it sits idle. The next message is
// sent on it without RSET, fails at MAIL with no recipient answered, and
// goes over a fresh connection in the same attempt: delivered at the first
// attempt, nothing deferred. With and without PIPELINING.
func TestDeliver_IdleConnectionClosed(t *testing.T) {
	t.Parallel()
	for _, pipelining := range []bool{true, false} {
		t.Run(fmt.Sprintf("pipelining=%v", pipelining), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ip := relaytest.Loopback(t)
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
			conns := verbs(p.Conns())
			if len(conns) != 2 {
				t.Fatalf("%d connections, want 2: %q", len(conns), conns)
			}
			if got := strings.Join(conns[0], " "); got != "EHLO MAIL RCPT DATA" {
				t.Errorf("first connection: %s, want one transaction (the next MAIL found it closed)", got)
			}
			if slices.Contains(conns[1], "RSET") || slices.Contains(conns[0], "RSET") {
				t.Errorf("RSET sent: %q", conns)
			}
			if _, data, _ := p.Received(); len(data) != 2 {
				t.Errorf("%d messages delivered, want 2", len(data))
			}
		})
	}
}

// startCloser starts a transcript peer that accepts everything and,
// after the first transaction of its first connection, closes that
// connection instead of waiting for the next command, like a peer whose
// idle timeout is shorter than our reuse. The second connection takes one
// message and a QUIT.
func startCloser(t *testing.T, ip string, port int, pipelining bool) *relaytest.Peer {
	t.Helper()
	ehlo := relaytest.Step{Expect: "EHLO", Send: "250 closer.test\r\n"}
	tx := []relaytest.Step{
		{Expect: "MAIL", Send: "250 ok\r\n"},
		{Expect: "RCPT", Send: "250 ok\r\n"},
		{Expect: "DATA", Send: "354 go ahead\r\n"},
	}
	if pipelining {
		ehlo.Send = "250-closer.test\r\n250 PIPELINING\r\n"
		tx = []relaytest.Step{{Expect: "MAIL", Pipe: []string{"RCPT", "DATA"}, Send: "250 ok\r\n250 ok\r\n354 go ahead\r\n"}}
	}
	greet := relaytest.Step{Send: "220 closer.test ESMTP\r\n"}
	first := append(append([]relaytest.Step{greet, ehlo}, tx...), relaytest.Step{Data: true, Send: "250 queued\r\n", Close: true})
	second := append(append([]relaytest.Step{greet, ehlo}, tx...),
		relaytest.Step{Data: true, Send: "250 queued\r\n"}, relaytest.Step{Expect: "QUIT", Send: "221 bye\r\n"})
	return relaytest.StartPeer(t, net.JoinHostPort(ip, strconv.Itoa(port)), relaytest.PeerOptions{Timeout: time.Minute}, first, second)
}

// TestDeliver_ConnectionKeptForNextMessage: a message that arrives after
// the previous one to its destination was sent goes over the connection
// that carried it, kept open for delivery.connection_cache_time, instead
// of waiting for that connection to close and a new one to open. With the
// cache time 0 the connection closes when no job waits.
func TestDeliver_ConnectionKeptForNextMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		keep  time.Duration
		conns int
	}{
		{time.Minute, 1},
		{0, 2},
	} {
		t.Run(fmt.Sprintf("keep=%v", tc.keep), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *config.Config) { c.Delivery.ConnectionCacheTime = tc.keep })
			ip := relaytest.Loopback(t)
			h.dns.MX("kept.test", 10, "mx.kept.test").A("mx.kept.test", ip)
			mx := startMX(t, ip, h.port, relaytest.MXOptions{})
			h.start()
			a := h.enqueue("alice@sender.test", "a@kept.test")
			eventually(t, wait, "the first delivered", func() bool { return h.gone(a) })
			b := h.enqueue("bob@sender.test", "b@kept.test")
			eventually(t, wait, "the second delivered", func() bool { return h.gone(b) })
			txs := mx.Delivered()
			if len(txs) != 2 {
				t.Fatalf("%d messages delivered, want 2", len(txs))
			}
			if n := len(mx.Connections()); n != tc.conns {
				t.Errorf("%d connections for two messages, want %d", n, tc.conns)
			}
		})
	}
}

// TestDeliver_NothingLearnedNothingStored: messages accepted by a
// destination that never deferred teach nothing worth a write, so its
// record is not stored (nor shared with other nodes) per message (the run of accepted
// messages stays in memory until a refusal makes it useful).
func TestDeliver_NothingLearnedNothingStored(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ip := relaytest.Loopback(t)
	h.dns.MX("plain.test", 10, "mx.plain.test").A("mx.plain.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{})
	h.start()
	for _, rc := range []string{"a@plain.test", "b@plain.test", "c@plain.test"} {
		id := h.enqueue("alice@sender.test", rc)
		eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	}
	// The first outcome stores the destination's record once (the queue
	// had none); the next two must not rewrite it.
	rec, _, err := h.q.Destination("plain.test")
	if err != nil || rec.PaceRun > 1 {
		t.Errorf("destination record rewritten by later plain deliveries: PaceRun %d (err %v), want at most 1", rec.PaceRun, err)
	}
}

// TestReuse_NoStorageRead: the loop decides whether a job may ride an
// open connection from what the job carries, never by reading the
// message from the queue: with the queue closed after the scan (any
// read fails), an ordinary message still rides a plaintext connection to
// its MX and a REQUIRETLS one still does not; the same for jobs built
// from a fresh message, and after a restart (the flags come from the
// stored message record the scan reads anyway).
func TestReuse_NoStorageRead(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	plain := h.enqueue("p@sender.test", "p@reuse.test")
	rtls := h.enqueueMsg(queue.NewMessage{From: "r@sender.test", RequireTLS: true}, "r@reuse.test")
	want := map[queue.ID]bool{plain: true, rtls: false}
	s := &session{t: target{host: "mx.reuse.test", addr: netip.MustParseAddr("127.0.0.1"), tls: "may", base: "may"}}
	check := func(when string, fresh bool) {
		t.Helper()
		e := h.eng
		e.cur = h.q.DueCursor()
		if err := e.scan(time.Now()); err != nil {
			t.Fatalf("%s: scan: %v", when, err)
		}
		e.cur.Close()
		if fresh {
			for _, m := range []queue.Message{{ID: queue.ID(901)}, {ID: queue.ID(902), RequireTLS: true}} {
				r := queue.Recipient{Key: queue.Key{ID: m.ID}, Addr: "f@reuse.test", Domain: "reuse.test", Status: queue.Queued}
				if !e.takeFresh(queue.Fresh{Message: m, Recipients: []queue.Recipient{r}, Seq: e.scanned + 1}) {
					t.Fatalf("%s: fresh message %v not taken", when, m.ID)
				}
				want[m.ID] = !m.RequireTLS
			}
		}
		h.q.Close() // from here on, a read from the queue fails
		h.q = nil
		d := e.dests["reuse.test"]
		if d == nil || len(d.pending) < 2 {
			t.Fatalf("%s: jobs %+v, want one per message", when, d)
		}
		for _, j := range d.pending {
			if got := e.reuse(s, j).ok; got != want[j.id] {
				t.Errorf("%s: message %v (fresh %v) rides the plaintext connection: %v, want %v", when, j.id, j.fresh != nil, got, want[j.id])
			}
		}
	}
	h.build()
	check("fresh start", true)
	h.openQueue() // a restart
	h.build()
	check("after a restart", false)
}
