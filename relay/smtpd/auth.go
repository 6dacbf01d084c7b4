package smtpd

import (
	"bytes"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"go.uber.org/zap"
)

// AUTH (RFC 4954) with PLAIN (RFC 4616) and LOGIN.
//
// go-smtp refuses AUTH before TLS with 523 5.7.10 unless the listener
// allows plaintext AUTH, and does not advertise AUTH until then. We keep
// that reply: X.7.10 "Encryption Needed" is the registered code for it
// (RFC 5248 registry), while RFC 4954 §6 marks its own 538 5.7.11 as
// "historical purposes only" and says mechanisms that need encryption
// SHOULD NOT be advertised without it, which is what happens.
//
// go-smtp counts no failures, so one connection could try passwords
// forever. We count them per connection (closing with 421 4.7.0 at
// limits.max_auth_failures), per (client address, user) over a sliding
// hour (limits.max_auth_failures_per_user: that user is then locked for
// that address) and per client address (limits.max_auth_failures_per_ip:
// AUTH replies to it are then delayed by limits.auth_delay, but a right
// password still works); IPv6 clients count by prefix
// (limits.ipv6_prefix_length), since one host usually owns the whole of
// it. See authLimiter.

// AuthMechanisms lists the mechanisms go-smtp advertises once AUTH is
// allowed on the connection.
func (s *session) AuthMechanisms() []string {
	if !s.srv.users.HasLogins() || !s.plainAuthOK {
		return nil
	}
	return []string{sasl.Plain, sasl.Login}
}

// Auth starts an AUTH exchange.
func (s *session) Auth(mech string) (sasl.Server, error) {
	s.conn.productive()
	if refusal := s.refuseCutShort(); refusal != nil {
		return nil, refusal
	}
	if !s.srv.users.HasLogins() {
		return nil, s.refuse(reasonAuth, reply(502, 5, 5, 1, "AUTH not available"))
	}
	if !s.plainAuthOK {
		// go-smtp's own answer where it decides (see the top of this file).
		return nil, s.refuse(reasonAuth, reply(523, 5, 7, 10, "TLS is required"))
	}
	s.mu.Lock()
	inTransaction := s.env != nil
	s.mu.Unlock()
	if inTransaction {
		// RFC 4954 §4: AUTH during a mail transaction MUST get 503. It
		// matters: MAIL was checked against the sender rules of the
		// identity in force when it was given.
		return nil, s.refuse(reasonSequence, reply(503, 5, 5, 1, "AUTH not permitted during a mail transaction"))
	}
	switch strings.ToUpper(mech) {
	case sasl.Plain:
		return &plainServer{s: s}, nil
	case sasl.Login:
		return &loginServer{s: s}, nil
	}
	// RFC 4954 §4: 504 5.5.4 for an unknown mechanism.
	return nil, s.refuse(reasonAuth, reply(504, 5, 5, 4, "Unsupported authentication mechanism"))
}

// replyAuthLimit: RFC 5321 §3.8 421 closes the connection; RFC 3463 X.7.0
// "Other or undefined security status".
func replyAuthLimit() *smtp.SMTPError {
	return reply(421, 4, 7, 0, "Too many authentication failures, closing connection")
}

// authenticate checks credentials; every failure goes through authFailed.
// The authorization identity of PLAIN must be empty or equal to the
// authentication identity (go-sasl's contract: we support no proxying).
func (s *session) authenticate(authz, name, password string) error {
	// RFC 4954 §6: 535 5.7.8, the same reply for an unknown user, a wrong
	// password and an authorization identity we will not act for.
	invalid := reply(535, 5, 7, 8, "Authentication credentials invalid")
	ip, now := s.client.Addr(), s.srv.now()
	if s.srv.authLim.slowed(ip, now) {
		s.conn.pause(s.srv.cfg.Limits.AuthDelay)
		now = s.srv.now()
	}
	if s.srv.authLim.locked(ip, name, now) {
		// The password is not even looked at: a locked pair learns nothing.
		s.srv.metrics.AuthFailures.Inc()
		return s.refuseAndClose(reasonAuth, replyAuthLimit())
	}
	if authz != "" && authz != name {
		return s.authFailed(name, invalid)
	}
	ok, allowed := s.srv.users.Authenticate(name, password)
	if !ok {
		return s.authFailed(name, invalid)
	}
	s.user, s.allowed = name, allowed
	s.srv.lim.promote(s.conn) // out of the strangers' share (listener.go)
	s.srv.log.Info("authenticated", zap.String("client", s.clientS), zap.String("user", printable(name)))
	return nil
}

// authFailed counts a failure of name and returns r, or 421 4.7.0 when
// the connection's limit is reached or the (address, name) pair is now
// locked. Neither the user name nor anything else from the exchange is
// logged: it may be a password typed into the wrong field.
func (s *session) authFailed(name string, r *smtp.SMTPError) error {
	now := s.srv.now()
	n := s.conn.authFailed()
	s.srv.authLim.fail(s.client.Addr(), name, now)
	s.srv.metrics.AuthFailures.Inc()
	if n >= s.srv.cfg.Limits.MaxAuthFailures || s.srv.authLim.locked(s.client.Addr(), name, now) {
		return s.refuseAndClose(reasonAuth, replyAuthLimit())
	}
	return s.refuse(reasonAuth, r)
}

