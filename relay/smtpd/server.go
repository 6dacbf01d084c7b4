// Package smtpd is greyrelay's front door: the SMTP server that takes mail
// from clients and commits it to the queue before answering 250.
//
// It is built on go-smtp v0.26.0, which parses commands and leaves policy to
// the backend. Everything go-smtp does not do, or does in a way a relay
// cannot accept, is done here:
//
//   - Policy. A client may relay only when authenticated, or on an smtp
//     listener from trusted_networks; everyone else gets 554 5.7.1 at RCPT.
//     greyrelay has no local domains, so every recipient is remote.
//     Submission listeners require AUTH before MAIL (530 5.7.0).
//   - Addresses. go-smtp unquotes local parts, drops source routes and
//     passes control bytes (<"u@target"@relay> arrives as u@target@relay),
//     so every MAIL/RCPT argument is parsed again by relay/address, which
//     splits on the last "@" and refuses routing tricks.
//   - Limits. Every go-smtp limit is set from the configuration (zero means
//     unlimited there). Connection caps (go-smtp has none), the session
//     lifetime, the DATA data-rate deadline (go-smtp's read timeout is not
//     refreshed during DATA) and the junk-command limit (NOOP/RSET are not
//     counted) live in the connection wrapper (listener.go), with the
//     slots kept for trusted and authenticated clients and the short idle
//     timeout of strangers under stress; AUTH failure limits (go-smtp
//     counts none: locked per address and user, slowed per address) in
//     auth.go.
//   - Line lengths (lines.go). Body lines are taken up to the message
//     size; command lines are held to 2000 octets by the connection, and
//     an over-long one gets a 500 the client can read before the close.
//   - Data (data.go). End of data is go-smtp's CRLF.CRLF. A bare LF is a line
//     end and stored as CRLF; a stray CR becomes a space or refuses the
//     message (bare_cr), so nothing stored has a CR or LF out of place
//     (go-smtp passes bare CR and LF through to the backend). One Received header is prepended (received.go).
//   - Replies (reply.go). One function turns every outcome into an
//     unwrapped *smtp.SMTPError (go-smtp type-asserts the error, so a
//     wrapped one loses its code). Storage trouble is always 4xx, so a
//     client retries instead of bouncing.
//   - Batching (batch.go). Replies are buffered and written when the
//     server next reads or closes, so a pipelined group (RFC 2920) costs
//     one write(2); message buffers are reused between messages (data.go).
//   - Load balancers (proxy.go). A listener with proxy_protocol takes the
//     client's address from the PROXY v1/v2 header HAProxy sends, only
//     from proxy_protocol.trusted, so policy, limits and Received see the
//     real client; it refuses everyone else before the banner.
//   - Durability. 250 is sent only after queue.Enqueue returned, and
//     Shutdown never turns a session in DATA into a 250 it did not commit.
//
// AUTH (PLAIN, LOGIN) is offered only under TLS, to a loopback client on
// a loopback listener, or with allow_plaintext_auth. Behind the PROXY
// protocol the client is the one the header names, for this decision as
// for every other (trusted networks, per-address limits, AUTH lockouts):
// a balancer on loopback does not make its clients local. Passwords and
// AUTH payloads are never logged.
package smtpd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/dkim"
	"github.com/greyrelay/greyrelay/relay/metrics"
)

// Queue is what the server needs from the queue: a durable Enqueue.
// *queue.Queue implements it; tests use fakes.
//
// Enqueue must not keep m.Body, or anything sharing its memory, after it
// returns: the server reuses the buffer for its next message (data.go).
// *queue.Queue copies the body into its intake journal record (or, without
// a journal, into the database commit) before it returns.
type Queue interface {
	Enqueue(queue.NewMessage) (queue.ID, error)
}

// Options configure New. Config and Queue are required.
type Options struct {
	Config   *config.Config
	Queue    Queue
	Users    *Users                            // nil: AUTH is not offered
	Logger   *zap.Logger                       // nil: no logging
	Metrics  *metrics.Metrics                  // nil: metrics are kept but not registered
	Now      func() time.Time                  // nil: time.Now
	DiskFree func(path string) (uint64, error) // free bytes where the queue lives, less its reserve; nil: statfs
	DKIM     *dkim.Signer                      // signs at intake (sign.go); nil: nothing is signed
	Suppress Suppressions                      // refused recipients (suppress.go); nil: none
	Usage    UsageStore                        // keeps user_limits counts (userlimits.go); nil: in memory
	// OnRefused, if set, is told of each recipient refused for being
	// suppressed (suppress.go), before the reply goes out.
	OnRefused func(Refusal)
}

