// Package smtpclient is greyrelay's outbound SMTP client: one connection to
// one peer, the EHLO/STARTTLS/AUTH handshake, and transactions on it.
//
// Design notes:
//
//   - It is written on the standard library (net, crypto/tls, bufio), not on
//     go-smtp's client: that client sends "localhost" as EHLO name before
//     STARTTLS and cannot continue in plaintext when STARTTLS is missing
//     (and has no PIPELINING nor BDAT). Replies are read by our own bounded reader, not
//     net/textproto's, whose ReadLine has no length limit.
//   - Every I/O step runs under one overall deadline (greeting, command or
//     data timeout, and the caller's context), set before the write and
//     kept for the whole reply, so a peer dripping one byte a minute cannot
//     hold us longer than the timeout.
//   - Errors are tagged with the dialogue stage (*Error). SMTP replies inside
//     a transaction are results, not errors: Send returns them in TxResult so
//     the caller can decide per recipient. Only connection-level trouble is an
//     error: I/O failures, timeouts, unreadable replies and 421, after which
//     the connection is closed.
//   - TLS policy follows Postfix: "none", "may" (opportunistic, RFC 7435:
//     unauthenticated encryption when offered), "encrypt" (TLS required,
//     certificate not checked) and "verify" (TLS required and verified).
//     With "encrypt" and "verify" no MAIL is ever sent in plaintext.
//   - PIPELINING (RFC 2920) when the peer advertises it: a transaction's
//     MAIL, RCPTs and DATA go out in one write and their replies are read
//     in order, so a transaction costs two round trips (envelope, then the
//     body) instead of one per command. Peers without it get one command
//     at a time.
//   - CHUNKING (RFC 3030 §2) when the peer advertises it and
//     Options.Chunking is set: the body goes as one "BDAT <size> LAST"
//     chunk instead of DATA, so the peer reads it by length instead of
//     scanning every octet for the final dot, and nothing is dot-stuffed.
//     The chunk holds exactly what DATA would deliver after un-stuffing
//     (CRLF line ends, no stray CR or LF); a body already in that form is
//     sent from its own memory, any other is encoded on the fly, never
//     copied whole. With PIPELINING too, a transaction for one recipient
//     with a chunk of up to 64 KiB goes out in one write (MAIL, RCPT, BDAT,
//     chunk): one round trip. Otherwise the chunk waits for an accepted
//     RCPT, as the body behind DATA waits for the 354 (see inlineChunk).
//   - A connection carries transaction after transaction. The client keeps
//     track of whether one may still be open and sends RSET only then: a
//     transaction that ended with a 2xx to the final dot (or to BDAT LAST)
//     needs none (RFC 5321 §4.1.1.4).
//
// A Client is not safe for concurrent use.
package smtpclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// Dialer opens connections; *net.Dialer with LocalAddr set pins the source
// address (greylisting keys on it, so it must be stable across retries).
type Dialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// TLSPolicy says how much TLS a connection needs.
type TLSPolicy string

// TLS policies. The zero value "" means TLSMay.
const (
	TLSNone    TLSPolicy = "none"    // never STARTTLS
	TLSMay     TLSPolicy = "may"     // STARTTLS when offered, certificate not checked (RFC 7435)
	TLSEncrypt TLSPolicy = "encrypt" // STARTTLS required, certificate not checked
	TLSVerify  TLSPolicy = "verify"  // STARTTLS required, certificate verified for the server name
)

// Default timeouts, from RFC 5321 §4.5.3.2 (and Postfix for connect).
const (
	DefaultConnectTimeout  = 30 * time.Second
	DefaultGreetingTimeout = 5 * time.Minute  // §4.5.3.2.1
	DefaultCommandTimeout  = 5 * time.Minute  // §4.5.3.2.2-4
	DefaultDataTimeout     = 10 * time.Minute // §4.5.3.2.6 (final dot)
)

// maxCommandLine bounds every line we send, CRLF excluded: RFC 5321
// §4.5.3.1.6 caps text lines at 1000 octets including CRLF.
const maxCommandLine = 998

