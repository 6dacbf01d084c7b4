package smtpd

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/emersion/go-smtp"
	"go.uber.org/zap"
)

// errJunkLimit ends a connection that used up max_junk_commands. It wraps
// net.ErrClosed so go-smtp ends the session quietly: we already replied.
var errJunkLimit = fmt.Errorf("smtpd: too many junk commands: %w", net.ErrClosed)

// limiter admits connections under the global and per-IP caps (go-smtp has
// none) and keeps the set of live connections for Shutdown.
//
// Strangers must not be able to starve the clients the relay is for
// (Postfix's anvil and its stress mode are the model):
//
//   - Reserved slots. Clients neither in trusted_networks nor
//     authenticated ("strangers") may hold at most max_connections minus
//     reserved_connections_percent of it; the rest is kept for trusted
//     clients and for sessions that authenticated (an AUTH moves its
//     connection out of the strangers' share, making room there). A
//     client's trust is known at connect time from its address (behind
//     PROXY, the header's); whether it will authenticate is not, so a
//     submitting client from an untrusted address enters through the
//     strangers' share.
//   - Stress. While the open connections are at least stress_percent of
//     max_connections, a stranger waiting for its next command is given
//     stress_command_timeout instead of command_timeout (Postfix's
//     smtpd_timeout of 10 s under stress instead of 300 s), and those
//     already idle when stress begins get the same from the start of
//     their wait. Outside stress everyone keeps command_timeout: RFC 5321
//     §4.5.3.2.7 asks a server for at least five minutes.
type limiter struct {
	srv       *Server
	strangers int // connections' share cap for strangers
	stressAt  int // connections from which the server is under stress
	mu        sync.Mutex
	perIP     map[netip.Addr]int // by clientKey
	conns     map[*conn]struct{}
	unknown   int  // connections of strangers (see conn.privileged)
	drain     bool // set by Shutdown: admit nothing more
	// released is signalled after a connection left conns (capacity 1):
	// Shutdown waits on it for the sessions to end.
	released chan struct{}
}

func newLimiter(srv *Server) *limiter {
	lim := srv.cfg.Limits
	return &limiter{srv: srv, perIP: make(map[netip.Addr]int), conns: make(map[*conn]struct{}),
		strangers: lim.MaxConnections - lim.MaxConnections*lim.ReservedConnectionsPercent/100,
		stressAt:  max(1, (lim.MaxConnections*lim.StressPercent+99)/100),
		released:  make(chan struct{}, 1)}
}

// admit wraps raw, or returns a reply reason if a cap is reached.
func (l *limiter) admit(raw net.Conn, implicitTLS bool) (*conn, string) {
	rip := remoteIP(raw)
	ip := clientKey(rip, l.srv.cfg.Limits.IPv6PrefixLength)
	trusted := l.srv.isTrusted(rip)
	lim := l.srv.cfg.Limits
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.drain:
		return nil, "421 4.3.2 Service shutting down"
	case len(l.conns) >= lim.MaxConnections, !trusted && l.unknown >= l.strangers:
		return nil, "421 4.7.0 Too many connections, try again later"
	case l.perIP[ip] >= lim.MaxConnectionsPerIP:
		return nil, "421 4.7.0 Too many connections from your address, try again later"
	}
	now := time.Now()
	c := &conn{Conn: raw, lim: l, ip: ip, implicitTLS: implicitTLS, privileged: trusted,
		end: now.Add(lim.SessionLifetime), in: bufio.NewReaderSize(raw, readBuffer), gone: make(chan struct{})}
	c.out.nc = raw
	c.out.deadline, c.out.applied = c.end, c.end
	c.lines.tls = implicitTLS
	l.perIP[ip]++
	l.conns[c] = struct{}{}
	if !trusted {
		l.unknown++
	}
	l.srv.metrics.ConnectionsIn.Inc()
	// Until go-smtp sets its own deadlines, the session lifetime bounds the
	// connection (a TLS handshake that never starts, for instance).
	raw.SetDeadline(c.end)
	if len(l.conns) == l.stressAt {
		l.srv.log.Info("under stress: idle strangers get limits.stress_command_timeout",
			zap.Int("connections", len(l.conns)))
		for o := range l.conns {
			o.stressed(now)
		}
	}
	return c, ""
}

// stressedStranger reports whether c gets the short idle timeout now: a
// stranger while the server is under stress.
func (l *limiter) stressedStranger(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !c.privileged && len(l.conns) >= l.stressAt
}