// Server is the SMTP server for every configured listener.
type Server struct {
	cfg       *config.Config
	queue     Queue
	users     *Users
	log       *zap.Logger
	metrics   *metrics.Metrics
	now       func() time.Time
	diskFree  func(string) (uint64, error)
	dkim      *dkim.Signer
	suppress  Suppressions
	quota     *userQuota // user_limits; nil without any (userlimits.go)
	onRefused func(Refusal)
	room      room // the last diskFree measurement (room.go)
	trusted   []netip.Prefix
	// Load balancers whose PROXY headers are believed (proxy.go).
	proxyTrusted []netip.Prefix
	tls          []*tls.Config // per listener; nil without a certificate
	authLim      *authLimiter
	lim          *limiter
	hostSafe     string // cfg.Hostname, sanitised for the Received header
	// Where RCPT TO:<Postmaster> goes; zero if neither postmaster nor
	// postmaster@hostname is an address.
	postmaster address.Address
	dataBufs   sync.Pool              // of *dataBuf (data.go)
	qdir       atomic.Pointer[string] // queueDir, once it exists

	mu      sync.Mutex
	started bool
	servers []*smtp.Server
	addrs   []net.Addr
	inData  atomic.Int64 // Data calls in progress
	// dataEnded is signalled after a Data call ended (capacity 1):
	// Shutdown waits on it for inData to reach 0.
	dataEnded chan struct{}
}

// replyFlush bounds how long Shutdown lets sessions end by themselves
// after their reads were stopped, so that a 250 just decided still
// reaches its client; a session that takes longer (a client that does
// not read what it is sent) is cut.
const replyFlush = time.Second

// endData notes that a Data call ended (see dataEnded).
func (s *Server) endData() {
	s.inData.Add(-1)
	select {
	case s.dataEnded <- struct{}{}:
	default:
	}
}

// New checks the options and loads the TLS certificates. It binds nothing.
func New(opt Options) (*Server, error) {
	if opt.Config == nil || opt.Queue == nil {
		return nil, errors.New("smtpd: Config and Queue are required")
	}
	s := &Server{cfg: opt.Config, queue: opt.Queue, users: opt.Users, log: opt.Logger,
		metrics: opt.Metrics, now: opt.Now, diskFree: opt.DiskFree, dkim: opt.DKIM, suppress: opt.Suppress, onRefused: opt.OnRefused,
		dataEnded: make(chan struct{}, 1)}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.metrics == nil {
		s.metrics = metrics.New(prometheus.NewRegistry())
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.diskFree == nil {
		pct := s.cfg.Queue.ReservePercent
		s.diskFree = func(path string) (uint64, error) { return statfsFree(path, pct) }
	}
	if err := s.checkLimits(); err != nil {
		return nil, err
	}
	for _, n := range s.cfg.TrustedNetworks {
		p, err := netip.ParsePrefix(n)
		if err != nil {
			return nil, fmt.Errorf("smtpd: trusted_networks: %w", err)
		}
		s.trusted = append(s.trusted, p.Masked())
	}
	for _, n := range s.cfg.ProxyProtocol.Trusted {
		p, err := netip.ParsePrefix(n)
		if err != nil {
			return nil, fmt.Errorf("smtpd: proxy_protocol.trusted: %w", err)
		}
		s.proxyTrusted = append(s.proxyTrusted, p.Masked())
	}
	for i, l := range s.cfg.Listeners {
		if l.ProxyProtocol && (len(s.proxyTrusted) == 0 || s.cfg.ProxyProtocol.HeaderTimeout <= 0) {
			return nil, fmt.Errorf("smtpd: listeners[%d] %s: proxy_protocol needs proxy_protocol.trusted and header_timeout", i, l.Address)
		}
		if l.Mode != config.ModeSMTP && s.users == nil {
			// AUTH is required there and could never succeed.
			return nil, fmt.Errorf("smtpd: listeners[%d] %s: mode %s needs users (users_file)", i, l.Address, l.Mode)
		}
		tc, err := s.loadTLS(l)
		if err != nil {
			return nil, fmt.Errorf("smtpd: listeners[%d] %s: %w", i, l.Address, err)
		}
		s.tls = append(s.tls, tc)
	}
	s.hostSafe = sanitizeHelo(s.cfg.Hostname)
	if err := s.setPostmaster(); err != nil {
		return nil, err
	}
	lim := s.cfg.Limits
	s.authLim = newAuthLimiter(lim.MaxAuthFailuresPerUser, lim.MaxAuthFailuresPerIP, time.Hour, lim.IPv6PrefixLength)
	s.lim = newLimiter(s)
	s.quota = newUserQuota(s.cfg.UserLimits, opt.Usage)
	if s.quota != nil {
		s.quota.report = func(id string, lastHour int) {
			if !strings.HasPrefix(id, trustedPrefix) { // trusted clients would share one series
				s.metrics.UserUsage.WithLabelValues(id).Set(float64(lastHour))
			}
		}
	}
	return s, nil
}

// checkLimits refuses zero limits (go-smtp and we would read them as
// "unlimited" or "never"), in case the configuration was not validated.
func (s *Server) checkLimits() error {
	if ps := s.cfg.Limits.Problems(); len(ps) > 0 {
		return fmt.Errorf("smtpd: %s", ps[0])
	}
	if !s.cfg.BareCR.Valid() {
		return fmt.Errorf("smtpd: bare_cr %q is not normalize or reject", s.cfg.BareCR)
	}
	return nil
}

// setPostmaster resolves the postmaster key: its address, or by default
// postmaster@hostname (Postfix appends $myorigin the same way). A system
// hostname that is no domain leaves it unset: the domainless postmaster is
// then refused rather than the server not starting.
func (s *Server) setPostmaster() error {
	if s.cfg.Postmaster == "" {
		s.postmaster, _ = address.Parse("postmaster@"+s.cfg.Hostname, address.Options{})
		return nil
	}
	a, err := address.Parse(s.cfg.Postmaster, address.Options{SMTPUTF8: true})
	if err != nil {
		return fmt.Errorf("smtpd: postmaster %q: %w", s.cfg.Postmaster, err)
	}
	s.postmaster = a
	return nil
}

func (s *Server) loadTLS(l config.Listener) (*tls.Config, error) {
	if l.TLSCert == "" {
		if l.Mode != config.ModeSMTP {
			return nil, fmt.Errorf("mode %s needs tls_cert and tls_key", l.Mode)
		}
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(l.TLSCert, l.TLSKey)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// Every handshake counts as a useful command for the junk limit and
		// tells the connection that its replies now go through TLS.
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			if c, ok := h.Conn.(*conn); ok {
				c.tlsStarted()
			}
			return nil, nil
		},
	}, nil
}

