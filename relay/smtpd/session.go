package smtpd

import (
	"crypto/tls"
	"net"
	"net/netip"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/emersion/go-smtp"
	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/internal/safetext"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/config"
)

// listenerInfo is what a session needs to know about its listener.
type listenerInfo struct {
	mode      config.ListenerMode
	plainAuth bool // allow_plaintext_auth
	loopback  bool // bound to a loopback address
}

// session implements smtp.Session and smtp.AuthSession for one client
// between two EHLOs that go-smtp treats as a new session (it makes a new
// one after STARTTLS, so authentication never survives the upgrade).
//
// go-smtp calls the methods from the connection's goroutine, except that
// with BDAT, Data runs in a goroutine of its own while further commands
// are read. The envelope is therefore guarded by mu, and Mail copies into
// it everything Data needs.
type session struct {
	srv      *Server
	lis      *listenerInfo
	conn     *conn
	smtpConn *smtp.Conn
	client   netip.AddrPort
	clientS  string               // client.String(), for the log
	clientIP string               // client.Addr().String(), for the queue
	tlsState *tls.ConnectionState // nil without TLS
	trusted  bool                 // client address in trusted_networks
	// plainAuthOK: AUTH may be offered and taken on this connection as it
	// is (see newSession).
	plainAuthOK bool
	greeted     string // the last EHLO/HELO name greetingOK passed

	// The last HELO name Mail checked, and what it found: the name only
	// changes with a new EHLO. Used by Mail only (one goroutine).
	helo     string
	heloOK   bool
	heloSafe string

	// Set by AUTH; read by Mail and Rcpt on the same goroutine.
	user    string
	allowed []string

	mu        sync.Mutex
	env       *envelope // nil outside a transaction
	submitted bool      // a message was accepted in this session
	queued    string    // the queue id of the last message Data committed
}

// heloName is the client's EHLO/HELO name. A session of the HTTP door
// (submit.go) has no SMTP connection; its name is the one it was made with.
func (s *session) heloName() string {
	if s.smtpConn == nil {
		return s.greeted
	}
	return s.smtpConn.Hostname()
}

// envelope is one transaction, from MAIL to the end of DATA.
type envelope struct {
	from     string // canonical reverse-path; "" is <>
	helo     string // as given (only used where validated)
	heloOK   bool   // helo is a valid domain or address literal
	heloSafe string // sanitizeHelo(helo)
	user     string
	allowed  []string // the user's allowed senders, as at MAIL
	limitID  string   // whose user_limits count the message (userlimits.go)
	utf8     bool
	eightBit bool
	ret      string
	envID    string
	// requireTLS: MAIL FROM carried REQUIRETLS (RFC 8689 §4.1).
	requireTLS bool
	size       int64 // the client's SIZE= declaration (RFC 1870), 0 if none
	rcpts      []queue.NewRecipient
	seen       map[string]bool       // the rcpts, once there are many of them
	first      [1]queue.NewRecipient // rcpts' first array: one allocation less
}

// seenThreshold is the number of recipients from which duplicates are
// found with a map rather than by looking through the list: most messages
// have one or two, and the map was two allocations per message.
const seenThreshold = 16

// addRcpt adds r unless its address is already there (it would be
// delivered twice).
func (e *envelope) addRcpt(r queue.NewRecipient) {
	if e.seen != nil {
		if e.seen[r.Addr] {
			return
		}
		e.seen[r.Addr] = true
	} else {
		for i := range e.rcpts {
			if e.rcpts[i].Addr == r.Addr {
				return
			}
		}
		if len(e.rcpts)+1 >= seenThreshold {
			e.seen = make(map[string]bool, 2*seenThreshold)
			for i := range e.rcpts {
				e.seen[e.rcpts[i].Addr] = true
			}
			e.seen[r.Addr] = true
		}
	}
	e.rcpts = append(e.rcpts, r)
}

// connOf finds our connection under go-smtp's view of it.
func connOf(nc net.Conn) *conn {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	c, _ := nc.(*conn)
	return c
}

