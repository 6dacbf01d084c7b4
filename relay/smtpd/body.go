package smtpd

import (
	"bytes"
	"io"

	"github.com/emersion/go-smtp"
)

// Reading a DATA body without go-smtp's reader.
//
// go-smtp reads a DATA body one octet at a time (bufio.Reader.ReadByte
// into the dot-unstuffing state machine it took from net/textproto),
// through a reader that also counts every octet against its line limit:
// for a 4 KiB message that was about a tenth of the relay's CPU. A
// bodyReader runs the same state machine over the connection's own buffer
// (conn.in), copying each run of octets up to the next CR at once, and
// leaves what follows the end of data in that buffer, where go-smtp reads
// the next command from.
//
// It is used only when nothing of the body can be in go-smtp's buffer,
// which go-smtp fills from the connection ahead of what it parses: in
// plaintext, when every command line the connection handed to go-smtp has
// been read by it as a command (lineFramer.ended against conn.reads), the
// last of them DATA, with no partial line or BDAT chunk pending. Otherwise
// (TLS, a client that sent its body before the 354, BDAT) go-smtp's reader
// is used, as before.
//
// When Data returns, go-smtp reads its own reader to the end of data, to
// make sure the body was all consumed: conn.Read then consumes whatever
// the bodyReader has not (after a refusal, the rest of the body, as
// go-smtp would), and hands go-smtp a bare end of data (endOfData), which
// its reader, at the start of a line, takes as the end.
//
// Everything else is as with go-smtp's reader, octet for octet: the same
// output (dots unstuffed, CRLF kept, the same quirks with a stray CR),
// the same end, the same max_message_bytes limit (ErrDataTooLarge once
// the limit is reached, so a body of exactly the limit is refused), the
// same errors. go-smtp's line limit, which it is given as the message
// size limit plus 2, is not applied: a line that long makes the body
// too large, and the body is refused with 552 either way.

// endOfData is what go-smtp's DATA reader reads as the end of a body.
var endOfData = []byte(".\r\n")

// The states of go-smtp's (and net/textproto's) DATA reader.
const (
	stateBeginLine = iota // beginning of line; initial state; must be zero
	stateDot              // read . at beginning of line
	stateDotCR            // read .\r at beginning of line
	stateCR               // read \r (possibly at end of line)
	stateData             // reading data in middle of line
	stateEOF              // reached .\r\n end marker line
)

// bodyReader reads a DATA body from its connection's buffer.
type bodyReader struct {
	c       *conn
	state   int
	limited bool
	left    int64 // octets left under the size limit
	err     error // a read error: sticky
}

// fastBody returns a bodyReader for the DATA body about to be read, or nil
// when go-smtp's reader must read it (see above). limit is go-smtp's
// MaxMessageBytes.
func (c *conn) fastBody(limit int64) io.Reader {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := &c.lines
	if c.in == nil || f.tls || c.broken != nil || f.skip != 0 || f.lineLen != 0 ||
		!f.lastData || f.ended != c.reads || c.bodyOn || len(c.synth) > 0 {
		return nil
	}
	c.body = bodyReader{c: c, limited: limit > 0, left: limit}
	c.bodyOn = true
	return &c.body
}

// Read is go-smtp's dataReader.Read.
func (r *bodyReader) Read(b []byte) (int, error) {
	if r.state == stateEOF {
		return 0, io.EOF
	}
	if r.err != nil {
		return 0, r.err
	}
	if r.limited {
		if r.left <= 0 {
			return 0, smtp.ErrDataTooLarge
		}
		if int64(len(b)) > r.left {
			b = b[:r.left]
		}
	}
	n := 0
	for n < len(b) && r.state != stateEOF {
		p, err := r.c.peekBody(n == 0)
		if err == io.EOF {
			// The client went away inside the body: never the end of it
			// (Read's own io.EOF), also after Data returned (drain).
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			r.err = err
			break
		}
		if len(p) == 0 {
			break // nothing more without waiting: return what there is
		}
		k, m := r.unstuff(b[n:], p)
		n += m
		if err := r.c.takeBody(p[:k]); err != nil {
			r.err = err
			break
		}
	}
	if r.limited {
		r.left -= int64(n)
	}
	if r.state == stateEOF {
		return n, io.EOF
	}
	return n, r.err
}

// unstuff runs the state machine over p into out until out is full, p is
// used up or the end of data is reached. It returns the octets taken from
// p and written to out.
func (r *bodyReader) unstuff(out, p []byte) (k, m int) {
	for m < len(out) && k < len(p) && r.state != stateEOF {
		if r.state == stateData {
			// Inside a line nothing changes before the next CR.
			run := p[k:min(len(p), k+len(out)-m)]
			if i := bytes.IndexByte(run, '\r'); i >= 0 {
				run = run[:i]
			}
			if len(run) > 0 {
				m += copy(out[m:], run)
				k += len(run)
				continue
			}
		}
		c := p[k]
		k++
		switch r.state {
		case stateBeginLine:
			if c == '.' {
				r.state = stateDot
				continue
			}
			if c == '\r' {
				r.state = stateCR
				break
			}
			r.state = stateData
		case stateDot:
			if c == '\r' {
				r.state = stateDotCR
				continue
			}
			r.state = stateData
		case stateDotCR:
			if c == '\n' {
				r.state = stateEOF
				continue
			}
			r.state = stateData
		case stateCR:
			if c == '\n' {
				r.state = stateBeginLine
				break
			}
			r.state = stateData
		case stateData:
			if c == '\r' {
				r.state = stateCR
			}
		}
		out[m] = c
		m++
	}
	return k, m
}

// drain consumes the rest of the body, without a size limit, as go-smtp
// does after Data returns.
func (r *bodyReader) drain() error {
	r.limited = false
	var scratch [4096]byte
	for {
		_, err := r.Read(scratch[:])
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// peekBody returns the octets buffered in c.in, first reading from the
// client if there are none and wait is set (with what Read does before a
// read: replies sent, the sticky error, the DATA deadline).
func (c *conn) peekBody(wait bool) ([]byte, error) {
	if c.in.Buffered() == 0 {
		if !wait {
			return nil, nil
		}
		if err := c.beforeRead(); err != nil {
			return nil, err
		}
		if _, err := c.in.Peek(1); err != nil {
			_, err = c.afterRead(nil, err)
			return nil, err
		}
	}
	p, _ := c.in.Peek(c.in.Buffered())
	return p, nil
}

// takeBody consumes p, the first octets buffered in c.in, as read (Read's
// afterRead: the DATA deadline's credit, the framer).
func (c *conn) takeBody(p []byte) error {
	_, err := c.afterRead(p, nil)
	c.in.Discard(len(p))
	return err
}