// promote moves an authenticated connection out of the strangers' share.
func (l *limiter) promote(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.conns[c]; ok && !c.privileged {
		c.privileged = true
		l.unknown--
	}
}

func (l *limiter) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.conns[c]; !ok {
		return
	}
	delete(l.conns, c)
	if !c.privileged {
		l.unknown--
	}
	if l.perIP[c.ip]--; l.perIP[c.ip] <= 0 {
		delete(l.perIP, c.ip)
	}
	l.srv.metrics.ConnectionsIn.Dec()
	select {
	case l.released <- struct{}{}:
	default:
	}
}

// snapshot returns the live connections and, with stop, admits no more.
func (l *limiter) snapshot(stop bool) []*conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drain = l.drain || stop
	out := make([]*conn, 0, len(l.conns))
	for c := range l.conns {
		out = append(out, c)
	}
	return out
}

// clientKey is what per-client limits count by: an IPv4 address, or the
// IPv6 prefix of ipv6Bits (limits.ipv6_prefix_length) that holds the
// address. One IPv6 host usually has a whole /64 to pick addresses from,
// so counting single addresses would let it open max_connections_per_ip
// connections per address (Postfix smtpd_client_ipv6_prefix_length).
func clientKey(ip netip.Addr, ipv6Bits int) netip.Addr {
	if ip.Is6() {
		if p, err := ip.Prefix(ipv6Bits); err == nil {
			return p.Addr()
		}
	}
	return ip
}

func remoteIP(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// listener applies the limiter to one bound socket. For implicit TLS
// (submissions) it also wraps each connection in TLS, so that go-smtp sees
// the *tls.Conn it needs to recognise TLS.
type listener struct {
	net.Listener
	lim *limiter
	tls *tls.Config // implicit TLS, or nil
}

// Accept returns the next admitted connection. Refused ones get their 421
// (plain listeners only: on an implicit-TLS port a cleartext reply would be
// garbage to the client, and a handshake is the work the cap protects us
// from) and are closed without reaching go-smtp.
func (l *listener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c, refusal := l.lim.admit(raw, l.tls != nil)
		if c == nil {
			l.lim.srv.connRefused(raw.RemoteAddr(), refusal, reasonConnections)
			go refuseConn(raw, refusal, l.tls == nil)
			continue
		}
		if l.tls != nil {
			tc := tls.Server(c, l.tls)
			c.setReplyConn(tc)
			return tc, nil
		}
		c.setReplyConn(c)
		return c, nil
	}
}

func refuseConn(raw net.Conn, reply string, say bool) {
	if say {
		raw.SetWriteDeadline(time.Now().Add(time.Second))
		raw.Write([]byte(reply + "\r\n"))
	}
	raw.Close()
}

// readBuffer is the size of the buffer below go-smtp's own. go-smtp reads
// through a 4 KiB bufio.Reader, so a message body took one read(2) per
// 4 KiB; with this buffer one read takes what the client has sent (a
// 4 KiB message and its final dot, or a pipelined envelope, at once) and
// go-smtp's reads are copies. Each system call is a kernel entry and often
// a wakeup, the relay's largest CPU cost per message. It holds only octets
// the kernel would otherwise hold for us: after STARTTLS they are read by
// the TLS layer, through this buffer, as before (a command pipelined behind
// STARTTLS is still never run as a command).
const readBuffer = 16 << 10

