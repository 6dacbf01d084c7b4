package smtpd

import (
	"bufio"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/pires/go-proxyproto"
	"go.uber.org/zap"
)

// proxyListener reads the PROXY protocol header (HAProxy's v1 text line or
// v2 binary preamble) that a load balancer sends before the client's first
// byte, so that everything above it sees the real client's address.
//
// SMTP is a server-speaks-first protocol: a listener cannot wait to see
// whether a header comes without delaying every banner. So, as Postfix's
// smtpd_upstream_proxy_protocol does, a listener with proxy_protocol set
// expects the header on every connection: one from an address outside
// proxy_protocol.trusted, or one that starts without a valid header within
// proxy_protocol.header_timeout, is closed at once, without a banner.
//
// Headers are read by one goroutine per connection (the balancer sends its
// header at once; a slow one must not hold up the accept loop) and the
// connections that pass are handed to Accept through a channel.
type proxyListener struct {
	net.Listener
	srv     *Server
	trusted []netip.Prefix
	timeout time.Duration

	ready     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	errMu     sync.Mutex
	err       error // the inner listener's Accept error, once it failed
}

func newProxyListener(inner net.Listener, srv *Server, trusted []netip.Prefix, timeout time.Duration) *proxyListener {
	pl := &proxyListener{Listener: inner, srv: srv, trusted: trusted, timeout: timeout,
		ready: make(chan net.Conn), done: make(chan struct{})}
	go pl.acceptLoop()
	return pl
}

// Accept returns the next connection whose header has been read.
func (pl *proxyListener) Accept() (net.Conn, error) {
	select {
	case c := <-pl.ready:
		return c, nil
	case <-pl.done:
		pl.errMu.Lock()
		defer pl.errMu.Unlock()
		if pl.err != nil {
			return nil, pl.err
		}
		return nil, net.ErrClosed
	}
}

// Close stops accepting; connections still reading their header are
// closed by their own goroutines when done is closed.
func (pl *proxyListener) Close() error {
	err := pl.Listener.Close()
	pl.closeOnce.Do(func() { close(pl.done) })
	return err
}

func (pl *proxyListener) acceptLoop() {
	for {
		raw, err := pl.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			pl.errMu.Lock()
			pl.err = err
			pl.errMu.Unlock()
			pl.closeOnce.Do(func() { close(pl.done) })
			return
		}
		if !pl.isTrusted(remoteIP(raw)) {
			pl.srv.connRefused(raw.RemoteAddr(), "closed: not a trusted load balancer", "proxy")
			raw.Close()
			continue
		}
		go pl.handshake(raw)
	}
}

func (pl *proxyListener) isTrusted(ip netip.Addr) bool {
	for _, p := range pl.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// handshake reads raw's header and hands the connection to Accept.
func (pl *proxyListener) handshake(raw net.Conn) {
	raw.SetReadDeadline(time.Now().Add(pl.timeout))
	br := bufio.NewReader(raw)
	if _, err := br.Peek(1); err != nil {
		// Closed before its first byte: a balancer's TCP health check, no
		// news. A header that never comes is.
		raw.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			pl.refused(raw, err)
		}
		return
	}
	h, err := proxyproto.Read(br)
	if err != nil {
		raw.Close()
		pl.refused(raw, err)
		return
	}
	raw.SetReadDeadline(time.Time{})
	pc := &proxiedConn{Conn: raw, r: br, remote: raw.RemoteAddr()}
	// A LOCAL header (HAProxy's health checks) or an address family the
	// header cannot carry for TCP stands for the balancer's own connection.
	if h.Command.IsProxy() && h.TransportProtocol.IsStream() && h.SourceAddr != nil {
		pc.remote = h.SourceAddr
	}
	select {
	case pl.ready <- pc:
	case <-pl.done:
		raw.Close()
	}
}

// refused counts and logs a connection from a trusted address that sent
// no valid header.
func (pl *proxyListener) refused(raw net.Conn, err error) {
	pl.srv.metrics.Rejected.WithLabelValues("4xx", "proxy").Inc()
	pl.srv.log.Info("connection closed: no valid PROXY header",
		zap.String("client", raw.RemoteAddr().String()), zap.Error(err))
}

// proxiedConn is a connection whose header has been read: reads continue
// from the buffered reader (which may hold the client's first bytes) and
// RemoteAddr is the client the header named.
type proxiedConn struct {
	net.Conn
	r      *bufio.Reader
	remote net.Addr
}

// Read reads the client's bytes after the header.
func (c *proxiedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// RemoteAddr is the real client's address (or the balancer's, after LOCAL).
func (c *proxiedConn) RemoteAddr() net.Addr { return c.remote }
