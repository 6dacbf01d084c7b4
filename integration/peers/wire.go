package peers

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// wireMode is what the client's next bytes are.
type wireMode int

const (
	wireCommand wireMode = iota
	wireData             // message lines up to the lone dot
	wireBDAT             // a BDAT chunk's raw bytes
	wireAuth             // one SASL response line
)

// wireConn counts the client's commands as they cross the wire, because
// go-smtp answers some of them itself without telling the backend: DATA
// when no recipient was accepted gets 502 and the session never hears of
// it, yet "the relay sent DATA anyway" is exactly what a test must see.
//
// It follows the dialogue well enough to tell commands from message data:
// it pairs each final server reply with the oldest command awaiting one
// (RFC 2920 pipelining keeps replies in order), enters data mode on a 354
// to DATA, skips BDAT chunks by their size (RFC 3030), and skips SASL
// response lines after a 334. After a 220 to STARTTLS the rest of the
// connection is ciphertext and it stops counting.
type wireConn struct {
	net.Conn
	sink *Sink

	mu      sync.Mutex
	in, out []byte           // partial client and server lines
	pending []string         // commands awaiting a final reply; "" is the greeting
	reply   smtpvocab.Parser // the server's reply so far
	mode    wireMode
	bdat    int64 // bytes of the current BDAT chunk still to come
	blind   bool  // STARTTLS done: no more plaintext here
}

// maxWireLine bounds the bytes kept of one line; only a command's first
// words (or a lone dot) matter.
const maxWireLine = 4096

func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.client(p[:n])
	if errors.Is(err, io.EOF) && c.mode == wireBDAT && c.bdat > 0 {
		// The client went away inside a BDAT chunk. go-smtp copies a chunk
		// through an io.LimitReader, which takes io.EOF for a normal end,
		// and would store the short chunk as the whole message (greyrelay's
		// own server guards against it the same way). A real MTA does not
		// deliver a cut message, so neither does the sink.
		err = io.ErrUnexpectedEOF
	}
	c.mu.Unlock()
	return n, err
}

func (c *wireConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	c.server(p[:n])
	c.mu.Unlock()
	return n, err
}

// client consumes bytes sent by the client.
func (c *wireConn) client(b []byte) {
	for len(b) > 0 && !c.blind {
		if c.mode == wireBDAT {
			skip := min(c.bdat, int64(len(b)))
			c.bdat -= skip
			b = b[skip:]
			if c.bdat == 0 {
				c.mode = wireCommand
			}
			continue
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			c.in = appendCapped(c.in, b)
			return
		}
		line := string(appendCapped(c.in, b[:i+1]))
		c.in, b = c.in[:0], b[i+1:]
		c.clientLine(strings.TrimRight(line, "\r\n"))
	}
}

// clientLine handles one complete client line.
func (c *wireConn) clientLine(line string) {
	switch c.mode {
	case wireData:
		if line == "." {
			c.mode = wireCommand
			c.pending = append(c.pending, ".")
		}
		return
	case wireAuth:
		c.mode = wireCommand // the AUTH command is still awaiting its final reply
		return
	}
	fields := strings.Fields(line)
	verb := ""
	if len(fields) > 0 {
		verb = strings.ToUpper(fields[0])
	}
	c.sink.noteCommand(verb)
	c.pending = append(c.pending, verb)
	if verb == "BDAT" && len(fields) > 1 {
		if n, err := strconv.ParseInt(fields[1], 10, 64); err == nil && n > 0 {
			c.mode, c.bdat = wireBDAT, n
		}
	}
}

// server consumes bytes sent by the server.
func (c *wireConn) server(b []byte) {
	for len(b) > 0 && !c.blind {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			c.out = appendCapped(c.out, b)
			return
		}
		line := string(appendCapped(c.out, b[:i+1]))
		c.out, b = c.out[:0], b[i+1:]
		c.serverLine(strings.TrimRight(line, "\r\n"))
	}
}

// serverLine pairs a final reply line with the command it answers.
func (c *wireConn) serverLine(line string) {
	r, err := c.reply.Add(line)
	if err == nil && r == nil {
		return // a continuation line
	}
	c.reply = smtpvocab.Parser{}
	if err != nil {
		return // not a reply: nothing to pair
	}
	if r.Code == 334 {
		c.mode = wireAuth
		return
	}
	if len(c.pending) == 0 {
		return // unsolicited (a 421 on timeout)
	}
	verb := c.pending[0]
	c.pending = c.pending[1:]
	switch {
	case verb == "DATA" && r.Code == 354:
		c.mode = wireData
	case verb == "STARTTLS" && r.Code == 220:
		c.blind = true
	}
}

func appendCapped(dst, b []byte) []byte {
	if room := maxWireLine - len(dst); room < len(b) {
		b = b[:max(room, 0)]
	}
	return append(dst, b...)
}