// conn is every accepted connection as go-smtp sees it (under TLS, as the
// *tls.Conn's transport). It carries the per-connection state go-smtp does
// not keep, and enforces what go-smtp cannot:
//
//   - the session lifetime: every read deadline is clamped to it;
//   - the DATA deadline (go-smtp sets its read deadline once per command
//     line, so a whole body would have to arrive within one timeout):
//     while a DATA body is read, each Read extends
//     the deadline by bytes/min_data_rate, never past now+command_timeout
//     (Postfix smtpd_min_data_rate);
//   - after any read error the connection is finished: later reads fail
//     with the same error and the next reply written closes it, so a body
//     line is never read as a command;
//   - junk commands (go-smtp counts only syntax errors, so NOOPs could
//     hold a session forever): go-smtp calls SetReadDeadline once before every
//     command line, so reads minus commands that did something is the
//     number of NOOP/RSET/VRFY/HELP-like commands;
//   - reply batching (batch.go): writes are buffered and go out before the
//     next read, at Close, or when the buffer is full.
type conn struct {
	net.Conn
	in          *bufio.Reader // every read goes through it (see readBuffer)
	out         batchWriter   // every write goes through it
	lim         *limiter
	ip          netip.Addr
	implicitTLS bool
	end         time.Time // session lifetime
	// privileged: trusted or authenticated, not a stranger (limiter);
	// guarded by lim.mu.
	privileged bool

	// waitStart is when go-smtp began to wait for the current command;
	// guarded by mu.
	waitStart time.Time

	mu           sync.Mutex
	replyConn    net.Conn // where our own replies go: this conn or the *tls.Conn; nil if unknown
	reads        int      // command lines go-smtp started to read
	useful       int      // of which did something (or a TLS handshake)
	authFailures int
	inData       bool      // Data is running
	replyPending bool      // Data returned; its reply is not yet written
	dataDeadline time.Time // current DATA deadline
	broken       error     // sticky read error
	closeAfter   bool      // close after the next Write
	draining     bool      // Shutdown started
	lines        lineFramer
	linger       bool // the read error is our over-long line: Close lingers
	closed       bool // Close has run
	closeOnce    sync.Once
	gone         chan struct{} // closed by kill

	// A DATA body read straight from in (body.go). Only the connection's
	// goroutine (go-smtp's, which also runs Data) uses these.
	body   bodyReader
	bodyOn bool   // body is in use: go-smtp has not read past it yet
	synth  []byte // what go-smtp is given before the next octets from in
}

func (c *conn) setReplyConn(rc net.Conn) {
	c.mu.Lock()
	c.replyConn = rc
	c.mu.Unlock()
}

// tlsStarted is called from the TLS handshake. After STARTTLS our replies
// must go through a *tls.Conn we only learn of at the next EHLO.
func (c *conn) tlsStarted() {
	c.mu.Lock()
	c.useful++
	if !c.implicitTLS {
		c.replyConn = nil
	}
	c.lines.tls = true
	c.lines.commandStarted() // the handshake was no command
	c.mu.Unlock()
}

// productive records that the command just read did something.
func (c *conn) productive() {
	c.mu.Lock()
	c.useful++
	c.mu.Unlock()
}

// forgiveJunk restarts the junk count; called when a message is accepted,
// so a client that reuses its connection (Postfix sends RSET between
// messages) is not cut off for working.
func (c *conn) forgiveJunk() {
	c.mu.Lock()
	c.useful = c.reads
	c.mu.Unlock()
}

func (c *conn) isDraining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining
}

// cutShort reports whether the command go-smtp is about to run is the
// start of an over-long line. go-smtp reads commands through bufio, and
// when a read fails bufio.Reader.ReadLine hands over the octets it holds as
// if they were a whole line (it returns a line or an error, never both):
// here the part of an over-long command read before it passed the limit,
// which must not run. Its reply is the 500 the limit promises (lines.go);
// the read error becomes io.EOF so that go-smtp then ends without
// answering a second time, and Close still lingers (c.linger).
func (c *conn) cutShort() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.linger || !errors.Is(c.broken, smtp.ErrTooLongLine) {
		return false
	}
	c.broken = io.EOF
	return true
}

// closeAfterReply makes the next reply go-smtp writes the last one.
func (c *conn) closeAfterReply() {
	c.mu.Lock()
	c.closeAfter = true
	c.mu.Unlock()
}

// pause waits for d, or until the connection is closed (Shutdown does not
// wait for it).
func (c *conn) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.gone:
	}
}

func (c *conn) authFailed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.authFailures++
	return c.authFailures
}

// beginData is called when Data starts; dot-terminated DATA (not BDAT) also
// gets the min-data-rate deadline.
func (c *conn) beginData(rated bool) {
	c.mu.Lock()
	c.inData = true
	if rated {
		c.dataDeadline = time.Now().Add(c.lim.srv.cfg.Limits.CommandTimeout)
		c.lines.beginBody()
	}
	c.mu.Unlock()
}

// dataTaken records octets Data took from the client (lines.go).
func (c *conn) dataTaken(n int) {
	c.mu.Lock()
	c.lines.dataTaken(n)
	c.mu.Unlock()
}

// endData is called when Data returns; its reply is written next. The
// data-rate deadline stays until then: after an early refusal (552) go-smtp
// reads the rest of the body itself.
func (c *conn) endData() {
	c.mu.Lock()
	c.inData, c.replyPending = false, true
	if c.draining {
		c.closeAfter = true
	}
	c.mu.Unlock()
}

