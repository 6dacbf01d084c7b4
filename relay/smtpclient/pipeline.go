package smtpclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// maxGroup bounds the octets of one pipelined write. RFC 2920 §3.2 bids
// the client never block on a write while the server may be blocked
// writing replies the client is not reading yet; a group this small fits
// in any TCP send buffer, so its write returns without the peer reading.
// A larger envelope (hundreds of recipients) goes out in several groups,
// each one's replies read before the next is written.
const maxGroup = 4 << 10

// command is one line of a pipelined group and the stage it belongs to.
type command struct {
	line  string
	stage smtpvocab.Stage
}

// sendPipelined is Send for a peer that advertises PIPELINING: RSET (if a
// transaction may be open), MAIL, the RCPTs and DATA in one group, then the
// replies in order; every reply is read, whatever the earlier ones said
// (RFC 2920 §3.1: the client "MUST check ALL statuses"). After a 354 the
// body follows as without pipelining, and the message body is never sent
// before that 354. If MAIL was refused or no recipient accepted and DATA
// got a 354 anyway, only the final dot is sent and its reply ignored (RFC
// 2920 §3.1), so nothing is delivered.
//
// With CHUNKING, "BDAT <size> LAST" takes the place of DATA and its chunk
// follows it in the same write (RFC 3030 §4.2 pipelines BDAT): the whole
// transaction costs one round trip. The chunk always follows its command
// and the peer reads it even when it refuses the BDAT (RFC 3030 §2), so
// the dialogue stays in step whatever MAIL and the RCPT got; the refusal
// of a BDAT without recipients is read and left out, and the transaction
// is reset before the next one, as after a refused DATA. When the chunk
// may not go with the envelope (see inlineChunk), the group ends with the
// last RCPT, and BDAT and its chunk follow once a recipient was accepted.
func (c *Client) sendPipelined(ctx context.Context, t tx) (TxResult, error) {
	res := TxResult{DSN: t.dsn}
	reset := c.inTx
	cmds, inline := group(t, reset)
	c.inTx = true
	replies, sent, err := c.pipeline(ctx, cmds, inline)
	res.Inline = inline != nil && sent
	q := &replyQueue{rs: replies}
	if reset {
		if r, ok := q.next(); !ok || r.Code/100 != 2 {
			return res, c.resetRefused(r, err)
		}
	}
	accepted, ok := q.envelope(&res, t.env)
	if !ok {
		return res, err
	}
	if t.chunk != nil && inline == nil { // a large chunk: only now, and only if someone takes it
		if accepted > 0 && err == nil { // err: a 421 to the last RCPT
			res.Data, err = c.bdat(ctx, t.chunk)
		}
		return res, err
	}
	r, ok := q.next()
	switch {
	case !ok:
	case accepted == 0 && inline == nil:
		if err == nil && r.Code == 354 {
			err = c.emptyData(ctx)
		}
	case accepted == 0:
		// The BDAT was refused (or, from a lenient peer, accepted for no
		// one): the reply does not count.
	case inline != nil:
		res.Data, err = c.afterChunk(r, err)
	default:
		res.Data, err = c.afterData(ctx, r, err, t.body)
	}
	return res, err
}

// group returns the commands of t's pipelined group, RSET first if reset,
// and the chunk that goes out with it (nil if none).
func group(t tx, reset bool) ([]command, *chunk) {
	cmds := make([]command, 0, len(t.rcpts)+3)
	if reset {
		cmds = append(cmds, command{"RSET", smtpvocab.StageMAIL})
	}
	cmds = append(cmds, command{t.mail, smtpvocab.StageMAIL})
	for _, l := range t.rcpts {
		cmds = append(cmds, command{l, smtpvocab.StageRCPT})
	}
	switch {
	case t.chunk == nil:
		return append(cmds, command{"DATA", smtpvocab.StageDATA}), nil
	case inlineChunk(t, reset):
		// Its reply is the final one: StageEndOfData (see afterChunk).
		return append(cmds, command{t.chunk.command(), smtpvocab.StageEndOfData}), t.chunk
	}
	return cmds, nil
}

// inlineChunk reports whether t's chunk may go out in the group with its
// envelope, before any reply is known. Only when every refusal that would
// make us give up on the group also makes the peer refuse the BDAT, so
// that the peer cannot deliver what we report as not delivered:
//   - one recipient: a refused MAIL or RCPT leaves no recipient, and BDAT
//     without one is refused (RFC 3030 §2). With several, a 421 to one
//     RCPT ends our reading while a peer that does not close after it
//     (go-smtp does not, when its backend returns 421) delivers the chunk
//     to the others, which we would then try again elsewhere;
//   - no RSET in front: after a refused RSET the peer may still hold the
//     previous transaction, and the chunk could go to its recipients;
//   - at most maxInlineChunk octets.
func inlineChunk(t tx, reset bool) bool {
	return len(t.rcpts) == 1 && !reset && t.chunk.size <= maxInlineChunk
}

// replyQueue hands out a pipelined group's replies in order.
type replyQueue struct{ rs []*smtpvocab.Reply }

// next returns the next reply; false if reading it failed (the error from
// pipeline says why).
func (q *replyQueue) next() (*smtpvocab.Reply, bool) {
	if len(q.rs) == 0 {
		return nil, false
	}
	r := q.rs[0]
	q.rs = q.rs[1:]
	return r, true
}

