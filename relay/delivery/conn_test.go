package delivery

import (
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestSmarthostAuth: with a smarthost, everything goes there over
// STARTTLS with AUTH, and the recipients end up Relayed.
func TestSmarthostAuth(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) {
		c.Delivery.Smarthost = config.Smarthost{Username: "relay", Password: "s3cret", TLS: "encrypt"}
	})
	h.cfg.Delivery.Smarthost.Address = net.JoinHostPort(ip, strconv.Itoa(h.port))
	cert := testCert(t, "smarthost.test")
	f := startMX(t, ip, h.port, relaytest.MXOptions{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}, Users: map[string]string{"relay": "s3cret"}})
	id := h.enqueue("alice@sender.test", "x@anywhere.test", "y@elsewhere.test")
	h.start()
	eventually(t, wait, "relayed", func() bool { return h.gone(id) })
	if n := len(f.Delivered()); n != 2 {
		t.Errorf("smarthost got %d transactions, want 2 (one per domain)", n)
	}
	authed := f.Authed()
	if len(authed) == 0 || authed[0] != "relay" {
		t.Errorf("AUTH users %v, want relay", authed)
	}
	if outs := h.outcomes("x@anywhere.test"); len(outs) != 1 || outs[0]["outcome"] != "relayed" {
		t.Errorf("logged %v, want relayed", outs)
	}
	if n := counter(h.m.TLSOut, "yes"); n < 1 {
		t.Errorf("TLSOut{yes} = %v, want >= 1", n)
	}
}

// TestTLSMayFallback: under "may", a failed STARTTLS handshake is retried
// in plaintext on the same host.
func TestTLSMayFallback(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("badtls.test", 10, "mx.badtls.test").A("mx.badtls.test", ip)
	broken := &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return nil, errors.New("no certificate today")
	}}
	f := startMX(t, ip, h.port, relaytest.MXOptions{TLS: broken})
	id := h.enqueue("alice@sender.test", "x@badtls.test")
	h.start()
	eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	if c := f.Connections(); len(c) != 2 {
		t.Errorf("%d connections, want 2 (TLS, then plaintext)", len(c))
	}
	if n := counter(h.m.TLSOut, "no"); n != 1 {
		t.Errorf("TLSOut{no} = %v, want 1", n)
	}
}

// TestTLSEncryptRefused: under "encrypt", a peer without STARTTLS gets no
// mail; the recipient is deferred for reason tls.
func TestTLSEncryptRefused(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.Delivery.TLS = "encrypt" })
	h.dns.MX("notls.test", 10, "mx.notls.test").A("mx.notls.test", ip)
	f := startMX(t, ip, h.port, relaytest.MXOptions{})
	id := h.enqueue("alice@sender.test", "x@notls.test")
	h.start()
	eventually(t, wait, "deferred", func() bool { return len(h.outcomes("x@notls.test")) > 0 })
	r, ok := h.rcpt(id, 0)
	if !ok || r.Reason != "tls" || r.Status == queue.Failed {
		t.Errorf("recipient %+v, want deferred for tls", r)
	}
	if n := len(f.Transactions()); n != 0 {
		t.Errorf("%d transactions in plaintext, want none", n)
	}
}

// TestNoIPv6Egress: an IPv6-only MX is never dialed without Dialer6 (no
// silent fallback to an unpinned source); the recipient is deferred.
func TestNoIPv6Egress(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.dns.MX("v6.test", 10, "mx.v6.test").AAAA("mx.v6.test", "::1")
	id := h.enqueue("alice@sender.test", "x@v6.test")
	h.start(func(o *Options) { o.Router.IPv6 = true })
	eventually(t, wait, "deferred", func() bool { return len(h.outcomes("x@v6.test")) > 0 })
	r, _ := h.rcpt(id, 0)
	if r.Reason != "connect" || r.Status == queue.Failed || r.MXAddr != "" {
		t.Errorf("recipient %+v, want deferred for connect without dialing", r)
	}
}

// TestScheduler_EnqueueWakesLoop: a message enqueued while the loop
// waits with nothing due is delivered, once (that the idle loop does not
// poll, and wakes at once, is TestScheduler_IdleNoPolling on the fake
// clock).
func TestScheduler_EnqueueWakesLoop(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("idle.test", 10, "mx.idle.test").A("mx.idle.test", ip)
	f := startMX(t, ip, h.port, relaytest.MXOptions{})
	h.start()
	eventually(t, wait, "the loop's first pass", func() bool { return testutil.ToFloat64(h.m.SchedulerWakeup) > 0 })
	id := h.enqueue("alice@sender.test", "x@idle.test")
	eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	if n := len(f.Delivered()); n != 1 {
		t.Errorf("delivered %d, want 1", n)
	}
}

// TestScheduler_FairUnderGlobalCap: with one connection in all, a slow
// domain with a backlog yields the connection after each message, so a
// message for another domain does not wait for the whole backlog.
func TestScheduler_FairUnderGlobalCap(t *testing.T) {
	t.Parallel()
	ip1, ip2 := relaytest.Loopback(t), relaytest.Loopback(t)
	h := newHarness(t, func(c *config.Config) { c.Delivery.MaxConnections = 1 })
	h.dns.MX("slow.test", 10, "mx.slow.test").A("mx.slow.test", ip1).
		MX("fast.test", 10, "mx.fast.test").A("mx.fast.test", ip2)
	slow := startMX(t, ip1, h.port, relaytest.MXOptions{Script: relaytest.Script{Data: func(int) error {
		time.Sleep(200 * time.Millisecond)
		return nil
	}}})
	fast := startMX(t, ip2, h.port, relaytest.MXOptions{})
	var ids []queue.ID
	for range 4 {
		ids = append(ids, h.enqueue("alice@sender.test", "s@slow.test"))
	}
	h.start()
	eventually(t, wait, "slow domain busy", func() bool { return len(slow.Transactions()) > 0 })
	ids = append(ids, h.enqueue("alice@sender.test", "f@fast.test"))
	eventually(t, wait, "all delivered", func() bool {
		for _, id := range ids {
			if !h.gone(id) {
				return false
			}
		}
		return true
	})
	ft := fast.Delivered()[0].At
	late := 0
	for _, tx := range slow.Delivered() {
		if tx.At.Before(ft) {
			late++
		}
	}
	if late > 2 {
		t.Errorf("fast.test delivered after %d slow messages, want at most 2", late)
	}
}
