package smtpclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/textproto"
	"strconv"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// dataPiece is how much message data goes out in one write, DATA or BDAT;
// DataTimeout is renewed for each piece.
const dataPiece = 64 << 10

// maxInlineChunk is the largest chunk that goes out in the same pipelined
// group as MAIL and the RCPTs, before any reply is read. RFC 3030 §2 has
// the server read (and discard) a chunk even when it refuses its BDAT, so
// a chunk sent before the RCPT replies are known is sent in vain when
// every recipient is refused, and greylisting refuses every recipient of
// a first attempt. A chunk that fits in one write costs little more than
// the round trip saved; a larger one waits for an accepted recipient, as
// the body behind DATA waits for the 354.
const maxInlineChunk = dataPiece

// chunk is a message body as one BDAT chunk (RFC 3030 §2): the octets the
// peer would store after DATA and un-stuffing, i.e. the body with every
// line ending made CRLF, every stray CR made a space, and a final CRLF
// (see bodyEncoder), but without dot-stuffing and without the final dot.
//
// A body that already is in that form, as every body our own server
// stores is, goes out as it is, in slices of itself: a large mapped body
// is never copied. Any other body is encoded on the way out a piece at a
// time, like the DATA payload; its size is counted beforehand in one
// pass, so both kinds travel with BDAT.
type chunk struct {
	body      []byte
	size      int64 // octets of the canonical form: the BDAT size
	canonical bool  // body is its own canonical form
	fold      int   // the encoder's fold (Options.LineLengthLimit)
}

// newChunk scans body (bytes.IndexByte, vectorised) for its canonical
// size: a CR without LF becomes a space (same size), an LF without CR
// gains a CR, and a body not ending in a line break gains CRLF.

// newFoldedChunk is newChunk with lines longer than fold octets folded
// (bodyEncoder.fold; 0: none). A body with such a line is not canonical,
// and its size is counted by encoding it once beforehand.
func newFoldedChunk(body []byte, fold int) *chunk {
	ch := &chunk{body: body, size: int64(len(body)), canonical: true, fold: fold}
	long := false
	i := 0
	for ; ; i++ {
		k := bytes.IndexByte(body[i:], '\n')
		if k < 0 {
			break
		}
		line := k
		if i+k == 0 || body[i+k-1] != '\r' {
			ch.size++
			ch.canonical = false
		} else {
			line-- // the CR of CRLF
		}
		long = long || fold > 1 && line > fold
		i += k
	}
	long = long || fold > 1 && len(body)-i > fold
	if long {
		ch.canonical = false
		ch.size = encodedSize(newChunkEncoder(body), fold)
		return ch
	}
	if len(body) > 0 && body[len(body)-1] != '\n' {
		ch.size += 2
		ch.canonical = false
	}
	for i := 0; ch.canonical; {
		k := bytes.IndexByte(body[i:], '\r')
		if k < 0 {
			break
		}
		i += k + 1
		ch.canonical = i < len(body) && body[i] == '\n'
	}
	return ch
}

// command is the BDAT command that sends the whole body as its last chunk.
func (ch *chunk) command() string { return "BDAT " + strconv.FormatInt(ch.size, 10) + " LAST" }

// chunkReader hands out a chunk a piece at a time.
type chunkReader struct {
	ch   *chunk
	off  int          // next octet of ch.body, when canonical
	enc  *bodyEncoder // when not canonical
	buf  []byte       // reused for the encoder's output
	sent int64        // octets handed out so far
}

// encodedSize runs enc with fold to its end and counts what it produces.
func encodedSize(enc *bodyEncoder, fold int) int64 {
	enc.fold = fold
	buf := make([]byte, 0, dataPiece+8)
	var n int64
	for {
		buf = enc.next(buf[:0], dataPiece)
		if len(buf) == 0 {
			return n
		}
		n += int64(len(buf))
	}
}

func (ch *chunk) reader() *chunkReader {
	r := &chunkReader{ch: ch}
	if !ch.canonical {
		r.enc = newChunkEncoder(ch.body)
		r.enc.fold = ch.fold
		r.buf = make([]byte, 0, min(ch.size, dataPiece)+8)
	}
	return r
}