// newSession is the go-smtp backend: it runs at the first EHLO/HELO and at
// the first one after STARTTLS.
func (s *Server) newSession(li *listenerInfo, c *smtp.Conn) (smtp.Session, error) {
	tc := connOf(c.Conn())
	if tc == nil {
		return nil, replyLocalError()
	}
	tc.productive()
	tc.setReplyConn(c.Conn())
	sess := &session{srv: s, lis: li, conn: tc, smtpConn: c}
	if ap, err := netip.ParseAddrPort(c.Conn().RemoteAddr().String()); err == nil {
		sess.client = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	sess.clientS, sess.clientIP = sess.client.String(), sess.client.Addr().String()
	sess.trusted = s.isTrusted(sess.client.Addr())
	if st, ok := c.TLSConnectionState(); ok {
		sess.tlsState = &st
	}
	// Passwords in clear only where nobody can read them on the way: a
	// loopback client of a loopback listener. The client is the real one
	// (behind PROXY, the header's), not the balancer next door.
	sess.plainAuthOK = sess.tlsState != nil || li.plainAuth || li.loopback && sess.client.Addr().IsLoopback()
	if tc.isDraining() {
		return nil, sess.refuseAndClose(reasonShutdown, replyShutdown())
	}
	if !greetingOK(c.Hostname()) {
		// go-smtp forgets the name and the client may greet again.
		return nil, sess.refuse(reasonSyntax, replyBadGreeting())
	}
	sess.greeted = c.Hostname()
	return sess, nil
}

// replyBadGreeting: RFC 5321 §4.1.4 has EHLO and HELO carry a domain or
// an address literal; RFC 5321 §4.2.3 501 and RFC 3463 X.5.2 "Syntax
// error". The name is not echoed: it is what was wrong.
func replyBadGreeting() *smtp.SMTPError {
	return reply(501, 5, 5, 2, "Invalid EHLO/HELO argument: a domain name or address literal is required")
}

// greetingOK checks an EHLO/HELO argument before go-smtp echoes it in its
// 250 reply ("Hello <name>"): a domain, or an address literal
// (RFC 5321 §4.1.4). Names are taken as leniently as Postfix takes them
// (underscores, a numeric last label and a bare IPv4 address occur in the
// wild, and the Received header marks them as not valid); what may never
// pass is anything else, above all CR, LF and other control characters,
// which the echo would carry to the client (RFC 5321 §2.3.8: a reply
// contains no bare CR or LF).
func greetingOK(h string) bool {
	if h == "" || len(h) > address.MaxDomain {
		return false
	}
	if h[0] == '[' {
		_, err := address.ParseDomain(h, address.Options{})
		return err == nil
	}
	for _, r := range h {
		if !(r == '-' || r == '.' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)) {
			return false
		}
	}
	return utf8.ValidString(h)
}

// Reset ends the transaction (RSET, EHLO, end of DATA). Authentication
// stays: RFC 4954 §4 ties it to the session, not the transaction.
//
// A second EHLO/HELO reaches the session only here, after go-smtp has
// taken the new name and before it echoes it; a name greetingOK refuses
// gets 501 and the connection is closed, so the echo never goes out.
func (s *session) Reset() {
	s.mu.Lock()
	s.env = nil
	s.mu.Unlock()
	if h := s.smtpConn.Hostname(); h != s.greeted {
		s.greeted = h
		if !greetingOK(h) {
			r := s.refuse(reasonSyntax, replyBadGreeting())
			s.conn.goodbye(formatReply(r) + ", closing connection")
		}
	}
}

// Logout is called when go-smtp drops the session.
func (s *session) Logout() error {
	s.Reset()
	return nil
}

