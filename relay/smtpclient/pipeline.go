package smtpclient

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
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
	stage classifier.Stage
}

// sendPipelined is Send for a peer that advertises PIPELINING: RSET (if a
// transaction may be open), MAIL, the RCPTs and DATA in one group, then the
// replies in order; every reply is read, whatever the earlier ones said
// (RFC 2920 §3.1: the client "MUST check ALL statuses"). After a 354 the
// body follows as without pipelining, and the message body is never sent
// before that 354. If MAIL was refused or no recipient accepted and DATA
// got a 354 anyway, only the final dot is sent and its reply ignored (RFC
// 2920 §3.1), so nothing is delivered.
func (c *Client) sendPipelined(ctx context.Context, env Envelope, mail string, rcpts []string, body []byte) (TxResult, error) {
	dsn, _ := c.Extension("DSN")
	res := TxResult{DSN: dsn}
	var cmds []command
	reset := c.inTx
	if reset {
		cmds = append(cmds, command{"RSET", classifier.StageMAIL})
	}
	cmds = append(cmds, command{mail, classifier.StageMAIL})
	for _, l := range rcpts {
		cmds = append(cmds, command{l, classifier.StageRCPT})
	}
	cmds = append(cmds, command{"DATA", classifier.StageDATA})
	c.inTx = true
	replies, err := c.pipeline(ctx, cmds)
	next := func() (*classifier.Reply, bool) {
		if len(replies) == 0 {
			return nil, false // reading it failed: err says why
		}
		r := replies[0]
		replies = replies[1:]
		return r, true
	}
	if reset {
		if r, ok := next(); !ok || r.Code/100 != 2 {
			return res, c.resetRefused(r, err)
		}
	}
	r, ok := next()
	if !ok {
		return res, err
	}
	res.Mail = *r
	mailOK, accepted := r.Code/100 == 2, 0
	for i := range rcpts {
		if r, ok = next(); !ok {
			return res, err
		}
		if mailOK {
			res.Rcpts = append(res.Rcpts, RcptResult{Rcpt: env.Rcpts[i], Reply: *r})
			if r.Code/100 == 2 {
				accepted++
			}
		}
	}
	if r, ok = next(); !ok {
		return res, err
	}
	if !mailOK || accepted == 0 {
		if err == nil && r.Code == 354 {
			err = c.emptyData(ctx)
		}
		return res, err
	}
	res.Data, err = c.afterData(ctx, r, err, body)
	return res, err
}

// resetRefused is the error for a pipelined RSET that did not get a 2xx:
// err if reading its reply failed, else the refusal. After a refused RSET
// nothing in the group can be trusted, so the connection is closed (a 354
// to the DATA behind it only waits for a body that never comes).
func (c *Client) resetRefused(r *classifier.Reply, err error) error {
	if err != nil {
		return err
	}
	c.Close()
	return &Error{Stage: classifier.StageMAIL, Err: r}
}

// pipeline writes cmds in groups of at most maxGroup octets and reads one
// reply per command, in order, each under the command timeout. It returns
// the replies read; on the first failure (I/O, timeout, unreadable reply,
// or a 421, which is then the last reply returned) it stops with an *Error
// at the failing command's stage, and the connection is closed.
func (c *Client) pipeline(ctx context.Context, cmds []command) ([]*classifier.Reply, error) {
	for _, cmd := range cmds {
		if len(cmd.line) > maxCommandLine || strings.ContainsAny(cmd.line, "\r\n") {
			// Our own bug or unchecked input: never put it on the wire.
			return nil, fmt.Errorf("smtpclient: refusing to send malformed command line (%d octets)", len(cmd.line))
		}
	}
	replies := make([]*classifier.Reply, 0, len(cmds))
	for len(cmds) > 0 {
		n, size := 0, 0
		for n < len(cmds) && (n == 0 || size+len(cmds[n].line)+2 <= maxGroup) {
			size += len(cmds[n].line) + 2
			n++
		}
		if err := c.writeGroup(ctx, cmds[:n]); err != nil {
			return replies, err
		}
		for _, cmd := range cmds[:n] {
			r, _, err := c.exchange(ctx, cmd.stage, c.opt.CommandTimeout, "", "")
			if r != nil {
				replies = append(replies, r)
			}
			if err != nil {
				return replies, err
			}
		}
		cmds = cmds[n:]
	}
	return replies, nil
}

// writeGroup writes the lines of cmds in one write.
func (c *Client) writeGroup(ctx context.Context, cmds []command) error {
	var buf []byte
	now := time.Now()
	for _, cmd := range cmds {
		c.trace(Event{Time: now, Stage: cmd.stage, Sent: cmd.line})
		buf = append(append(buf, cmd.line...), '\r', '\n')
	}
	return c.write(ctx, cmds[0].stage, c.opt.CommandTimeout, buf)
}

// emptyData ends a DATA that was accepted although the transaction has no
// recipient (or no sender): RFC 2920 §3.1 has the client send just the
// final dot. The reply is read to keep the dialogue in step, and ignored.
func (c *Client) emptyData(ctx context.Context) error {
	c.trace(Event{Time: time.Now(), Stage: classifier.StageDATA, Sent: "<0 octets of message data>"})
	if err := c.write(ctx, classifier.StageDATA, c.opt.DataTimeout, []byte(".\r\n")); err != nil {
		return err
	}
	_, _, err := c.exchange(ctx, classifier.StageEndOfData, c.opt.DataTimeout, "", "")
	return err
}
