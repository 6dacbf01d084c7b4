package smtpd

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Line lengths.
//
// RFC 5321 §4.5.3.1.6 lets a server refuse text lines over 1000 octets,
// but mail with longer lines exists (HTML written on one line by
// applications), and a 5xx for it is a permanent failure for a message
// nothing is wrong with. Like Postfix, greyrelay takes body lines of any
// length up to the message size limit, stores them unchanged and folds
// them when sending (delivery.line_length_limit). Commands keep a strict
// limit: a command line longer than maxLineLength octets (CRLF included)
// gets "500 5.4.0 Too long line, closing connection" and the connection
// closes, without a reset that could destroy the reply (lingerClose).
//
// go-smtp applies one MaxLineLength to commands and DATA lines alike, so
// the server gives it the message size limit and the connection applies
// the command limit itself, where it sees the client's octets:
//
//   - In plaintext it follows the stream (lineFramer): command lines are
//     measured; a DATA body (from the moment Data starts reading to its
//     CRLF.CRLF) is not, nor are the octets of a BDAT chunk (the size
//     named by a BDAT command that go-smtp will read the chunk for).
//   - Under TLS (after a STARTTLS command, or on a submissions listener) it
//     sees only ciphertext. It then bounds, instead, the octets read while
//     one command is being read and no DATA body is (less what a BDAT
//     chunk hands to Data): maxTLSCommandBytes, a memory bound for go-smtp's
//     line buffer rather than an exact line length. A BDAT chunk that
//     go-smtp reads only to drop it (a BDAT refused with 502 or 552) counts
//     as command octets there: past maxTLSCommandBytes the client gets the
//     500 and the close instead of that reply.
//
// When the limit is passed in a later read than the one that began the
// line (always likely under TLS, whose bound is large), go-smtp's reader
// hands over the part already read as if it were a whole line before it
// sees the error (conn.cutShort). MAIL, RCPT, AUTH and DATA check for
// that and answer it with the 500 alone. What go-smtp answers without
// asking the session (NOOP, HELP, VRFY, RSET, QUIT, and a MAIL or RCPT
// whose cut arguments it cannot parse) gets its own reply to the cut line
// first, then the 500: an extra line, and nothing taken or changed that
// the 500 and the close do not undo.

// maxLineLength is the longest command line, CRLF included: go-smtp's
// default MaxLineLength. RFC 5321 §4.5.3.1.4 allows 512 octets; RFC 4954
// §4 asks for 12288-octet AUTH lines, but only mechanisms with large
// tokens (GSSAPI) need them: we offer PLAIN and LOGIN, whose responses are
// at most a few hundred octets (bcrypt reads at most 72 octets of
// password).
const maxLineLength = 2000

// maxTLSCommandBytes bounds the octets read for one command under TLS: a
// few TLS records (16 KiB each) of pipelined commands, or the part of a
// BDAT chunk read before Data starts taking it.
const maxTLSCommandBytes = 256 << 10

// lingerTime and lingerBytes bound the draining of what the client still
// sends after an over-long line: a close with unread input makes the
// kernel send a reset, which may destroy the 500 on its way.
const (
	lingerTime  = 2 * time.Second
	lingerBytes = 1 << 20
)

// maxHead is how much of a command line the framer keeps to recognise
// BDAT and STARTTLS.
const maxHead = 128

// lineFramer follows the plaintext command stream. The zero value is in
// the command state, at the start of a line.
type lineFramer struct {
	tls      bool // TLS (or its handshake) carries the stream: count instead
	lineLen  int  // octets of the current command line so far
	head     []byte
	skip     int64 // octets of a BDAT chunk still to come
	body     bool  // in a DATA body (set by beginBody, cleared at its end)
	bstate   int   // where the body's scan is in go-smtp's end-of-data state machine
	tlsBytes int64 // under TLS: octets read for the current command
	// ended counts the command lines completed in plaintext, and lastData
	// says whether the last one may have been DATA: with the commands
	// go-smtp has read (conn.reads) they tell whether go-smtp's own
	// buffer holds anything (conn.fastBody).
	ended    int
	lastData bool
}

// beginBody is called when Data starts reading a DATA body: the body is
// not measured until its CRLF.CRLF (RFC 5321 §4.1.1.4; go-smtp's dataReader
// starts at the beginning of a line, so ".\r\n" at once ends it too).
func (f *lineFramer) beginBody() {
	f.body = true
	f.bstate = stateBeginLine
}

// commandStarted is called when go-smtp starts reading a command line.
func (f *lineFramer) commandStarted() { f.tlsBytes = 0 }

// dataTaken is called with the octets Data took from the client. Under
// TLS they were counted as read for the current command (a BDAT chunk is
// read while its command is); they are taken off again, with an eighth
// more for the TLS records' own octets (22 to 29 per record, which even
// small records of a kilobyte keep under 3%). commandStarted clears the
// credit before the next command is read.
func (f *lineFramer) dataTaken(n int) { f.tlsBytes -= int64(n) + int64(n)/8 }

// scan follows p, the octets just read, and reports false when a command
// line is too long (under TLS: when the command took too many octets).
func (f *lineFramer) scan(p []byte) bool {
	for len(p) > 0 {
		switch {
		case f.tls:
			if !f.body {
				f.tlsBytes += int64(len(p))
			}
			return f.tlsBytes <= maxTLSCommandBytes
		case f.skip > 0:
			k := int(min(int64(len(p)), f.skip))
			f.skip -= int64(k)
			p = p[k:]
		case f.body:
			p = f.scanBody(p)
		default:
			var ok bool
			if p, ok = f.scanCommand(p); !ok {
				return false
			}
		}
	}
	return true
}