// Options configure a connection.
type Options struct {
	Hostname string    // EHLO name, before and after STARTTLS
	TLS      TLSPolicy // "" means TLSMay
	// TLSConfig is the base TLS configuration (e.g. RootCAs). The client
	// sets ServerName per host unless TLSConfig names the server (DANE:
	// the TLSA base domain), and InsecureSkipVerify for "may" and
	// "encrypt" (opportunistic TLS, RFC 7435 §3); "verify" verifies fully.
	TLSConfig *tls.Config
	// Username and Password enable AUTH PLAIN (or LOGIN if only LOGIN is
	// offered). Credentials are only ever sent over TLS.
	Username, Password string
	// Timeouts; zero means the Default value. ConnectTimeout covers the TCP
	// connect, GreetingTimeout the banner, CommandTimeout each command
	// with its reply (and the TLS handshake), DataTimeout each 64 KiB of
	// message data and, separately, the reply to the final dot.
	ConnectTimeout, GreetingTimeout, CommandTimeout, DataTimeout time.Duration
	// Chunking sends the body with BDAT (RFC 3030) when the peer
	// advertises CHUNKING; otherwise, and always when false, with DATA.
	Chunking bool
	// LineLengthLimit folds body lines longer than this many octets (not
	// counting CRLF) by inserting CRLF SP, as Postfix's
	// smtp_line_length_limit does: RFC 5321 §4.5.3.1.6 lets a server
	// refuse lines over 1000 octets with CRLF, and the space makes the
	// break a header continuation (RFC 5322 §2.2.3) rather than a new
	// field. A DKIM signature over a folded line no longer verifies.
	// 0 sends lines unchanged.
	LineLengthLimit int
	// Trace, if set, receives every line sent and every reply received
	// (for `greyrelay probe`). AUTH payloads are redacted and the message
	// body is summarised as one event. Under PIPELINING the lines of a
	// group come first, then their replies.
	Trace func(Event)
}

// Event is one step of the dialogue, for tracing.
type Event struct {
	Time    time.Time
	Stage   smtpvocab.Stage
	Sent    string           // the line sent, without CRLF ("" for a reply)
	Reply   *smtpvocab.Reply // the reply received (nil for a sent line)
	Elapsed time.Duration    // for replies: time since the command was sent
	Err     error            // set if reading or writing failed
}

// Error tags a failure with the stage it happened at. Err is a
// *smtpvocab.Reply for SMTP replies, a *smtpvocab.TLSError for TLS
// trouble, a textproto.ProtocolError for unreadable replies, or a network,
// timeout or context error.
type Error struct {
	Stage smtpvocab.Stage
	Err   error
}

func (e *Error) Error() string { return fmt.Sprintf("smtp %s: %v", e.Stage, e.Err) }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Client is one SMTP connection.
type Client struct {
	raw    net.Conn // the TCP connection, for addresses
	conn   net.Conn // raw, or the TLS connection after STARTTLS
	br     *bufio.Reader
	opt    Options
	server string            // name the certificate must match
	ext    map[string]string // EHLO keywords (upper case) → parameters
	tls    bool
	closed bool
	// inTx: a transaction may be open at the peer. Set when MAIL is sent;
	// cleared by a 2xx to the final dot, to BDAT LAST or to RSET.
	inTx bool
	// piece is the DATA encoder's output buffer, kept for the next
	// message on this connection (see pieceBuf).
	piece []byte
	// group is the buffer a pipelined group is written from (with an
	// inline chunk: the whole message), kept likewise.
	group []byte
}

// pieceBuf returns an empty buffer for up to min(n, dataPiece) encoded
// octets and a little more. It is reused from message to message: a new
// 64 KiB buffer per message, allocated and zeroed for a 4 KiB body, was
// most of what sending DATA cost the allocator.
func (c *Client) pieceBuf(n int) []byte {
	if need := min(n, dataPiece) + 8; cap(c.piece) < need {
		c.piece = make([]byte, 0, need)
	}
	return c.piece[:0]
}