// Start binds every listener (an error names the address and unbinds the
// others) and serves them in the background.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("smtpd: already started")
	}
	var bound []net.Listener
	for _, l := range s.cfg.Listeners {
		nl, err := net.Listen("tcp", l.Address)
		if err != nil {
			for _, b := range bound {
				b.Close()
			}
			return fmt.Errorf("smtpd: %w", err) // "listen tcp ADDRESS: …" names the address
		}
		bound = append(bound, nl)
	}
	for i, l := range s.cfg.Listeners {
		srv := s.newSMTPServer(i, l, bound[i].Addr())
		var inner net.Listener = bound[i]
		if l.ProxyProtocol {
			inner = newProxyListener(inner, s, s.proxyTrusted, s.cfg.ProxyProtocol.HeaderTimeout)
		}
		wrapped := &listener{Listener: inner, lim: s.lim}
		if l.Mode == config.ModeSubmissions {
			wrapped.tls = s.tls[i]
		}
		s.servers = append(s.servers, srv)
		s.addrs = append(s.addrs, bound[i].Addr())
		go func() {
			if err := srv.Serve(wrapped); err != nil {
				s.log.Error("listener stopped", zap.String("address", wrapped.Addr().String()), zap.Error(err))
			}
		}()
		s.log.Info("listening", zap.String("address", bound[i].Addr().String()), zap.String("mode", string(l.Mode)))
	}
	s.started = true
	return nil
}

// newSMTPServer configures go-smtp for listener i, bound at addr. Every
// limit is set explicitly: go-smtp reads a zero limit or timeout as none.
func (s *Server) newSMTPServer(i int, l config.Listener, addr net.Addr) *smtp.Server {
	info := &listenerInfo{mode: l.Mode, plainAuth: l.AllowPlaintextAuth, loopback: isLoopback(addr)}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return s.newSession(info, c)
	}))
	lim := s.cfg.Limits
	srv.Domain = s.cfg.Hostname
	srv.MaxMessageBytes = lim.MaxMessageBytes
	srv.MaxRecipients = lim.MaxRecipients
	// Body lines may be as long as the message; the connection keeps
	// command lines to maxLineLength (lines.go).
	srv.MaxLineLength = int(lim.MaxMessageBytes) + 2
	srv.ReadTimeout = lim.CommandTimeout
	srv.WriteTimeout = lim.CommandTimeout
	srv.TLSConfig = s.tls[i]
	// go-smtp decides per server; a loopback listener may still carry a
	// stranger (a load balancer's PROXY header names the real client), so
	// the session decides per client (session.plainAuthOK) where this
	// lets it.
	srv.AllowInsecureAuth = info.plainAuth || info.loopback
	srv.EnableSMTPUTF8 = true
	srv.EnableDSN = true
	// RFC 8689 §4.1: go-smtp advertises REQUIRETLS on TLS sessions only.
	srv.EnableREQUIRETLS = true
	srv.ErrorLog = errorLog{s.log}
	return srv
}

