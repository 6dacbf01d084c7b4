package smtpd

import (
	"bytes"
	"encoding/binary"
)

// The body normaliser: the line-end, NUL and size policy described at
// the top of data.go, applied while the body is copied.

const (
	faultBareCR = "bare CR"
	faultNUL    = "NUL"
	faultSize   = "size"
)

// normalizer applies the line-end policy above while copying the body. It
// keeps reading after a fault (to stay in sync) but stops storing.
type normalizer struct {
	out       []byte
	base      int   // len of the prepended header
	max       int64 // limits.max_message_bytes, for the normalised body
	rejectCR  bool
	pendingCR bool
	eightBit  bool
	fault     string
	spilled   int64 // octets moved out of out to a spool file (bodySpill)
	last      byte  // the last octet emitted
}

// total is the size of the stored message: header and normalised body.
func (n *normalizer) total() int64 { return n.spilled + int64(len(n.out)) }

// write normalises p, a piece of the body, working on runs between the
// bytes that matter (LF, CR, NUL) rather than byte by byte. A CR at the
// end of p waits for the next piece to see whether an LF follows.
func (n *normalizer) write(p []byte) {
	if n.fault != "" {
		return // nothing more is stored, and the first fault stands
	}
	if n.pendingCR && len(p) > 0 {
		n.pendingCR = false
		if p[0] == '\n' {
			n.emit(crlf...)
			p = p[1:]
		} else {
			n.strayCR()
		}
	}
	for len(p) > 0 {
		line, rest, lf := cutLF(p)
		n.line(line, lf)
		p = rest
	}
}

var crlf = []byte("\r\n")

// cutLF splits p after its first LF: line is what comes before the LF.
func cutLF(p []byte) (line, rest []byte, lf bool) {
	if i := bytes.IndexByte(p, '\n'); i >= 0 {
		return p[:i], p[i+1:], true
	}
	return p, nil, false
}

// line handles the bytes before an LF (lf), or before the end of the
// piece: a CR right before the LF makes the CRLF, one at the end of the
// piece is pending, any other is stray; the LF, bare or not, is a CRLF.
func (n *normalizer) line(b []byte, lf bool) {
	for {
		i := bytes.IndexByte(b, '\r')
		if i < 0 {
			n.text(b)
			break
		}
		n.text(b[:i])
		b = b[i+1:]
		if len(b) == 0 {
			if !lf {
				n.pendingCR = true
			}
			break
		}
		n.strayCR()
	}
	if lf {
		n.emit(crlf...)
	}
}

// text stores b, which has no CR or LF; a NUL in it is a fault.
func (n *normalizer) text(b []byte) {
	if len(b) == 0 {
		return
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		n.text(b[:i])
		n.setFault(faultNUL)
		return
	}
	if !n.eightBit && !isASCII(b) {
		n.eightBit = true
	}
	n.emit(b...)
}

// isASCII reports whether b has no octet above 0x7f, eight at a time.
func isASCII(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b)&0x8080808080808080 != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

func (n *normalizer) strayCR() {
	if n.rejectCR {
		n.setFault(faultBareCR)
		return
	}
	n.emit(' ')
}

func (n *normalizer) emit(b ...byte) {
	if n.fault != "" {
		return
	}
	if len(b) == 0 {
		return
	}
	n.out = append(n.out, b...)
	n.last = b[len(b)-1]
	if n.total()-int64(n.base) > n.max {
		n.setFault(faultSize)
	}
}

func (n *normalizer) setFault(f string) {
	if n.fault == "" {
		n.fault = f
		n.out = n.out[:min(n.base, len(n.out))] // once spilled, the file is dropped anyway
	}
}

// finish handles a CR at the very end and makes the body end with CRLF.
func (n *normalizer) finish() {
	if n.pendingCR {
		n.pendingCR = false
		n.strayCR()
	}
	if n.total() > int64(n.base) && n.last != '\n' {
		n.emit('\r', '\n')
	}
}
