package smtpclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// within runs fn with the connection's deadline set to timeout from now (or
// the context's deadline, if earlier). A cancelled context interrupts the
// I/O by moving the deadline into the past; the context's error is then
// returned.
func (c *Client) within(ctx context.Context, timeout time.Duration, fn func() error) error {
	if c.closed {
		return net.ErrClosed
	}
	conn := c.conn
	dl := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	if err := conn.SetDeadline(dl); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	err := fn()
	if !stop() {
		return ctx.Err()
	}
	return err
}

// exchange writes line (unless empty) and reads one reply, under a single
// deadline of timeout. shown is what Trace sees instead of line. Any I/O or
// protocol error closes the connection and comes back as *Error. A 421
// reply (RFC 5321 §3.8: the server is closing the channel) is returned
// together with an *Error, and the connection is closed.
func (c *Client) exchange(ctx context.Context, stage smtpvocab.Stage, timeout time.Duration, line, shown string) (*smtpvocab.Reply, []string, error) {
	if len(line) > maxCommandLine || strings.ContainsAny(line, "\r\n") {
		// Our own bug or unchecked input: never put it on the wire.
		return nil, nil, fmt.Errorf("smtpclient: refusing to send malformed command line (%d octets)", len(line))
	}
	var r *smtpvocab.Reply
	var lines []string
	sent := time.Now()
	var err error
	if line == "" && !c.closed && replyBuffered(c.br) {
		// The next reply of a pipelined group, already read with the one
		// before it: no wait, so no deadline to set and no cancellation
		// to arrange.
		r, lines, err = smtpvocab.Read(c.br)
	} else {
		err = c.within(ctx, timeout, func() error {
			if line != "" {
				c.trace(Event{Time: sent, Stage: stage, Sent: shown})
				if _, err := c.conn.Write([]byte(line + "\r\n")); err != nil {
					return err
				}
			}
			var err error
			r, lines, err = smtpvocab.Read(c.br)
			return err
		})
	}
	now := time.Now()
	c.trace(Event{Time: now, Stage: stage, Reply: r, Elapsed: now.Sub(sent), Err: err})
	if err != nil {
		c.Close()
		return nil, nil, &Error{Stage: stage, Err: err}
	}
	if r.Code == 421 {
		c.Close()
		return r, lines, &Error{Stage: stage, Err: r}
	}
	return r, lines, nil
}

// cmd is exchange with the command timeout and an unredacted trace.
func (c *Client) cmd(ctx context.Context, stage smtpvocab.Stage, line string) (*smtpvocab.Reply, []string, error) {
	return c.exchange(ctx, stage, c.opt.CommandTimeout, line, line)
}

// startTLS applies the TLS policy (RFC 3207).
// ErrNoSTARTTLS: the server did not offer STARTTLS although the TLS policy
// requires it (TLS reporting names this starttls-not-supported).
var ErrNoSTARTTLS = errors.New("STARTTLS not offered")

func (c *Client) startTLS(ctx context.Context) error {
	offered, _ := c.Extension("STARTTLS")
	required := c.opt.TLS == TLSEncrypt || c.opt.TLS == TLSVerify
	switch {
	case c.opt.TLS == TLSNone, !offered && !required:
		return nil
	case !offered:
		// Possibly stripped by a man in the middle; the policy forbids
		// plaintext, so this is a deferral, never a fallback.
		c.quietQuit(smtpvocab.StageSTARTTLS)
		return &Error{Stage: smtpvocab.StageSTARTTLS, Err: &smtpvocab.TLSError{Err: fmt.Errorf("%w, but TLS policy is %s", ErrNoSTARTTLS, c.opt.TLS)}}
	}
	r, _, err := c.cmd(ctx, smtpvocab.StageSTARTTLS, "STARTTLS")
	if err != nil {
		return err
	}
	if r.Code != 220 {
		if !required {
			// RFC 3207 §4: the session is unchanged; opportunistic TLS
			// carries on in plaintext.
			return nil
		}
		c.quietQuit(smtpvocab.StageSTARTTLS)
		return &Error{Stage: smtpvocab.StageSTARTTLS, Err: &smtpvocab.TLSError{Err: r}}
	}
	if n := c.br.Buffered(); n > 0 {
		// Bytes after the 220 were sent before the handshake, in plaintext:
		// a man in the middle injecting replies we would read as if they
		// came through TLS (CVE-2021-38371, CVE-2011-0411 on the client).
		c.Close()
		return &Error{Stage: smtpvocab.StageSTARTTLS, Err: &smtpvocab.TLSError{
			Err: fmt.Errorf("%d bytes received after STARTTLS 220 before the handshake (response injection)", n)}}
	}
	if err := c.handshakeTLS(ctx); err != nil {
		c.Close()
		return &Error{Stage: smtpvocab.StageSTARTTLS, Err: &smtpvocab.TLSError{Err: err}}
	}
	// RFC 3207 §4.2: forget what we learnt before TLS and EHLO again.
	return c.hello(ctx)
}

