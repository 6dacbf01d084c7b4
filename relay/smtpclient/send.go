package smtpclient

import (
	"bytes"
	"context"
	"fmt"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// Rcpt is one recipient with its DSN parameters (RFC 3461 §4).
type Rcpt struct {
	Addr   string
	Notify string // "" or e.g. "SUCCESS,FAILURE", "NEVER"
	// ORCPT is the original recipient, decoded, as "rfc822;addr"; a value
	// without the "rfc822;" prefix is taken as an rfc822 address.
	ORCPT string
}

// Envelope is one transaction's envelope.
type Envelope struct {
	From     string // "" is the null reverse-path <>
	Rcpts    []Rcpt
	Size     int64  // message size, for SIZE= (RFC 1870); 0 = unknown
	EightBit bool   // body has 8-bit content: BODY=8BITMIME (RFC 6152)
	SMTPUTF8 bool   // headers need SMTPUTF8 (RFC 6531); implied by non-ASCII addresses
	RET      string // "", "FULL" or "HDRS" (RFC 3461 §4.3)
	EnvID    string // decoded ENVID (RFC 3461 §4.4)
	// RequireTLS sends REQUIRETLS with MAIL (RFC 8689 §4.2.1); a peer that
	// does not advertise it, or a session without TLS, gets nothing.
	RequireTLS bool
}

// RcptResult is the reply to one RCPT.
type RcptResult struct {
	Rcpt  Rcpt
	Reply smtpvocab.Reply
}

// TxResult is what the peer said during one transaction.
type TxResult struct {
	Mail  smtpvocab.Reply // reply to MAIL
	Rcpts []RcptResult    // replies to the RCPTs sent, in order
	// Data is the reply that ended the DATA phase: the reply to the final
	// dot, the refusal of the DATA command itself, or the reply to BDAT
	// LAST. nil if no recipient was accepted (DATA or BDAT was not sent,
	// or, pipelined, its reply does not count) or no reply was read.
	Data *smtpvocab.Reply
	DSN  bool // the peer advertised DSN, so NOTIFY/ORCPT/RET/ENVID were passed on
	// Inline: the body went out whole in the same write as MAIL and the
	// RCPT (BDAT under PIPELINING, see inlineChunk), before any reply was
	// read. If the replies then never came, the peer may hold the message
	// although no RCPT reply was seen (the error is at StageEndOfData).
	Inline bool
	// NoRequireTLS: the message requires REQUIRETLS and this peer does not
	// offer it (or the session is not under TLS), so nothing was sent and
	// Mail holds the local 5.7.30 refusal. Another MX may offer it (RFC
	// 8689 §4.2.1).
	NoRequireTLS bool
}

// Send runs one transaction: MAIL, one RCPT per recipient, and the body
// if at least one RCPT was accepted. If the previous transaction on the
// connection did not complete (see Reset), Send first sends RSET; a
// completed one needs none (RFC 5321 §4.1.1.4: the reply to the final dot
// ends the transaction and clears its buffers).
//
// The body goes with DATA, or, when Options.Chunking is set and the peer
// advertises CHUNKING, as one "BDAT <size> LAST" chunk (RFC 3030 §2; see
// chunk): the same octets reach the peer either way.
//
// When the peer advertises PIPELINING (RFC 2920), the RSET, MAIL, the
// RCPTs and DATA (or BDAT with its chunk) go out as one group and their
// replies are read in order after it (see sendPipelined): one round trip
// instead of one per command. TxResult means the same either way: replies
// to commands that could not have been sent without pipelining (RCPT and
// DATA or BDAT after a refused MAIL, DATA or BDAT when no recipient was
// accepted) are read and left out.
//
// MAIL carries SIZE when advertised, BODY=8BITMIME when EightBit and
// advertised (8-bit data to a peer without 8BITMIME is sent as is, as
// Postfix does), SMTPUTF8 when needed and advertised, and RET/ENVID when
// DSN is advertised; RCPT carries NOTIFY/ORCPT when DSN is advertised.
//
// SMTP replies are results: a refused MAIL or RCPT, or a 4xx/5xx after the
// dot (or to BDAT), comes back in TxResult with a nil error. The error is
// non-nil only for connection-level trouble (I/O, timeout, unreadable
// reply, 421), as an *Error; TxResult then holds the replies received so
// far and the connection is closed. A timeout after the final dot, or after
// the whole chunk was sent, may mean the message was delivered anyway (RFC
// 1047): the error is then at StageEndOfData and the caller can only retry.
//
// An envelope that cannot be expressed (control characters, over-long
// command lines, bad DSN values) is a plain error; nothing is sent.
func (c *Client) Send(ctx context.Context, env Envelope, body []byte) (TxResult, error) {
	dsn, _ := c.Extension("DSN")
	res := TxResult{DSN: dsn}
	mail, rcpts, err := c.envelope(env)
	if err != nil {
		return res, err
	}
	if utf8, _ := c.Extension("SMTPUTF8"); needsUTF8(env) && !utf8 {
		// RFC 6531 §3.2: without SMTPUTF8 at the peer the message cannot be
		// sent; we answer for the peer, as mox does, and send nothing.
		res.Mail = smtpvocab.Reply{Code: 553, Enhanced: "5.6.7",
			Text: "local: peer does not support SMTPUTF8, required by this message (RFC 6531)"}
		return res, nil
	}
	if ok, _ := c.Extension("REQUIRETLS"); env.RequireTLS && (!ok || !c.tls) {
		// RFC 8689 §4.2.1: the message must not go to a server that does
		// not promise to keep requiring TLS; 5.7.30 "REQUIRETLS support
		// required" (RFC 8689 §6).
		res.Mail = smtpvocab.Reply{Code: 550, Enhanced: "5.7.30",
			Text: "local: peer does not support REQUIRETLS, required by this message (RFC 8689)"}
		res.NoRequireTLS = true
		return res, nil
	}
	t := tx{env: env, mail: mail, rcpts: rcpts, body: body, dsn: dsn}
	if ok, _ := c.Extension("CHUNKING"); ok && c.opt.Chunking {
		t.chunk = newFoldedChunk(body, c.opt.LineLengthLimit)
	}
	if ok, _ := c.Extension("PIPELINING"); ok {
		return c.sendPipelined(ctx, t)
	}
	return c.sendStepwise(ctx, t)
}

// tx is one transaction, checked and ready to go on the wire.
type tx struct {
	env   Envelope
	mail  string   // the MAIL command line
	rcpts []string // one RCPT command line per env.Rcpts
	body  []byte
	chunk *chunk // the body as a BDAT chunk; nil: the body goes with DATA
	dsn   bool   // the peer advertised DSN
}

// sendStepwise runs the transaction one command and reply at a time, for
// peers without PIPELINING.
func (c *Client) sendStepwise(ctx context.Context, t tx) (TxResult, error) {
	res := TxResult{DSN: t.dsn}
	if c.inTx {
		if err := c.ResetContext(ctx); err != nil {
			return res, err
		}
	}
	c.inTx = true
	r, _, err := c.cmd(ctx, smtpvocab.StageMAIL, t.mail)
	if r != nil {
		res.Mail = *r
	}
	if err != nil || r.Code/100 != 2 {
		return res, err
	}
	accepted := 0
	for i, line := range t.rcpts {
		r, _, err := c.cmd(ctx, smtpvocab.StageRCPT, line)
		if r != nil {
			res.Rcpts = append(res.Rcpts, RcptResult{Rcpt: t.env.Rcpts[i], Reply: *r})
		}
		if err != nil {
			return res, err
		}
		if r.Code/100 == 2 {
			accepted++
		}
	}
	switch {
	case accepted == 0:
	case t.chunk != nil:
		res.Data, err = c.bdat(ctx, t.chunk)
	default:
		r, _, err = c.cmd(ctx, smtpvocab.StageDATA, "DATA")
		res.Data, err = c.afterData(ctx, r, err, t.body)
	}
	return res, err
}

// afterData goes on from r, the reply to DATA (err: reading it failed):
// after a 354 it sends the body and returns the reply to the final dot;
// otherwise it returns the refusal.
func (c *Client) afterData(ctx context.Context, r *smtpvocab.Reply, err error, body []byte) (*smtpvocab.Reply, error) {
	if err != nil {
		return r, err
	}
	switch {
	case r.Code == 354:
	case r.Code >= 400:
		return r, nil
	default:
		// A 2xx to DATA without a body: we can no longer tell where we are.
		c.Close()
		return nil, &Error{Stage: smtpvocab.StageDATA, Err: textproto.ProtocolError("unexpected reply to DATA: " + r.Error())}
	}
	c.trace(Event{Time: time.Now(), Stage: smtpvocab.StageDATA, Sent: fmt.Sprintf("<%d octets of message data>", len(body))})
	// The payload is encoded a piece at a time into one reused buffer: a
	// large message is never copied whole a second time on its way out.
	enc := newBodyEncoder(body)
	enc.fold = c.opt.LineLengthLimit
	// Encoded, a body grows by at most a CR per LF and a dot per line, and
	// the final ".\r\n".
	buf := c.pieceBuf(2*len(body) + 5)
	for {
		buf = enc.next(buf[:0], dataPiece)
		if len(buf) == 0 {
			break
		}
		// The deadline is renewed per piece: a large message on a slow link
		// is fine as long as it makes progress (Postfix smtp_data_xfer_timeout).
		if err := c.write(ctx, smtpvocab.StageDATA, c.opt.DataTimeout, buf); err != nil {
			return nil, err
		}
	}
	r, _, err = c.exchange(ctx, smtpvocab.StageEndOfData, c.opt.DataTimeout, "", "")
	if err == nil && r.Code/100 == 2 {
		c.inTx = false // RFC 5321 §4.1.1.4: the transaction is over
	}
	return r, err
}

// write writes p under a deadline of timeout; a failure closes the
// connection and comes back as *Error at stage.
func (c *Client) write(ctx context.Context, stage smtpvocab.Stage, timeout time.Duration, p []byte) error {
	return c.writeOr(ctx, stage, timeout, p, func() { c.Close() })
}

// writeOr is write with the way the connection ends on a failure.
func (c *Client) writeOr(ctx context.Context, stage smtpvocab.Stage, timeout time.Duration, p []byte, end func()) error {
	err := c.within(ctx, timeout, func() error {
		_, err := c.conn.Write(p)
		return err
	})
	if err != nil {
		end()
		return &Error{Stage: stage, Err: err}
	}
	return nil
}

// Mail sends MAIL FROM:<from> with raw ESMTP params, for `greyrelay probe`.
// The error is non-nil for connection-level trouble (see Send); a 421
// comes with both the reply and an *Error.
func (c *Client) Mail(from string, params ...string) (*smtpvocab.Reply, error) {
	line, err := pathLine("MAIL FROM:", from, params)
	if err != nil {
		return nil, err
	}
	c.inTx = true
	r, _, err := c.cmd(context.Background(), smtpvocab.StageMAIL, line)
	return r, err
}

// Rcpt sends RCPT TO:<to> with raw ESMTP params, for `greyrelay probe`.
// Errors are as for Mail.
func (c *Client) Rcpt(to string, params ...string) (*smtpvocab.Reply, error) {
	line, err := pathLine("RCPT TO:", to, params)
	if err != nil {
		return nil, err
	}
	r, _, err := c.cmd(context.Background(), smtpvocab.StageRCPT, line)
	return r, err
}

// envelope builds the MAIL and RCPT lines, validating everything first so
// that a bad recipient cannot leave a half-sent transaction.
func (c *Client) envelope(env Envelope) (string, []string, error) {
	dsn, _ := c.Extension("DSN")
	var mp []string
	if ok, _ := c.Extension("SIZE"); ok && env.Size > 0 {
		mp = append(mp, "SIZE="+strconv.FormatInt(env.Size, 10))
	}
	if ok, _ := c.Extension("8BITMIME"); ok && env.EightBit {
		mp = append(mp, "BODY=8BITMIME")
	}
	if ok, _ := c.Extension("SMTPUTF8"); ok && needsUTF8(env) {
		mp = append(mp, "SMTPUTF8")
	}
	if env.RequireTLS {
		mp = append(mp, "REQUIRETLS")
	}
	if dsn {
		switch ret := strings.ToUpper(env.RET); ret {
		case "":
		case "FULL", "HDRS":
			mp = append(mp, "RET="+ret)
		default:
			return "", nil, fmt.Errorf("smtpclient: bad RET %q", env.RET)
		}
		if env.EnvID != "" {
			mp = append(mp, "ENVID="+xtext(env.EnvID))
		}
	}
	mail, err := pathLine("MAIL FROM:", env.From, mp)
	if err != nil {
		return "", nil, err
	}
	var rcpts []string
	for _, rc := range env.Rcpts {
		var rp []string
		if dsn {
			var err error
			if rp, err = rcptParams(rc); err != nil {
				return "", nil, err
			}
		}
		line, err := pathLine("RCPT TO:", rc.Addr, rp)
		if err != nil {
			return "", nil, err
		}
		rcpts = append(rcpts, line)
	}
	return mail, rcpts, nil
}

// rcptParams returns NOTIFY and ORCPT (RFC 3461 §4.1, §4.2).
func rcptParams(rc Rcpt) ([]string, error) {
	var p []string
	if rc.Notify != "" {
		n := strings.ToUpper(rc.Notify)
		for _, v := range strings.Split(n, ",") {
			if v != "SUCCESS" && v != "FAILURE" && v != "DELAY" && (v != "NEVER" || n != "NEVER") {
				return nil, fmt.Errorf("smtpclient: bad NOTIFY %q", rc.Notify)
			}
		}
		p = append(p, "NOTIFY="+n)
	}
	if rc.ORCPT != "" {
		addr := rc.ORCPT
		if len(addr) > 7 && strings.EqualFold(addr[:7], "rfc822;") {
			addr = addr[7:]
		}
		p = append(p, "ORCPT=rfc822;"+xtext(addr))
	}
	return p, nil
}

// pathLine builds "VERB:<path> params" after checking the path and params
// cannot break the command line.
func pathLine(verb, path string, params []string) (string, error) {
	if strings.ContainsFunc(path, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '<' || r == '>' }) {
		return "", fmt.Errorf("smtpclient: invalid address %q", path)
	}
	line := verb + "<" + path + ">"
	for _, p := range params {
		if p == "" || strings.ContainsFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return "", fmt.Errorf("smtpclient: invalid parameter %q", p)
		}
		line += " " + p
	}
	if len(line) > maxCommandLine {
		return "", fmt.Errorf("smtpclient: %s line too long (%d octets)", strings.TrimSuffix(verb, ":"), len(line))
	}
	return line, nil
}