// scanBody follows the body through go-smtp's own end-of-data state
// machine (the one bodyReader.unstuff runs) and returns what follows the
// end (nothing while the body goes on). A literal search for CRLF.CRLF
// would disagree with go-smtp where a bare CR comes before it: go-smtp
// takes "\r\r\n.\r\n" as body, so the framer would measure the rest of
// the body as a command line and cut the session off with 500.
func (f *lineFramer) scanBody(p []byte) []byte {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch f.bstate {
		case stateData:
			// Inside a line nothing changes before the next CR.
			k := bytes.IndexByte(p[i:], '\r')
			if k < 0 {
				return nil
			}
			i += k
			f.bstate = stateCR
		case stateBeginLine:
			switch c {
			case '.':
				f.bstate = stateDot
			case '\r':
				f.bstate = stateCR
			default:
				f.bstate = stateData
			}
		case stateDot:
			f.bstate = stateData
			if c == '\r' {
				f.bstate = stateDotCR
			}
		case stateDotCR:
			f.bstate = stateData
			if c == '\n' {
				f.body = false
				return p[i+1:]
			}
		case stateCR:
			f.bstate = stateData
			if c == '\n' {
				f.bstate = stateBeginLine
			}
		}
	}
	return nil
}

// scanCommand measures the command line p continues; at its end it looks
// at what the line was and returns the octets after it.
func (f *lineFramer) scanCommand(p []byte) ([]byte, bool) {
	i := bytes.IndexByte(p, '\n')
	seg := p
	if i >= 0 {
		seg = p[:i+1]
	}
	f.lineLen += len(seg)
	if f.lineLen > maxLineLength {
		return nil, false
	}
	if room := maxHead - len(f.head); room > 0 {
		f.head = append(f.head, seg[:min(room, len(seg))]...)
	}
	if i < 0 {
		return nil, true
	}
	f.lineEnded()
	return p[i+1:], true
}

// lineEnded acts on the command line just completed, as go-smtp will read
// it: a BDAT command is followed by its chunk, and after STARTTLS the
// stream is TLS (if go-smtp refuses STARTTLS the framer still counts:
// it cannot know).
func (f *lineFramer) lineEnded() {
	head := f.head
	f.lineLen, f.head = 0, f.head[:0]
	f.ended++
	f.lastData = startsLike(head, "DATA")
	if !startsLike(head, "STARTTLS") && !startsLike(head, "BDAT") {
		return // the common case, without a copy of the line
	}
	line := strings.TrimRight(string(head), "\r\n")
	if strings.HasPrefix(strings.ToUpper(line), "STARTTLS") {
		f.tls = true
		return
	}
	if n, ok := bdatSize(line); ok {
		f.skip = n
	}
}

// startsLike reports whether line may start with the upper-case ASCII
// verb as go-smtp reads it (strings.ToUpper): an ASCII prefix equal but
// for case, or any non-ASCII byte within it, since upper-casing maps some
// non-ASCII letters to ASCII ones (U+017F to S, U+212A to K).
func startsLike(line []byte, verb string) bool {
	for i := range min(len(line), len(verb)) {
		c := line[i]
		if c >= utf8.RuneSelf {
			return true
		}
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != verb[i] {
			return false
		}
	}
	return len(line) >= len(verb)
}

// bdatSize parses a BDAT command line exactly as go-smtp v0.26 does
// (parseCmd and handleBdat): when it parses, go-smtp reads the chunk that
// follows, even when it refuses the command (RFC 3030 §2).
func bdatSize(line string) (int64, bool) {
	if len(line) < 6 || !strings.EqualFold(line[:4], "BDAT") || line[4] != ' ' {
		return 0, false
	}
	args := strings.Fields(strings.TrimSpace(line[5:]))
	if len(args) == 0 || len(args) > 2 || len(args) == 2 && !strings.EqualFold(args[1], "LAST") {
		return 0, false
	}
	n, err := strconv.ParseUint(args[0], 10, 32)
	if err != nil {
		return 0, false
	}
	return int64(n), true
}

// lingerClose half-closes the connection and reads what the client still
// sends, within lingerTime and lingerBytes, so the reply already written
// reaches it: closing a socket with unread input sends a reset instead of
// a FIN, and the client's system may then drop the reply unread.
func (c *conn) lingerClose() {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.Conn.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, c.Conn, lingerBytes)
}

// strayCRToSpace returns b with every CR not followed by LF made a space
// (a copy, if there is one). go-smtp echoes the first four octets of an
// unknown command in its 500 reply ("Syntax errors, X command
// unrecognized"), and RFC 5321 §2.3.8 allows no bare CR in a reply. The
// connection applies it to what it writes in plaintext; under TLS it sees
// only ciphertext, and such an echo goes out as go-smtp wrote it.
func strayCRToSpace(b []byte) []byte {
	copied := false
	for i := 0; ; i++ {
		k := bytes.IndexByte(b[i:], '\r')
		if k < 0 {
			return b
		}
		i += k
		if i+1 < len(b) && b[i+1] == '\n' {
			continue
		}
		if !copied {
			b, copied = bytes.Clone(b), true
		}
		b[i] = ' '
	}
}