// Mail starts a transaction.
func (s *session) Mail(from string, opts *smtp.MailOptions) error {
	s.conn.productive()
	if refusal := s.refuseCutShort(); refusal != nil {
		return refusal
	}
	if s.conn.isDraining() {
		return s.refuseAndClose(reasonShutdown, replyShutdown())
	}
	if s.lis.mode != config.ModeSMTP && s.user == "" {
		// RFC 4954 §6: "530 5.7.0 Authentication required".
		return s.refuse(reasonAuth, reply(530, 5, 7, 0, "Authentication required"))
	}
	s.mu.Lock()
	active := s.env != nil
	s.mu.Unlock()
	if active {
		// RFC 5321 §4.1.4: MAIL inside a transaction is a bad sequence.
		return s.refuse(reasonSequence, reply(503, 5, 5, 1, "Nested MAIL command"))
	}
	env := &envelope{helo: s.heloName(), user: s.user, allowed: s.allowed}
	env.rcpts = env.first[:0]
	env.heloOK, env.heloSafe = s.checkHelo(env.helo)
	if opts != nil {
		env.utf8, env.eightBit = opts.UTF8, opts.Body == smtp.Body8BitMIME
		env.ret, env.envID = string(opts.Return), opts.EnvelopeID
		env.size = opts.Size
		env.requireTLS = opts.RequireTLS
	}
	if env.requireTLS && s.tlsState == nil {
		// RFC 8689 §4.1: REQUIRETLS is only offered, and only accepted,
		// in a TLS session; RFC 3463 X.7.10 "Encryption needed".
		return s.refuse("syntax", reply(530, 5, 7, 10, "REQUIRETLS needs a TLS session"))
	}
	var fromAddr address.Address
	if from != "" {
		a, err := address.Parse(from, address.Options{SMTPUTF8: env.utf8, Sender: true, Decoded: true})
		if err != nil {
			return s.refuse(reasonSyntax, err)
		}
		fromAddr, env.from = a, a.String()
	}
	if !senderAllowed(s.allowed, env.from, fromAddr) {
		// RFC 5321 §4.2.3 553 "mailbox name not allowed"; RFC 3463 X.7.1
		// "Delivery not authorized": Postfix reject_sender_login_mismatch.
		return s.refuse(reasonSender, reply(553, 5, 7, 1, "Sender address not allowed for this user"))
	}
	if s.user != "" && env.from != "" && s.srv.users != nil && s.srv.users.ownedByOther(s.user, fromAddr) {
		// The same reply as Postfix's reject_known_sender_login_mismatch.
		return s.refuse(reasonSender, reply(553, 5, 7, 1, "<"+env.from+">: Sender address rejected: not owned by user "+s.user))
	}
	env.limitID = s.limitID()
	if err := s.checkUserMessages(env.limitID); err != nil {
		return err
	}
	if len(env.envID) > 100 {
		// RFC 3461 §4.4: ENVID is at most 100 characters.
		return s.refuse(reasonSyntax, reply(501, 5, 5, 4, "ENVID too long"))
	}
	if err := s.checkDisk(true); err != nil {
		return err
	}
	s.mu.Lock()
	s.env = env
	s.mu.Unlock()
	return nil
}

// checkHelo validates and sanitises a HELO name for the Received header
// and the queue, remembering the answer for the next message.
func (s *session) checkHelo(helo string) (ok bool, safe string) {
	if helo != s.helo || s.heloSafe == "" {
		_, s.heloOK = validHelo(helo)
		s.helo, s.heloSafe = helo, sanitizeHelo(helo)
	}
	return s.heloOK, s.heloSafe
}

// senderAllowed applies a user's allowed senders (Users file): none listed
// means any sender (other users' addresses are refused separately, by
// Users.ownedByOther); "<>" allows the null sender, "@domain" any address at
// that domain, and a full address itself (local part compared without
// case, since mail systems hardly ever distinguish it). Domains are
// compared in their canonical form (address.DomainKey).
func senderAllowed(allowed []string, from string, a address.Address) bool {
	if len(allowed) == 0 {
		return true
	}
	key := ""
	if from != "" {
		key = ownerKey(a)
	}
	for _, e := range allowed {
		switch {
		case e == "<>":
			if from == "" {
				return true
			}
		case from == "":
		case strings.HasPrefix(e, "@"):
			if domainOwnerKey(a.Domain) == entryKey(e) {
				return true
			}
		default:
			if key == entryKey(e) {
				return true
			}
		}
	}
	return false
}