func isLoopback(a net.Addr) bool {
	ap, err := netip.ParseAddrPort(a.String())
	return err == nil && ap.Addr().IsLoopback()
}

// Addrs returns the bound addresses, in the order of Config.Listeners.
func (s *Server) Addrs() []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]net.Addr(nil), s.addrs...)
}

// Shutdown stops accepting, sends 421 4.3.2 to idle sessions and lets
// sessions in DATA finish: each either commits and gets its 250, or gets
// 421 4.3.2, and is then closed. When ctx ends first, reads fail at once,
// so a session still receiving DATA gets 421 4.3.2; an Enqueue already
// under way is waited for (its 250 is sent); then every connection is
// closed and ctx's error returned. It never answers 250 for a message not
// committed.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, srv := range servers {
			wg.Add(1)
			go func() { defer wg.Done(); srv.Shutdown(context.Background()) }()
		}
		wg.Wait()
		close(done)
	}()
	for _, c := range s.lim.snapshot(true) {
		c.drain()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	for _, c := range s.lim.snapshot(true) {
		c.stop()
	}
	// Reads now fail at once, so Data calls return quickly, except one
	// committing to the queue: it is let finish, and its 250 goes out.
	for s.inData.Load() > 0 {
		<-s.dataEnded
	}
	// A session whose Data just returned still has to write its 250 (it
	// may sit in the reply buffer until the session's next read or close,
	// which flush it). Each session now ends by itself at its next read;
	// they are waited for, up to replyFlush, before the stragglers are cut,
	// or a committed message loses its 250 and the client sends it again.
	s.awaitSessions(replyFlush)
	for _, c := range s.lim.snapshot(true) {
		c.kill() // a write still blocked now is cut, not waited for
	}
	<-done
	return ctx.Err()
}

// awaitSessions waits until every session has ended, or for at most limit.
func (s *Server) awaitSessions(limit time.Duration) {
	cut := time.NewTimer(limit)
	defer cut.Stop()
	for len(s.lim.snapshot(true)) > 0 {
		select {
		case <-s.lim.released:
		case <-cut.C:
			return
		}
	}
}

// connRefused logs and counts a connection refused before it had a session.
func (s *Server) connRefused(addr net.Addr, reply string, reason refusalReason) {
	s.metrics.Rejected.WithLabelValues("4xx", string(reason)).Inc()
	s.log.Debug("connection refused", zap.String("client", addr.String()), zap.String("reply", reply))
}

func (s *Server) isTrusted(ip netip.Addr) bool {
	for _, p := range s.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// queueDir is where free space is measured: the queue file's directory, or
// the nearest existing parent (the queue creates its directory on Open).
// Once the directory itself exists the answer is kept: it is asked twice
// per message.
func (s *Server) queueDir() string {
	if d := s.qdir.Load(); d != nil {
		return *d
	}
	want := filepath.Dir(s.cfg.Queue.Path)
	dir := want
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	if dir == want {
		s.qdir.Store(&dir)
	}
	return dir
}

// statfsFree is the default Options.DiskFree: bytes available to an
// unprivileged user on the filesystem holding path, less the reserve of
// reservePercent of the filesystem that intake leaves to delivery
// (queue.reserve_percent; the queue's journaler keeps it exactly, this
// check keeps a client from sending a message that would only be refused
// after its DATA).
func statfsFree(path string, reservePercent int) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	free := st.Bavail * uint64(st.Bsize)
	reserve := st.Blocks * uint64(st.Bsize) * uint64(max(reservePercent, 0)) / 100
	return free - min(free, reserve), nil
}

// errorLog sends go-smtp's internal messages to zap: panics it recovered
// at error level, everything else (handshake failures, resets) at debug.
//
// One panic is go-smtp's own and harmless: in v0.25.1 and v0.26.0 the
// goroutine that handleBdat starts calls c.Session().Data after the
// connection may already be closed (client gone right after a BDAT
// command), and dereferences the nil session. go-smtp recovers it; none of our code ran.
// It is logged at warn level without the stack, since any client can
// trigger it.
type errorLog struct{ l *zap.Logger }

func (e errorLog) Printf(format string, v ...any) { e.write(fmt.Sprintf(format, v...)) }
func (e errorLog) Println(v ...any)               { e.write(fmt.Sprintln(v...)) }

func (e errorLog) write(msg string) {
	switch {
	case strings.Contains(msg, "panic") && strings.Contains(msg, "handleBdat.func1") &&
		strings.Contains(msg, "nil pointer") && !strings.Contains(msg, "greyrelay/relay/smtpd"):
		e.l.Warn("go-smtp", zap.String("error", "BDAT goroutine ran after the connection closed (upstream race, recovered)"))
	case strings.Contains(msg, "panic"):
		e.l.Error("go-smtp", zap.String("error", msg))
	default:
		e.l.Debug("go-smtp", zap.String("error", msg))
	}
}