// plainServer is the server side of PLAIN (RFC 4616 §2): one response,
// authzid NUL authcid NUL passwd.
type plainServer struct {
	s          *session
	challenged bool
}

// Next handles the client's response.
func (p *plainServer) Next(resp []byte) ([]byte, bool, error) {
	if p.challenged {
		p.s.conn.productive() // a line go-smtp read for us
	}
	if resp == nil && !p.challenged {
		// RFC 4954 §4: no initial response, so an empty challenge.
		p.challenged = true
		return []byte{}, false, nil
	}
	parts := bytes.Split(resp, []byte{0})
	if len(parts) != 3 {
		// RFC 5321 §4.2.3 501; RFC 3463 X.5.2 syntax error.
		return nil, false, p.s.authFailed("", reply(501, 5, 5, 2, "Malformed AUTH PLAIN response"))
	}
	return nil, true, p.s.authenticate(string(parts[0]), string(parts[1]), string(parts[2]))
}

// loginServer is the server side of the LOGIN mechanism
// (draft-murchison-sasl-login): "Username:" then "Password:", each answer
// in base64. go-sasl has only the client side.
type loginServer struct {
	s          *session
	step       int
	user       string
	challenged bool
}

// Next handles the client's response.
func (l *loginServer) Next(resp []byte) ([]byte, bool, error) {
	if l.challenged {
		l.s.conn.productive()
	}
	l.challenged = true
	switch {
	case l.step == 0 && resp == nil:
		l.step = 1
		return []byte("Username:"), false, nil
	case l.step < 2:
		l.user, l.step = string(resp), 2
		return []byte("Password:"), false, nil
	}
	return nil, true, l.s.authenticate("", l.user, string(resp))
}

// authLimiter counts AUTH failures over a sliding window, per (client
// address, user name) and per client address (IPv6 clients by prefix).
//
// A (address, user) pair that used up its failures is locked: that user
// cannot log in from that address until the window has moved on. The
// address as a whole is never locked, since behind a NAT or Docker's -p
// every client shares one address and a guesser would lock everyone out;
// past its own, higher ceiling every AUTH from it is answered late
// instead (Postfix's smtpd_error_sleep_time in spirit), success and
// failure alike, so that the delay cannot be told apart from a verdict.
//
// It keeps at most max timestamps per key and at most maxUserKeys pairs,
// and forgets idle keys, so memory stays bounded under a spray of
// addresses and names.
type authLimiter struct {
	maxUser int // failures per (address, user) before the pair is locked
	maxAddr int // failures per address before AUTH replies are delayed
	window  time.Duration
	bits    int // limits.ipv6_prefix_length

	mu        sync.Mutex
	addrs     map[netip.Addr][]time.Time
	users     map[userKey][]time.Time
	lastSweep time.Time
}

// userKey is one (client address, user name) pair. Names longer than
// any account's are cut: they can only fail, and must not make the map
// large.
type userKey struct {
	ip   netip.Addr
	name string
}

// maxUserKeys bounds the pairs tracked at once; past it, new pairs are not
// counted (the address still is, and is slowed).
const maxUserKeys = 1 << 14

func newAuthLimiter(maxUser, maxAddr int, window time.Duration, ipv6Bits int) *authLimiter {
	return &authLimiter{maxUser: maxUser, maxAddr: maxAddr, window: window, bits: ipv6Bits,
		addrs: make(map[netip.Addr][]time.Time), users: make(map[userKey][]time.Time)}
}

func (a *authLimiter) key(ip netip.Addr, name string) userKey {
	if len(name) > maxNameLen {
		name = name[:maxNameLen+1]
	}
	return userKey{clientKey(ip, a.bits), name}
}

// locked reports whether name may not log in from ip now.
func (a *authLimiter) locked(ip netip.Addr, name string, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(recent(a.users, a.key(ip, name), now, a.window)) >= a.maxUser
}

// slowed reports whether AUTH replies to ip are to be delayed now.
func (a *authLimiter) slowed(ip netip.Addr, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(recent(a.addrs, clientKey(ip, a.bits), now, a.window)) >= a.maxAddr
}

// fail records a failure of name from ip.
func (a *authLimiter) fail(ip netip.Addr, name string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	note(a.addrs, clientKey(ip, a.bits), now, a.window, a.maxAddr)
	if k := a.key(ip, name); len(a.users) < maxUserKeys || a.users[k] != nil {
		note(a.users, k, now, a.window, a.maxUser)
	}
	if now.Sub(a.lastSweep) > time.Minute {
		a.lastSweep = now
		for k := range a.addrs {
			recent(a.addrs, k, now, a.window)
		}
		for k := range a.users {
			recent(a.users, k, now, a.window)
		}
	}
}

// note adds a failure at now to k's, keeping at most max.
func note[K comparable](m map[K][]time.Time, k K, now time.Time, window time.Duration, max int) {
	ts := append(recent(m, k, now, window), now)
	if len(ts) > max {
		ts = ts[len(ts)-max:]
	}
	m[k] = ts
}

// recent drops k's failures older than the window and returns the rest.
func recent[K comparable](m map[K][]time.Time, k K, now time.Time, window time.Duration) []time.Time {
	ts := m[k]
	i := 0
	for i < len(ts) && now.Sub(ts[i]) >= window {
		i++
	}
	ts = ts[i:]
	if len(ts) == 0 {
		delete(m, k)
		return nil
	}
	m[k] = ts
	return ts
}
