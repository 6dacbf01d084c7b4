package delivery

import (
	"context"
	"crypto/tls"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

// maxTargets bounds the addresses one attempt dials (chasquid tries five
// MX hosts; we count addresses, and a host may have an IPv4 and an IPv6).
const maxTargets = 10

// shutdownQuit bounds the QUIT that closes a connection once the engine is
// shutting down: polite, but never a wait for command_timeout.
const shutdownQuit = 2 * time.Second

// target is one address to deliver to.
type target struct {
	host   string // MX (or smarthost, route) host name
	addr   netip.Addr
	port   int
	source string // our source address: configured before the dial, actual after
	tls    smtpclient.TLSPolicy
	// tlsConfig, when set, replaces Options.TLSConfig (DANE verification,
	// MTA-STS roots); policy names the TLS policy applied ("" when the
	// destination was not asked, see applyTLSPolicy) and authenticated
	// says the server's identity will be verified by DANE or MTA-STS.
	tlsConfig     *tls.Config
	policy        string
	authenticated bool
	report        tlsrpt.Policy // the policy as TLS reports name it; Domain "" when not reported
	// check verifies a session under an MTA-STS policy in testing mode,
	// for the report only (tlspolicy.Rule.Check).
	check func(*tls.ConnectionState) error
	// base is the TLS mode before any policy: delivery.tls, or the
	// configured route's; configured says the route is the operator's
	// (smarthost, per-domain route, address literal), not an MX. rule is
	// the destination's policy for host (nil when none was asked). A later
	// message on a connection to t is shaped from these (session.rides).
	base       smtpclient.TLSPolicy
	configured bool
	rule       *tlspolicy.Rule
}

func (t target) addrString() string {
	if !t.addr.IsValid() {
		return ""
	}
	return t.addr.String()
}

// session is an open connection, the TLS policy it was opened under
// (t), and what it has carried.
type session struct {
	c     *smtpclient.Client
	t     target
	relay bool // the peer relays further (smarthost)
	count int  // transactions sent
	// tls: STARTTLS succeeded, so the handshake passed t's verification
	// (WebPKI under "verify", the TLSA records under DANE); false when
	// opportunistic TLS went on in plaintext.
	tls bool
}

// carries reports whether j may go over s: j's recipients are not bound to
// another MX address by greylisting.
func (s *session) carries(j *job) bool {
	return j.want == "" || j.want == s.t.addr.String()
}

// rides returns the target msg would have had, had it opened a
// connection to s's host under the same policy decision, and whether s
// gives msg every TLS guarantee that target demands, so that msg may go
// over s. A connection is never a way around a message's own policy: one
// opened for a "TLS-Required: No" message (RFC 8689 §5) in plaintext to an
// MX that MTA-STS or DANE holds to TLS carries no other message, and a
// REQUIRETLS message rides only an authenticated connection whose peer
// offers REQUIRETLS (RFC 8689 §4.2.1). The returned target names the rule
// that applies to msg, for its attempt's record.
func (s *session) rides(msg queue.Message) (target, bool) {
	m, ok := shape(s.t.unshaped(), s.t.rule, msg)
	if !ok {
		return m, false
	}
	if msg.RequireTLS {
		if offered, _ := s.c.Extension("REQUIRETLS"); !offered || !s.tls {
			return m, false
		}
	}
	m.source, m.report = s.t.source, tlsrpt.Policy{}
	switch {
	case m.authenticated:
		// The same authentication (DANE, MTA-STS, a verified configured
		// hop), and it held at the handshake.
		return m, s.tls && s.t.authenticated && s.t.policy == m.policy
	case m.tls == smtpclient.TLSVerify:
		return m, s.tls && s.t.tls == smtpclient.TLSVerify && s.t.tlsConfig == m.tlsConfig
	case m.tls == smtpclient.TLSEncrypt:
		return m, s.tls
	}
	return m, true // "may" or "none": nothing is promised
}

// unshaped is t as targets built it, before any TLS policy (shape).
func (t target) unshaped() target {
	t.tls, t.tlsConfig, t.policy, t.authenticated, t.check = t.base, nil, "", false, nil
	t.report, t.rule = tlsrpt.Policy{}, nil
	return t
}

// leftover is what a host left undone in an attempt: the recipients that
// got no definite answer because the connection failed first, and that
// failure's verdict.
type leftover struct {
	rcpts []queue.Recipient
	v     classifier.Verdict
	// noRequireTLS: the host did not offer REQUIRETLS, which the message
	// needs, and was passed over without a transaction. Such a host does
	// not use up delivery.mx_session_limit: it left nothing undone that
	// a retry would finish, and the next MX may offer it.
	noRequireTLS bool
}

// overHosts routes j's domain and offers rest.rcpts (all of j's recipients
// unless begun) to its hosts in order, the greylisting host first, until
// every one has a definite answer or the hosts run out (RFC 5321 §5.1: try
// "each of the relevant addresses in this list in order, until a delivery
// attempt succeeds"). The next host gets the recipients left by
// connection-level trouble: refused, timeout, 421, a failed handshake, a
// connection lost before their answer (a failed STARTTLS under "may" is
// first retried in plaintext by smtpclient.DialWithFallback). A reply
// about a recipient or the message ends that recipient's attempt. Unless begun, the attempt is recorded
// (queue.Begin) with the first host before it is dialed; the host that
// answers is stored with the outcome (routeOverride). Recipients left when
// the hosts run out are deferred with the last verdict. It returns the
// connection to reuse, if any.
func (e *Engine) overHosts(ctx context.Context, d *dest, j *job, a *attempt, rest leftover, begun bool) *session {
	rt, ts, v := e.plan(ctx, d, j, a)
	switch {
	case ctx.Err() != nil:
		if !begun {
			e.unclaim(j.rcpts)
		} // else the attempt stays Active and is recovered
		return nil
	case len(ts) == 0 && !begun:
		if wake := e.deadWake(d, rt, a.start); !wake.IsZero() {
			if j.fresh != nil {
				// A postponement writes without an attempt: leave it to
				// the ordinary path, once the message is inserted.
				e.dropped(j.rcpts)
				return nil
			}
			e.postpone(d, j, v, wake, a.start) // no connection, so no attempt (flush.go)
			return nil
		}
		e.early(d, j, a, v)
		return nil
	case len(ts) == 0:
		e.giveUp(d, a, rest)
		return nil
	case !begun:
		if !e.begin(j, a, ts[0], len(ts)) {
			return nil
		}
		rest.rcpts = j.rcpts
	}
	sessions := 0
	for _, t := range ts {
		if limit := e.cfg.Delivery.MXSessionLimit; limit > 0 && sessions >= limit {
			// Postfix smtp_mx_session_limit: hosts that answer but leave
			// the recipients undone (421, a dropped connection) are not
			// tried without end; the rest waits for the next attempt.
			break
		}
		a.tried = t
		c, err, ok := e.dialPaced(ctx, d, a, t, rt.Kind)
		if !ok || ctx.Err() != nil {
			if c != nil {
				_ = c.Close()
			}
			return nil // shutting down: the attempt stays Active and is recovered
		}
		if err != nil {
			rest.v = e.classifyErr(smtpvocab.StageConnect, err)
			e.noteDialFailure(d, t, rest.v)
			continue
		}
		sessions++ // greeting and EHLO done: a session, as Postfix counts them
		s := e.opened(d, c, t, rt.Kind)
		if s, rest = e.transact(ctx, d, a, s, s.t, rest.rcpts); len(rest.rcpts) == 0 || ctx.Err() != nil {
			return s
		}
		if rest.noRequireTLS {
			sessions--
		}
	}
	e.giveUp(d, a, rest)
	return nil
}

// dialPaced dials t once the pace lets the attempt start (paceGate). A
// rate-limit reply to another transaction while it dialed (the greeting
// and EHLO take round trips) holds it again before its first command:
// with the connection open for a short wait, or closed and dialed again
// after a long one. It reports false if ctx ended first.
func (e *Engine) dialPaced(ctx context.Context, d *dest, a *attempt, t target, kind string) (*smtpclient.Client, error, bool) {
	for {
		if !e.paceGate(ctx, d, a, t.addrString(), func() {}) {
			return nil, nil, false
		}
		c, err := e.dial(ctx, t, kind)
		e.countTLSPolicy(t, c, err)
		if err != nil || ctx.Err() != nil {
			return c, err, true
		}
		closed := false
		if !e.paceGate(ctx, d, a, t.addrString(), func() { _ = c.QuitContext(ctx); closed = true }) {
			_ = c.Close()
			return nil, nil, false
		}
		if !closed {
			return c, nil, true
		}
	}
}

// plan routes d and lists the hosts to try for j. With none, v says why.
func (e *Engine) plan(ctx context.Context, d *dest, j *job, a *attempt) (mx.Route, []target, classifier.Verdict) {
	now := a.start
	rt, err := e.opt.Router.Route(ctx, d.name)
	if err != nil {
		return rt, nil, e.opt.Classifier.Classify(smtpvocab.StageDNS, err)
	}
	ts := e.targets(d, rt, j.want, now)
	if len(ts) == 0 {
		return rt, nil, e.opt.Classifier.Classify(smtpvocab.StageConnect, e.noTargets(d, rt, now))
	}
	ts, refused := e.applyTLSPolicy(ctx, rt, ts, a)
	if refused != nil {
		return rt, nil, tlsVerdict(e.opt.Classifier, refused)
	}
	return rt, ts, classifier.Verdict{}
}

// giveUp defers what no host took in this attempt. No host gave these
// recipients an answer, so their sticky route stays where it was (a
// greylisted recipient keeps its MX while the network hiccups).
func (e *Engine) giveUp(d *dest, a *attempt, rest leftover) {
	a.t = target{}
	e.settleAttempt(d, a, outcomesOf(rest.rcpts, sessionVerdict(rest.v)))
}

// Diagnoses when no address of a destination may be dialed.
var (
	errAllDead = errors.New("every address of the domain's mail servers failed recently and is skipped for now")
	errNoV6    = errors.New("the domain's mail servers have only IPv6 addresses and no IPv6 source address is configured")
)

// noTargets explains why targets found nothing to dial.
func (e *Engine) noTargets(d *dest, rt mx.Route, now time.Time) error {
	dead := e.deadHosts(d)
	for _, h := range rt.Hops {
		for _, addr := range h.Addrs {
			if !deadUntil(&dead, addr.String(), now).IsZero() {
				return errAllDead
			}
		}
	}
	return errNoV6
}

// sessionVerdict softens failures before MAIL: a 5xx greeting, EHLO or
// AUTH reply says nothing about the message (a misconfigured backup MX, a
// wrong smarthost password), so it defers instead of bouncing, as Postfix
// does (smtp_skip_5xx_greeting, smtp_sasl_auth_soft_bounce).
func sessionVerdict(v classifier.Verdict) classifier.Verdict {
	if v.Stage < smtpvocab.StageMAIL && v.Stage != smtpvocab.StageDNS {
		v.Outcome = classifier.Deferred
	}
	return v
}

// targets lists the addresses to try, in MX order, without addresses we
// cannot reach from a pinned source (IPv6 without Dialer6) or that are in
// the dead-host list. A greylisted job's MX address goes first.
func (e *Engine) targets(d *dest, rt mx.Route, want string, now time.Time) []target {
	mode := e.cfg.Delivery.TLS
	if rt.Kind == mx.KindSmarthost {
		mode = e.cfg.Delivery.Smarthost.TLS
	}
	configured := rt.Kind != mx.KindMX && rt.Kind != mx.KindImplicitMX
	dead := e.deadHosts(d)
	var ts []target
	for _, h := range rt.Hops {
		for _, addr := range h.Addrs {
			src := e.cfg.Delivery.SourceIPv4
			if addr.Is6() {
				if e.opt.Dialer6 == nil {
					continue // never a silent fallback to an unpinned source
				}
				src = e.cfg.Delivery.SourceIPv6
			}
			if !deadUntil(&dead, addr.String(), now).IsZero() {
				continue
			}
			ts = append(ts, target{host: h.Host, addr: addr, port: h.Port, source: src, tls: smtpclient.TLSPolicy(mode),
				base: smtpclient.TLSPolicy(mode), configured: configured})
		}
	}
	if k := slices.IndexFunc(ts, func(t target) bool { return t.addr.String() == want }); k > 0 {
		t := ts[k]
		ts = slices.Insert(slices.Delete(ts, k, k+1), 0, t)
	}
	return ts[:min(len(ts), maxTargets)]
}

// dial connects to t from the pinned source address of its family.
func (e *Engine) dial(ctx context.Context, t target, kind string) (*smtpclient.Client, error) {
	dl := e.opt.Dialer4
	if t.addr.Is6() {
		dl = e.opt.Dialer6
	}
	d := e.cfg.Delivery
	cfg := e.opt.TLSConfig
	if t.tlsConfig != nil {
		cfg = t.tlsConfig
	}
	opt := smtpclient.Options{Hostname: e.cfg.Hostname, TLS: t.tls, TLSConfig: cfg,
		ConnectTimeout: d.ConnectTimeout, GreetingTimeout: d.GreetingTimeout,
		CommandTimeout: d.CommandTimeout, DataTimeout: d.DataTimeout, Chunking: d.Chunking,
		LineLengthLimit: d.LineLengthLimit}
	if kind == mx.KindSmarthost {
		opt.Username, opt.Password = d.Smarthost.Username, d.Smarthost.Password
	}
	return smtpclient.DialWithFallback(ctx, dl, netip.AddrPortFrom(t.addr, uint16(t.port)), t.host, opt)
}

// noteDialFailure puts an address that refused or ignored the connection
// on the dead-host list for retry.initial_interval. A host that answered,
// even with 421, is alive and only loses this attempt.
func (e *Engine) noteDialFailure(d *dest, t target, v classifier.Verdict) {
	if v.Stage != smtpvocab.StageConnect || (v.Reason != classifier.Connect && v.Reason != classifier.Timeout) {
		return
	}
	addr, until := t.addr.String(), e.now().Add(e.policy.Initial)
	e.atLoop(func() { markDead(&d.rec, addr, until) }, false)
}

// deadHosts is a copy of d's dead-host list, which the loop owns, as a
// record that holds only that list (for deadUntil).
func (e *Engine) deadHosts(d *dest) queue.Destination {
	var dead queue.Destination
	e.call(func() { dead.DeadHosts = maps.Clone(d.rec.DeadHosts) })
	return dead
}

// opened wraps a new connection into a session and counts it.
func (e *Engine) opened(d *dest, c *smtpclient.Client, t target, kind string) *session {
	if la := c.LocalAddr(); la.IsValid() {
		t.source = la.Addr().String() // what the peer saw
	}
	addr := t.addr.String()
	e.atLoop(func() { markAlive(&d.rec, addr) }, false)
	e.m.ConnectionsOut.Inc()
	tlsLabel := "no"
	if _, ok := c.TLS(); ok {
		tlsLabel = "yes"
	}
	e.m.TLSOut.WithLabelValues(tlsLabel).Inc()
	return &session{c: c, t: t, relay: kind == mx.KindSmarthost, tls: tlsLabel == "yes"}
}

// closeSession ends s politely with QUIT. The wait for the reply ends
// with ctx, and once ctx has ended (shutdown) it is at most shutdownQuit,
// so an idle connection to a peer that does not answer never holds up
// Run.
func (e *Engine) closeSession(ctx context.Context, s *session) {
	if s == nil {
		return
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), shutdownQuit)
		defer cancel()
	}
	_ = s.c.QuitContext(ctx)
	e.m.ConnectionsOut.Dec()
}

// classifyErr classifies an error from smtpclient at the stage it names.
func (e *Engine) classifyErr(stage smtpvocab.Stage, err error) classifier.Verdict {
	var se *smtpclient.Error
	if errors.As(err, &se) {
		stage = se.Stage
	}
	return e.opt.Classifier.Classify(stage, err)
}

// envelope is the SMTP envelope of msg for rs.
func envelope(msg queue.Message, rs []queue.Recipient) smtpclient.Envelope {
	env := smtpclient.Envelope{From: msg.From, Size: msg.Size, EightBit: msg.EightBit,
		SMTPUTF8: msg.SMTPUTF8, RET: msg.RET, EnvID: msg.EnvID, RequireTLS: msg.RequireTLS}
	for _, r := range rs {
		env.Rcpts = append(env.Rcpts, smtpclient.Rcpt{Addr: r.Addr, Notify: r.Notify, ORCPT: r.ORCPT})
	}
	return env
}