// handshakeTLS runs the client handshake and switches the connection.
func (c *Client) handshakeTLS(ctx context.Context) error {
	cfg := &tls.Config{}
	if c.opt.TLSConfig != nil {
		cfg = c.opt.TLSConfig.Clone()
	}
	if cfg.ServerName == "" {
		// A policy may name the server otherwise (DANE: the TLSA base
		// domain, RFC 7672 §3.2.2).
		cfg.ServerName = c.server
	}
	// RFC 7435 §3: opportunistic encryption without authentication beats
	// plaintext; only "verify" checks the certificate.
	cfg.InsecureSkipVerify = c.opt.TLS != TLSVerify
	tc := tls.Client(c.conn, cfg)
	err := c.within(ctx, c.opt.CommandTimeout, func() error { return tc.HandshakeContext(ctx) })
	if err != nil {
		return err
	}
	c.conn = tc
	c.br.Reset(tc)
	c.tls = true
	return nil
}

// auth authenticates with AUTH PLAIN, or LOGIN if only that is offered
// (RFC 4954). Credentials never travel without TLS.
func (c *Client) auth(ctx context.Context) error {
	if c.opt.Username == "" {
		return nil
	}
	fail := func(err error) error {
		c.quietQuit(smtpvocab.StageAuth)
		c.Close()
		return &Error{Stage: smtpvocab.StageAuth, Err: err}
	}
	if !c.tls {
		return fail(errors.New("refusing to send credentials without TLS"))
	}
	_, params := c.Extension("AUTH")
	mechs := strings.Fields(strings.ToUpper(params))
	var steps []string
	switch {
	case slices.Contains(mechs, "PLAIN"):
		ir := base64.StdEncoding.EncodeToString([]byte("\x00" + c.opt.Username + "\x00" + c.opt.Password))
		steps = []string{"AUTH PLAIN " + ir}
	case slices.Contains(mechs, "LOGIN"):
		steps = []string{"AUTH LOGIN",
			base64.StdEncoding.EncodeToString([]byte(c.opt.Username)),
			base64.StdEncoding.EncodeToString([]byte(c.opt.Password))}
	default:
		return fail(fmt.Errorf("no supported AUTH mechanism offered (%q)", params))
	}
	for i, line := range steps {
		shown := "<redacted>"
		if i == 0 {
			shown = line[:min(len(line), len("AUTH LOGIN"))] + " <redacted>"
			if len(steps) > 1 {
				shown = line
			}
		}
		r, _, err := c.exchange(ctx, smtpvocab.StageAuth, c.opt.CommandTimeout, line, shown)
		switch {
		case err != nil:
			return err
		case r.Code == 235:
			return nil
		case r.Code != 334 || i == len(steps)-1:
			return fail(r)
		}
	}
	return fail(textproto.ProtocolError("AUTH dialogue did not end"))
}

// replyBuffered reports whether br holds a whole reply, so that reading
// it reads nothing from the peer: lines ended by LF, the last of them not
// a continuation line ("ddd-", RFC 5321 §4.2.1). Anything else (a line
// not ended yet, only continuation lines) is read under a deadline.
func replyBuffered(br *bufio.Reader) bool {
	p, _ := br.Peek(br.Buffered())
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return false
		}
		if line := p[:i]; len(line) < 4 || line[3] != '-' {
			return true
		}
		p = p[i+1:]
	}
	return false
}