// Read reads from the client, keeping the DATA deadline and the sticky
// error described on conn. Buffered replies go out first: the client may
// be waiting for them before it sends anything more. If they cannot, the
// connection is finished as after a read error.
//
// After a DATA body read by a bodyReader (body.go), go-smtp reads the body
// again through its own reader to make sure it was all consumed: the rest
// of the body is consumed here first, and go-smtp is then given the end of
// data alone (endOfData).
func (c *conn) Read(b []byte) (int, error) {
	if c.bodyOn {
		c.bodyOn = false
		if err := c.body.drain(); err != nil {
			return 0, err
		}
		c.synth = endOfData
	}
	if len(c.synth) > 0 {
		n := copy(b, c.synth)
		c.synth = c.synth[n:]
		return n, nil
	}
	if err := c.beforeRead(); err != nil {
		return 0, err
	}
	n, err := c.in.Read(b)
	return c.afterRead(b[:n], err)
}

// beforeRead sends the buffered replies and applies the sticky error and
// the DATA deadline before a read that may wait for the client.
func (c *conn) beforeRead() error {
	werr := c.out.flush()
	c.mu.Lock()
	defer c.mu.Unlock()
	if werr != nil && c.broken == nil {
		c.broken, c.closeAfter = werr, true
	}
	if c.broken != nil {
		return c.broken
	}
	if !c.dataDeadline.IsZero() {
		c.Conn.SetReadDeadline(minTime(c.dataDeadline, c.end))
	}
	return nil
}