// next returns the next piece of about dataPiece octets (nil at the end),
// valid until the following call. It checks the pieces add up to the size
// announced, so that a mistake of ours can never put message data where
// the peer expects commands (or leave it waiting for octets that never
// come).
func (r *chunkReader) next() ([]byte, error) {
	var p []byte
	if r.ch.canonical {
		p = r.ch.body[r.off:min(r.off+dataPiece, len(r.ch.body))]
		r.off += len(p)
	} else {
		r.buf = r.enc.next(r.buf[:0], dataPiece)
		p = r.buf
	}
	r.sent += int64(len(p))
	if r.sent > r.ch.size || (len(p) == 0 && r.sent != r.ch.size) {
		return nil, fmt.Errorf("smtpclient: BDAT chunk of %d octets announced, %d produced", r.ch.size, r.sent)
	}
	if len(p) == 0 {
		return nil, nil
	}
	return p, nil
}

// writeChunk writes head (command lines ending with the BDAT command)
// together with the first piece of ch in one write, then the rest piece by
// piece from the body's own memory (when canonical), each write under
// DataTimeout (Postfix smtp_data_xfer_timeout: a slow link is fine as long
// as it makes progress). Only the first piece, at most dataPiece octets,
// is copied, so that the commands and a small message leave in one write
// (one TCP send, one run of TLS records). A failure of the first write is
// at stage, later ones at StageDATA; either closes the connection.
func (c *Client) writeChunk(ctx context.Context, stage smtpvocab.Stage, head []byte, ch *chunk) error {
	if c.opt.Trace != nil {
		c.trace(Event{Time: time.Now(), Stage: smtpvocab.StageDATA, Sent: fmt.Sprintf("<%d octets of message data>", ch.size)})
	}
	r := ch.reader()
	for first := true; ; first = false {
		p, err := r.next()
		if err != nil {
			c.abort()
			return &Error{Stage: smtpvocab.StageDATA, Err: err}
		}
		if first {
			p = append(head, p...)
			c.keepGroup(p)
		}
		if len(p) == 0 {
			return nil
		}
		// A piece cut short aborts the connection (see abort).
		if err := c.writeOr(ctx, stage, c.opt.DataTimeout, p, c.abort); err != nil {
			return err
		}
		stage = smtpvocab.StageDATA
	}
}

// abort closes the connection with a TCP reset instead of a FIN, for a
// chunk cut short (a failed write, a body that cannot be read). A peer
// reading the chunk then gets an error, not an end of stream: some servers
// (go-smtp's, for one) take an end of stream inside a chunk for its end
// and would store the message cut short.
func (c *Client) abort() {
	conn := c.conn
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	c.Close()
}

// bdat sends the whole body as one chunk, "BDAT <size> LAST" and the chunk
// in one write, and returns the final reply (see afterChunk). There is no
// intermediate reply to wait for, unlike the 354 to DATA.
func (c *Client) bdat(ctx context.Context, ch *chunk) (*smtpvocab.Reply, error) {
	line := ch.command()
	c.trace(Event{Time: time.Now(), Stage: smtpvocab.StageEndOfData, Sent: line})
	if err := c.writeChunk(ctx, smtpvocab.StageDATA, []byte(line+"\r\n"), ch); err != nil {
		return nil, err
	}
	r, _, err := c.exchange(ctx, smtpvocab.StageEndOfData, c.opt.DataTimeout, "", "")
	return c.afterChunk(r, err)
}

// afterChunk maps r, the reply to BDAT LAST (err: reading it failed), the
// way afterData maps the reply to the final dot: it is the transaction's
// final reply (RFC 3030 §2), so it is read at StageEndOfData, and a
// connection lost after the chunk went out is, like one lost after the
// dot, a message that may have been delivered. A 2xx ends the transaction;
// after a 4xx or 5xx the next one starts with RSET (RFC 3030 §2 leaves the
// state to the server).
func (c *Client) afterChunk(r *smtpvocab.Reply, err error) (*smtpvocab.Reply, error) {
	if err != nil {
		return r, err
	}
	switch {
	case r.Code/100 == 2:
		c.inTx = false
	case r.Code >= 400:
	default:
		// BDAT has no intermediate reply: we can no longer tell where we are.
		c.Close()
		return nil, &Error{Stage: smtpvocab.StageEndOfData, Err: textproto.ProtocolError("unexpected reply to BDAT: " + r.Error())}
	}
	return r, nil
}
