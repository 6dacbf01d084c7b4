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
// forever. We count them per connection (closing
// with 421 4.7.0 at limits.max_auth_failures) and per client address over
// a sliding hour (limits.max_auth_failures_per_ip; IPv6 clients by /64,
// since one host usually owns the whole prefix).

// AuthMechanisms lists the mechanisms go-smtp advertises once AUTH is
// allowed on the connection.
func (s *session) AuthMechanisms() []string {
	if s.srv.users == nil {
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
	if s.srv.users == nil {
		return nil, s.refuse(reasonAuth, reply(502, 5, 5, 1, "AUTH not available"))
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
	if s.srv.authLim.blocked(s.client.Addr(), s.srv.now()) {
		return nil, s.refuseAndClose(reasonAuth, replyAuthLimit())
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
	if authz != "" && authz != name {
		return s.authFailed(invalid)
	}
	ok, allowed := s.srv.users.Authenticate(name, password)
	if !ok {
		return s.authFailed(invalid)
	}
	s.user, s.allowed = name, allowed
	s.srv.log.Info("authenticated", zap.String("client", s.clientS), zap.String("user", printable(name)))
	return nil
}

// authFailed counts a failure and returns r, or 421 4.7.0 when a limit is
// reached. Neither the user name nor anything else from the exchange is
// logged: it may be a password typed into the wrong field.
func (s *session) authFailed(r *smtp.SMTPError) error {
	now := s.srv.now()
	n := s.conn.authFailed()
	s.srv.authLim.fail(s.client.Addr(), now)
	s.srv.metrics.AuthFailures.Inc()
	if n >= s.srv.cfg.Limits.MaxAuthFailures || s.srv.authLim.blocked(s.client.Addr(), now) {
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
		return nil, false, p.s.authFailed(reply(501, 5, 5, 2, "Malformed AUTH PLAIN response"))
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

// authLimiter counts AUTH failures per client address over a sliding
// window. It keeps at most max timestamps per address and forgets idle
// addresses, so memory stays bounded under a spray of addresses.
type authLimiter struct {
	max    int
	window time.Duration
	bits   int // limits.ipv6_prefix_length

	mu        sync.Mutex
	fails     map[netip.Addr][]time.Time
	lastSweep time.Time
}

func newAuthLimiter(max int, window time.Duration, ipv6Bits int) *authLimiter {
	return &authLimiter{max: max, window: window, bits: ipv6Bits, fails: make(map[netip.Addr][]time.Time)}
}

// blocked reports whether ip has used up its failures.
func (a *authLimiter) blocked(ip netip.Addr, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.recent(clientKey(ip, a.bits), now)) >= a.max
}

// fail records a failure for ip.
func (a *authLimiter) fail(ip netip.Addr, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := clientKey(ip, a.bits)
	ts := append(a.recent(k, now), now)
	if len(ts) > a.max {
		ts = ts[len(ts)-a.max:]
	}
	a.fails[k] = ts
	if now.Sub(a.lastSweep) > time.Minute {
		a.lastSweep = now
		for k := range a.fails {
			a.recent(k, now)
		}
	}
}

// recent drops k's failures older than the window and returns the rest.
func (a *authLimiter) recent(k netip.Addr, now time.Time) []time.Time {
	ts := a.fails[k]
	i := 0
	for i < len(ts) && now.Sub(ts[i]) >= a.window {
		i++
	}
	ts = ts[i:]
	if len(ts) == 0 {
		delete(a.fails, k)
		return nil
	}
	a.fails[k] = ts
	return ts
}