// Rcpt adds a recipient, if the client may relay at all.
func (s *session) Rcpt(to string, opts *smtp.RcptOptions) error {
	s.conn.productive()
	if refusal := s.refuseCutShort(); refusal != nil {
		return refusal
	}
	s.mu.Lock()
	env := s.env
	s.mu.Unlock()
	if env == nil {
		return s.refuse(reasonSequence, reply(503, 5, 5, 1, "MAIL first"))
	}
	a, err := s.rcptAddress(env, to)
	if err != nil {
		return err
	}
	if err := s.checkSuppressed(env, a); err != nil {
		return err
	}
	if err := s.checkUserRecipients(env); err != nil {
		return err
	}
	notify, orcpt, err := dsnParams(opts)
	if err != nil {
		return s.refuse(reasonSyntax, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(env.rcpts) >= s.srv.cfg.Limits.MaxRecipients {
		// RFC 5321 §4.5.3.1.10: too many recipients is 452, not 552.
		return s.refuse(reasonRecipients, reply(452, 4, 5, 3, "Too many recipients"))
	}
	// The address keeps its spelling (an SMTPUTF8 destination gets the
	// U-labels it was given); the domain that routes it, keys its
	// destination record and finds its TLS policy is canonical, so both
	// spellings of one domain are one destination.
	env.addRcpt(queue.NewRecipient{Addr: a.String(), Domain: address.DomainKey(a.Domain), Notify: notify, ORCPT: orcpt})
	return nil
}

// rcptAddress parses and checks a recipient, for a client that may relay.
//
// RFC 5321 §4.5.1 has servers take RCPT TO:<Postmaster> without a domain
// (go-smtp passes it on from v0.26); greyrelay has no mailbox of its own,
// so it goes to the configured postmaster address. It is subject to the
// relay check like every recipient: greyrelay is the destination of no
// mail, and taking it from anyone would give every client on the Internet
// a way through the relay (to one address, but with any content).
func (s *session) rcptAddress(env *envelope, to string) (address.Address, error) {
	// The identity is the one MAIL was given under (env.user).
	if env.user == "" && !(s.lis.mode == config.ModeSMTP && s.trusted) {
		// RFC 5321 §3.6.2: relaying is the server's choice; RFC 3463 X.7.1
		// "Delivery not authorized, message refused". Every domain is
		// remote for greyrelay, so there is nothing to accept here.
		return address.Address{}, s.refuse(reasonRelay, reply(554, 5, 7, 1, "Relay access denied"))
	}
	a, err := address.Parse(to, address.Options{SMTPUTF8: env.utf8, Decoded: true, Postmaster: true})
	if err != nil {
		return address.Address{}, s.refuse(reasonSyntax, err)
	}
	if a.Domain == "" { // the domainless postmaster
		if s.srv.postmaster.Domain == "" {
			// RFC 3463 X.1.1 "Bad destination mailbox address".
			return address.Address{}, s.refuse(reasonSyntax, reply(550, 5, 1, 1, "No postmaster address configured"))
		}
		return s.srv.postmaster, nil
	}
	if a.Literal() && s.srv.cfg.Delivery.AddressLiterals != "deliver" {
		// The address is well formed (so not X.1.3 or 553, "mailbox name
		// not allowed"): it names a destination system we do not deliver
		// to. RFC 3463 X.1.2 "Bad destination system address"; 550 is
		// RFC 5321 §4.2.2's refusal for policy reasons.
		return address.Address{}, s.refuse(reasonLiteral, reply(550, 5, 1, 2, "Mail to address literals is not accepted here"))
	}
	return a, nil
}

// dsnParams turns go-smtp's parsed RFC 3461 parameters into the queue's
// form. go-smtp validated NOTIFY and decoded ORCPT's xtext; the decoded
// address is checked again here because the utf-8-addr-xtext decoder lets
// some control characters through.
func dsnParams(opts *smtp.RcptOptions) (notify, orcpt string, err error) {
	if opts == nil {
		return "", "", nil
	}
	if len(opts.Notify) > 0 {
		parts := make([]string, len(opts.Notify))
		for i, n := range opts.Notify {
			parts[i] = strings.ToUpper(string(n))
		}
		notify = strings.Join(parts, ",")
	}
	if a := opts.OriginalRecipient; a != "" {
		// RFC 3461 §4.2: ORCPT is at most 500 characters.
		if len(a) > 500 || !utf8.ValidString(a) || strings.ContainsFunc(a, safetext.IsControl) {
			return "", "", reply(501, 5, 5, 4, "Malformed ORCPT parameter")
		}
		orcpt = strings.ToLower(string(opts.OriginalRecipientType)) + ";" + a
	}
	return notify, orcpt, nil
}

// checkDisk refuses work when the queue's filesystem has less than 1.5
// times the largest message free (Postfix queue_minfree) besides the
// reserve left to delivery (queue.reserve_percent): 452 4.3.1, so the
// client tries again later. A failing statfs is a local error (451 4.3.0).
// At MAIL a recent measurement may do (reuse, see room.go); after the
// final dot, the last check before a 250, the disk is measured.
func (s *session) checkDisk(reuse bool) error {
	need := uint64(s.srv.cfg.Limits.MaxMessageBytes) * 3 / 2
	free, err := s.srv.freeSpace(need, reuse)
	if err != nil {
		s.srv.log.Warn("cannot measure free disk space", zap.Error(err))
		return s.refuse(reasonStorage, replyLocalError())
	}
	if free < need {
		return s.refuse(reasonStorage, replyNoStorage())
	}
	return nil
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}