// needsUTF8 reports whether the envelope needs SMTPUTF8 (RFC 6531 §3.4).
func needsUTF8(env Envelope) bool {
	if env.SMTPUTF8 || !ascii(env.From) {
		return true
	}
	for _, r := range env.Rcpts {
		if !ascii(r.Addr) {
			return true
		}
	}
	return false
}

func ascii(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// xtext encodes s as RFC 3461 §4 xtext: "!" to "~" except "+" and "=" as
// is, everything else as "+" and two upper-case hex digits.
func xtext(s string) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		if c >= '!' && c <= '~' && c != '+' && c != '=' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "+%02X", c)
		}
	}
	return b.String()
}

// bodyEncoder turns a message into DATA payload, a part at a time: every
// line ends in CRLF, a bare LF becomes CRLF and a bare CR becomes a space
// (Postfix cleanup_replace_stray_cr_lf), so we never carry the stray line
// endings of SMTP smuggling to the next hop; lines starting with "." get
// another "." (RFC 5321 §4.5.2); and ".\r\n" ends it. With fold set, a
// line longer than fold octets is broken by inserting CRLF SP after fold
// octets, and again after each further fold-1 (Options.LineLengthLimit).
// The octets counted are the message's, without a stuffed ".", so the
// receiver stores the same lines whether they came with DATA or BDAT. For a BDAT chunk
// (newChunkEncoder) the line endings and the folding are the same but
// there is no dot-stuffing and no final dot (RFC 3030 §2).
type bodyEncoder struct {
	body []byte
	i    int  // next byte of body to encode
	bol  bool // at the beginning of a line
	done bool // the final ".\r\n" (BDAT: the final CRLF) was produced
	bdat bool // a BDAT chunk: no dot-stuffing, no final dot
	fold int  // break lines longer than this (0 or 1: never)
	col  int  // octets of the current line produced so far (a stuffed "." not counted)
	// lf and cr are where the next LF and CR are (len(body): none), valid
	// while not behind i. Kept between runs, so each byte is scanned once
	// for each (bytes.IndexByte is vectorised; IndexAny is a byte loop and
	// would rescan a long line for every part of it).
	lf, cr int
}