// envelope takes the replies to MAIL and to each RCPT of env into res
// (the RCPT replies only if MAIL was accepted) and returns how many
// recipients were accepted; false if a reply is missing.
func (q *replyQueue) envelope(res *TxResult, env Envelope) (int, bool) {
	r, ok := q.next()
	if !ok {
		return 0, false
	}
	res.Mail = *r
	mailOK, accepted := r.Code/100 == 2, 0
	for i := range env.Rcpts {
		if r, ok = q.next(); !ok {
			return accepted, false
		}
		if mailOK {
			res.Rcpts = append(res.Rcpts, RcptResult{Rcpt: env.Rcpts[i], Reply: *r})
			if r.Code/100 == 2 {
				accepted++
			}
		}
	}
	return accepted, true
}

// resetRefused is the error for a pipelined RSET that did not get a 2xx:
// err if reading its reply failed, else the refusal. After a refused RSET
// nothing in the group can be trusted, so the connection is closed (a 354
// to the DATA behind it only waits for a body that never comes).
func (c *Client) resetRefused(r *smtpvocab.Reply, err error) error {
	if err != nil {
		return err
	}
	c.Close()
	return &Error{Stage: smtpvocab.StageMAIL, Err: r}
}

// pipeline writes cmds in groups of at most maxGroup octets and reads one
// reply per command, in order, each under the command timeout (the data
// timeout for a reply at StageEndOfData, the final one). If inline is not
// nil, the last command is its BDAT and the chunk goes out in the same
// write as the last group. It returns the replies read; on the first
// failure (I/O, timeout, unreadable reply, or a 421, which is then the
// last reply returned) it stops with an *Error at the failing command's
// stage, and the connection is closed.
//
// sent reports whether the inline chunk went out whole. Once it has, a
// reply that cannot be read (the connection failed or timed out) fails at
// StageEndOfData whatever command it answered: the peer has the whole
// message and may deliver it (RFC 1047), as when the reply to a final dot
// is lost.
func (c *Client) pipeline(ctx context.Context, cmds []command, inline *chunk) (replies []*smtpvocab.Reply, sent bool, err error) {
	for _, cmd := range cmds {
		if len(cmd.line) > maxCommandLine || strings.ContainsAny(cmd.line, "\r\n") {
			// Our own bug or unchecked input: never put it on the wire.
			return nil, false, fmt.Errorf("smtpclient: refusing to send malformed command line (%d octets)", len(cmd.line))
		}
	}
	replies = make([]*smtpvocab.Reply, 0, len(cmds))
	for len(cmds) > 0 {
		n, size := 0, 0
		for n < len(cmds) && (n == 0 || size+len(cmds[n].line)+2 <= maxGroup) {
			size += len(cmds[n].line) + 2
			n++
		}
		var ch *chunk
		if n == len(cmds) {
			ch = inline
		}
		if err := c.writeGroup(ctx, cmds[:n], ch); err != nil {
			return replies, false, err
		}
		sent = ch != nil
		for _, cmd := range cmds[:n] {
			timeout := c.opt.CommandTimeout
			if cmd.stage == smtpvocab.StageEndOfData {
				timeout = c.opt.DataTimeout
			}
			r, _, err := c.exchange(ctx, cmd.stage, timeout, "", "")
			if r != nil {
				replies = append(replies, r)
			}
			var se *Error
			if err != nil && r == nil && sent && errors.As(err, &se) {
				se.Stage = smtpvocab.StageEndOfData
			}
			if err != nil {
				return replies, sent, err
			}
		}
		cmds = cmds[n:]
	}
	return replies, sent, nil
}

// writeGroup writes the lines of cmds in one write, followed by ch if it
// is not nil. The peer's replies to a group are small, so it never stops
// reading a chunk for want of our reading them (RFC 2920 §3.2).
func (c *Client) writeGroup(ctx context.Context, cmds []command, ch *chunk) error {
	buf := c.group[:0]
	now := time.Now()
	for _, cmd := range cmds {
		c.trace(Event{Time: now, Stage: cmd.stage, Sent: cmd.line})
		buf = append(append(buf, cmd.line...), '\r', '\n')
	}
	if ch != nil {
		return c.writeChunk(ctx, cmds[0].stage, buf, ch)
	}
	c.keepGroup(buf)
	return c.write(ctx, cmds[0].stage, c.opt.CommandTimeout, buf)
}

// maxKeptGroup bounds the group buffer kept between messages, idle
// connections included: a small message and its commands.
const maxKeptGroup = 16 << 10

// keepGroup keeps buf's array for the next group. The write that follows
// is done with it before the next group is built (one goroutine sends on
// a connection, one transaction at a time), and the connection keeps
// nothing of what it was given to write.
func (c *Client) keepGroup(buf []byte) {
	if cap(buf) <= maxKeptGroup {
		c.group = buf[:0]
	}
}

// emptyData ends a DATA that was accepted although the transaction has no
// recipient (or no sender): RFC 2920 §3.1 has the client send just the
// final dot. The reply is read to keep the dialogue in step, and ignored.
func (c *Client) emptyData(ctx context.Context) error {
	c.trace(Event{Time: time.Now(), Stage: smtpvocab.StageDATA, Sent: "<0 octets of message data>"})
	if err := c.write(ctx, smtpvocab.StageDATA, c.opt.DataTimeout, []byte(".\r\n")); err != nil {
		return err
	}
	_, _, err := c.exchange(ctx, smtpvocab.StageEndOfData, c.opt.DataTimeout, "", "")
	return err
}