// afterRead follows the octets p just read (or taken from c.in by a
// bodyReader) and the read's error: the DATA deadline's credit, the line
// limit, and the sticky error. It returns what the read returns.
func (c *conn) afterRead(p []byte, err error) (int, error) {
	n := len(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dataDeadline.IsZero() && n > 0 {
		limits := c.lim.srv.cfg.Limits
		credit := time.Duration(n) * time.Second / time.Duration(limits.MinDataRate)
		c.dataDeadline = minTime(c.dataDeadline.Add(credit), time.Now().Add(limits.CommandTimeout))
	}
	if n > 0 && c.broken == nil && !c.lines.scan(p) {
		// A command line over the limit: go-smtp answers this error with
		// 500 and closes; the close lingers so the 500 arrives.
		n, err = 0, smtp.ErrTooLongLine
		c.linger = true
	}
	if err != nil {
		if errors.Is(err, io.EOF) && c.inData {
			// The client went away inside a message. For DATA, go-smtp's
			// reader already says so (no final dot), but a BDAT chunk is
			// copied through an io.LimitReader, for which io.EOF is a
			// normal end: go-smtp would take the short chunk for the whole
			// message and we would queue it truncated (RFC 3030 §2: the
			// chunk is exactly its declared size).
			err = io.ErrUnexpectedEOF
		}
		if c.broken == nil {
			c.broken = err
			var ne net.Error
			if c.inData && c.dataDeadline.IsZero() && errors.As(err, &ne) && ne.Timeout() {
				// A BDAT chunk: go-smtp would answer its read error with
				// 554 5.0.0 and the error text, a permanent code that leaks
				// internals, and keep the connection. An *smtp.SMTPError
				// is passed through as the reply.
				c.broken = replyDataTimeout()
			}
		}
		err = c.broken
		c.closeAfter = true
	}
	return n, err
}

// Write buffers a reply (see batch.go); it ends a pending DATA reply and
// closes the connection when asked to, which sends the reply. In
// plaintext it also makes any CR that does not end a line a space
// (strayCRToSpace).
func (c *conn) Write(b []byte) (int, error) {
	c.mu.Lock()
	plain := !c.lines.tls
	c.mu.Unlock()
	if plain {
		b = strayCRToSpace(b)
	}
	n, err := c.out.write(b)
	c.mu.Lock()
	if !c.inData { // the reply to DATA: the body has been read
		c.replyPending = false
		c.dataDeadline = time.Time{}
		c.lines.body = false
	}
	closing := c.closeAfter
	c.mu.Unlock()
	if closing {
		c.Close()
	}
	return n, err
}

// Close sends what is buffered (within the write deadline), closes the
// socket once and releases its place in the limiter.
//
// The first close lingers (lingerClose) while the client may still be
// sending: go-smtp closes right after some replies (500 5.4.0 for a line
// over its own MaxLineLength, which it detects itself, 221 after QUIT),
// and a close with unread input makes the kernel send a reset, which can
// destroy that last reply on its way. It does not linger when the
// client's side has already ended (EOF, a read error, a timeout), unless
// the error is our own over-long line, nor under Shutdown, whose goodbye
// has its own bound.
func (c *conn) Close() error {
	c.out.close(net.ErrClosed)
	c.mu.Lock()
	linger := !c.closed && !c.draining && (c.broken == nil || c.linger)
	c.closed = true
	c.mu.Unlock()
	if linger {
		c.lingerClose()
	}
	return c.kill()
}

// kill closes the socket at once, dropping whatever is buffered, as a
// close used to cut a write in progress; Shutdown's last resort.
func (c *conn) kill() error {
	var err error
	c.closeOnce.Do(func() {
		err = c.Conn.Close()
		close(c.gone)
		c.lim.release(c)
	})
	return err
}

// SetReadDeadline is called by go-smtp before each command line. It counts
// the command, enforces the junk limit and the shutdown, and clamps the
// deadline to the session lifetime. max_junk_commands junk commands are
// answered; after one more the connection is closed with 421 4.7.0 before
// the next command is read.
func (c *conn) SetReadDeadline(t time.Time) error {
	limits := c.lim.srv.cfg.Limits
	max := limits.MaxJunkCommands
	now := time.Now()
	if c.lim.stressedStranger(c) {
		t = minTime(t, now.Add(limits.StressCommandTimeout))
	}
	c.mu.Lock()
	junk := c.reads - c.useful
	c.reads++
	draining := c.draining
	c.waitStart = now
	c.lines.commandStarted()
	c.mu.Unlock()
	switch {
	case draining:
		c.goodbye("421 4.3.2 Service shutting down")
		return net.ErrClosed
	case junk > max:
		const reply = "421 4.7.0 Too many commands without mail, closing connection"
		c.lim.srv.connRefused(c.RemoteAddr(), reply, reasonJunk)
		c.goodbye(reply)
		return errJunkLimit
	}
	return c.Conn.SetReadDeadline(minTime(t, c.end))
}

// stressed is called, with lim.mu held, when stress begins: a stranger
// waiting for a command gets stress_command_timeout from the start of its
// wait (at once if that has passed: go-smtp then says 421 4.4.2 and
// closes). A connection inside a message is left alone: its deadline
// follows the data rate (Read).
func (c *conn) stressed(now time.Time) {
	if c.privileged {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inData || !c.dataDeadline.IsZero() || c.waitStart.IsZero() {
		return
	}
	c.Conn.SetReadDeadline(minTime(c.waitStart.Add(c.lim.srv.cfg.Limits.StressCommandTimeout), c.end))
}

// SetDeadline clamps the read deadline to the session lifetime. Write
// deadlines are left alone (go-smtp's WriteTimeout bounds them) so that the
// 421 go-smtp sends when the lifetime ends can still be written.
func (c *conn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetReadDeadline(minTime(t, c.end)); err != nil {
		return err
	}
	return c.out.setDeadline(t)
}

// SetWriteDeadline sets the deadline for buffered replies too (batch.go).
func (c *conn) SetWriteDeadline(t time.Time) error { return c.out.setDeadline(t) }

// goodbye writes a reply of our own (when we know where replies go) and
// closes the connection. A write that cannot finish within a second is
// abandoned, and so is whatever was buffered before it.
func (c *conn) goodbye(reply string) {
	c.mu.Lock()
	rc := c.replyConn
	c.mu.Unlock()
	// The read deadline too: a write on a *tls.Conn first waits for a
	// handshake in progress, which is reading.
	t := time.Now().Add(time.Second)
	c.Conn.SetReadDeadline(t)
	c.out.cutDeadline(t)
	if rc != nil {
		rc.Write([]byte(reply + "\r\n"))
	}
	c.Close()
}

// drain is Shutdown's first step for one connection: an idle session gets
// 421 4.3.2 at once; a session in DATA (or whose DATA reply is on its way)
// is closed right after that reply.
func (c *conn) drain() {
	c.mu.Lock()
	c.draining = true
	busy := c.inData || c.replyPending
	if busy {
		c.closeAfter = true
	}
	c.mu.Unlock()
	if !busy {
		go c.goodbye("421 4.3.2 Service shutting down")
	}
}

// stop is Shutdown's last resort when its context ends: reads fail at once
// with 421 4.3.2 (an *smtp.SMTPError, which go-smtp passes on as the reply
// to a BDAT chunk), so a session in DATA answers 421 4.3.2 (unless it is
// already committing, in which case it answers 250) and closes.
func (c *conn) stop() {
	c.mu.Lock()
	if c.broken == nil {
		c.broken = replyShutdown()
	}
	c.closeAfter = true
	c.mu.Unlock()
	c.Conn.SetReadDeadline(time.Unix(1, 0))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