func newBodyEncoder(body []byte) *bodyEncoder {
	return &bodyEncoder{body: body, bol: true, lf: -1, cr: -1}
}

// newChunkEncoder is newBodyEncoder for a BDAT chunk (see chunk).
func newChunkEncoder(body []byte) *bodyEncoder {
	e := newBodyEncoder(body)
	e.bdat = true
	return e
}

// find returns the position of the next c at or after e.i (len(e.body):
// none), searching only when *pos, its last known position, is behind.
func (e *bodyEncoder) find(pos *int, c byte) int {
	if *pos < e.i {
		*pos = len(e.body)
		if k := bytes.IndexByte(e.body[e.i:], c); k >= 0 {
			*pos = e.i + k
		}
	}
	return *pos
}

// next appends the next part of the payload to dst until dst holds at
// least limit bytes (a few more at most) or the payload ends, and returns
// dst; nothing appended means the payload is complete. It copies runs of
// ordinary bytes at once and looks at each line ending and line start on
// its own.
func (e *bodyEncoder) next(dst []byte, limit int) []byte {
	for e.i < len(e.body) && len(dst) < limit {
		if e.bol && e.body[e.i] == '.' && !e.bdat {
			dst = append(dst, '.') // the line's own "." follows in the run below
		}
		rest := e.body[e.i:]
		n := min(e.find(&e.lf, '\n'), e.find(&e.cr, '\r')) - e.i // the run of ordinary bytes
		if n > 0 {
			dst = e.foldIfFull(dst)
			// At least one byte, so a stuffed "." is never doubled again
			// by the next call.
			n = min(n, max(limit-len(dst), 1))
			if e.fold > 1 {
				n = min(n, e.fold-e.col)
			}
			dst = append(dst, rest[:n]...)
			e.i += n
			e.col += n
			e.bol = false
			continue
		}
		dst, e.bol = e.lineEnd(dst, rest)
	}
	if e.i >= len(e.body) && !e.done && len(dst) < limit {
		if !e.bol {
			dst = append(dst, '\r', '\n')
		}
		if !e.bdat {
			dst = append(dst, '.', '\r', '\n')
		}
		e.done = true
	}
	return dst
}

// lineEnd encodes the CR or LF that starts rest: CRLF and a bare LF end
// the line with CRLF, a bare CR becomes a space. It reports whether a line
// ended.
func (e *bodyEncoder) lineEnd(dst, rest []byte) ([]byte, bool) {
	switch {
	case rest[0] == '\r' && len(rest) > 1 && rest[1] == '\n':
		e.i += 2
	case rest[0] == '\r':
		e.i++
		dst = e.foldIfFull(dst)
		e.col++
		return append(dst, ' '), false
	default:
		e.i++
	}
	e.col = 0
	return append(dst, '\r', '\n'), true
}

// foldIfFull breaks the line before more of it is produced, when it holds
// fold octets already: CRLF SP, and the space starts the new line.
func (e *bodyEncoder) foldIfFull(dst []byte) []byte {
	if e.fold > 1 && e.col >= e.fold {
		dst = append(dst, '\r', '\n', ' ')
		e.col = 1
	}
	return dst
}