// Dial connects to addr and runs the handshake: greeting, EHLO (HELO if
// EHLO is refused with 5xx), STARTTLS per opt.TLS, EHLO again, and AUTH if
// opt.Username is set. serverName is the host name the certificate is
// checked against under "verify" (the MX host name). On failure the
// connection is closed and the error is an *Error, except for invalid
// options.
//
// Under "may", a STARTTLS handshake failure is an error at StageSTARTTLS:
// the connection is unusable. DialWithFallback retries in plaintext.
func Dial(ctx context.Context, d Dialer, addr netip.AddrPort, serverName string, opt Options) (*Client, error) {
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	if d == nil {
		d = &net.Dialer{}
	}
	dctx, cancel := context.WithTimeout(ctx, opt.ConnectTimeout)
	conn, err := d.DialContext(dctx, "tcp", addr.String())
	cancel()
	if err != nil {
		return nil, &Error{Stage: smtpvocab.StageConnect, Err: err}
	}
	if serverName == "" {
		serverName = addr.Addr().String()
	}
	c := &Client{raw: conn, conn: conn, br: bufio.NewReader(conn), opt: opt, server: serverName}
	if err := c.handshake(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// DialWithFallback is Dial, but when opt.TLS is "may" and STARTTLS fails
// (handshake error, response injection), it redials once with TLS "none",
// as Postfix does for opportunistic TLS: RFC 7435 §4 prefers cleartext
// delivery to none when encryption was only opportunistic. The plaintext
// session never authenticates (AUTH is refused without TLS).
func DialWithFallback(ctx context.Context, d Dialer, addr netip.AddrPort, serverName string, opt Options) (*Client, error) {
	c, err := Dial(ctx, d, addr, serverName, opt)
	var e *Error
	var te *smtpvocab.TLSError
	if err == nil || (opt.TLS != TLSMay && opt.TLS != "") ||
		!errors.As(err, &e) || e.Stage != smtpvocab.StageSTARTTLS || !errors.As(err, &te) {
		return c, err
	}
	opt.TLS = TLSNone
	return Dial(ctx, d, addr, serverName, opt)
}

// withDefaults validates opt and fills in default values.
func (opt Options) withDefaults() (Options, error) {
	if opt.Hostname == "" || len(opt.Hostname) > 255 || strings.IndexFunc(opt.Hostname, func(r rune) bool {
		return r <= ' ' || r >= 0x7f
	}) >= 0 {
		return opt, fmt.Errorf("smtpclient: invalid Hostname %q", opt.Hostname)
	}
	switch opt.TLS {
	case "":
		opt.TLS = TLSMay
	case TLSNone, TLSMay, TLSEncrypt, TLSVerify:
	default:
		return opt, fmt.Errorf("smtpclient: unknown TLS policy %q", opt.TLS)
	}
	for _, t := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&opt.ConnectTimeout, DefaultConnectTimeout}, {&opt.GreetingTimeout, DefaultGreetingTimeout},
		{&opt.CommandTimeout, DefaultCommandTimeout}, {&opt.DataTimeout, DefaultDataTimeout},
	} {
		if *t.v <= 0 {
			*t.v = t.def
		}
	}
	return opt, nil
}

// handshake runs greeting, EHLO, STARTTLS and AUTH.
func (c *Client) handshake(ctx context.Context) error {
	r, _, err := c.exchange(ctx, smtpvocab.StageGreeting, c.opt.GreetingTimeout, "", "")
	if err != nil {
		return err
	}
	if r.Code/100 != 2 {
		// RFC 5321 §3.1: after a 554 greeting the client should QUIT.
		c.quietQuit(smtpvocab.StageGreeting)
		return &Error{Stage: smtpvocab.StageGreeting, Err: r}
	}
	if err := c.hello(ctx); err != nil {
		return err
	}
	if err := c.startTLS(ctx); err != nil {
		return err
	}
	return c.auth(ctx)
}

// hello sends EHLO and records the extensions, falling back to HELO when
// EHLO is refused with a 5xx (RFC 5321 §3.2).
func (c *Client) hello(ctx context.Context) error {
	c.ext = map[string]string{}
	r, lines, err := c.cmd(ctx, smtpvocab.StageEHLO, "EHLO "+c.opt.Hostname)
	if err != nil {
		return err
	}
	if r.Code/100 == 5 {
		r, _, err = c.cmd(ctx, smtpvocab.StageEHLO, "HELO "+c.opt.Hostname)
		if err != nil {
			return err
		}
	} else if r.Code/100 == 2 {
		for _, l := range lines[1:] {
			kw, params, _ := strings.Cut(l, " ")
			c.ext[strings.ToUpper(kw)] = params
		}
	}
	if r.Code/100 != 2 {
		c.quietQuit(smtpvocab.StageEHLO)
		return &Error{Stage: smtpvocab.StageEHLO, Err: r}
	}
	return nil
}

// Extension reports whether the peer advertised the EHLO keyword name and
// returns its parameters.
func (c *Client) Extension(name string) (bool, string) {
	p, ok := c.ext[strings.ToUpper(name)]
	return ok, p
}

// TLS returns the TLS connection state if STARTTLS succeeded.
func (c *Client) TLS() (tls.ConnectionState, bool) {
	if tc, ok := c.conn.(*tls.Conn); ok {
		return tc.ConnectionState(), true
	}
	return tls.ConnectionState{}, false
}

// RemoteAddr returns the peer's address.
func (c *Client) RemoteAddr() netip.AddrPort { return addrPort(c.raw.RemoteAddr()) }

// LocalAddr returns our side's address: the pinned source address if the
// Dialer had one.
func (c *Client) LocalAddr() netip.AddrPort { return addrPort(c.raw.LocalAddr()) }

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// Reset sends RSET, ending any transaction (e.g. one where no recipient
// was accepted) so the connection can be reused (RFC 5321 §4.1.1.5). Send
// does this itself when needed; Reset is for transactions begun with Mail.
// It is ResetContext without a context: only the command timeout bounds it.
func (c *Client) Reset() error { return c.ResetContext(context.Background()) }

// ResetContext is Reset, interrupted when ctx ends (the connection is then
// closed and ctx's error returned), so a shutdown never waits out the
// command timeout on a peer that does not answer.
func (c *Client) ResetContext(ctx context.Context) error {
	r, _, err := c.cmd(ctx, smtpvocab.StageMAIL, "RSET")
	if err != nil {
		return err
	}
	if r.Code/100 != 2 {
		c.Close()
		return &Error{Stage: smtpvocab.StageMAIL, Err: r}
	}
	c.inTx = false
	return nil
}

// Quit sends QUIT, waits for the reply and closes the connection. It is
// QuitContext without a context: only the command timeout bounds it.
func (c *Client) Quit() error { return c.QuitContext(context.Background()) }

// QuitContext is Quit, waiting for the reply at most until ctx ends (a
// context with a short deadline bounds a polite QUIT at shutdown). The
// connection is closed either way.
func (c *Client) QuitContext(ctx context.Context) error {
	// Errors here are tagged StageEndOfData: the dialogue is over.
	_, _, err := c.cmd(ctx, smtpvocab.StageEndOfData, "QUIT")
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	return err
}

// quietQuit sends QUIT without waiting for the reply, before we close a
// connection we give up on; failures do not matter.
func (c *Client) quietQuit(stage smtpvocab.Stage) {
	if c.closed {
		return
	}
	_ = c.conn.SetWriteDeadline(time.Now().Add(min(c.opt.CommandTimeout, time.Second)))
	_, _ = c.conn.Write([]byte("QUIT\r\n"))
	c.trace(Event{Time: time.Now(), Stage: stage, Sent: "QUIT"})
}

// Close closes the connection without QUIT. It is idempotent.
func (c *Client) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	return c.conn.Close()
}

func (c *Client) trace(e Event) {
	if c.opt.Trace != nil {
		c.opt.Trace(e)
	}
}
