package safetext

import (
	"io"
	"unicode/utf8"
)

// Mark is what Text and Writer put in place of an unsafe character.
const Mark = '?'

// Text returns multi-line s for a terminal: CRLF becomes LF, LF and tab
// stay, and every other control character (a bare CR, an escape
// sequence's ESC, the C1 CSI U+009B), every bidi formatting character and
// every invalid UTF-8 byte becomes Mark. A U+FFFD in s stays: unlike
// Replace, Text tells it from an invalid byte.
func Text(s string) string {
	if textClean(s) {
		return s
	}
	out, _ := text(make([]byte, 0, len(s)), []byte(s), true)
	return string(out)
}

// Writer applies Text to a stream: what it has written to its underlying
// writer after Flush is Text of everything written to it, however the
// writes were cut. A CR or an incomplete UTF-8 sequence at the end of one
// Write waits for the next one, or for Flush.
type Writer struct {
	w    io.Writer
	held []byte // the incomplete tail of the last Write: a CR or a UTF-8 sequence's start
	out  []byte
}

// NewWriter returns a Writer that writes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes Text of p to the underlying writer, holding back an
// incomplete tail (at most 3 octets).
func (w *Writer) Write(p []byte) (int, error) {
	src := p
	if len(w.held) > 0 {
		src = append(w.held, p...)
	}
	var rest []byte
	w.out, rest = text(w.out[:0], src, false)
	w.held = append(w.held[:0:0], rest...)
	if _, err := w.w.Write(w.out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what the last Write held back: a lone CR or an incomplete
// UTF-8 sequence, as Mark.
func (w *Writer) Flush() error {
	if len(w.held) == 0 {
		return nil
	}
	out, _ := text(nil, w.held, true)
	w.held = w.held[:0]
	_, err := w.w.Write(out)
	return err
}

// text appends Text of src to dst. Unless final, it stops before an
// incomplete tail (a CR that may begin a CRLF, the start of a UTF-8
// sequence) and returns it as rest.
func text(dst, src []byte, final bool) (out, rest []byte) {
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\r' && i+1 == len(src) && !final:
			return dst, src[i:]
		case c == '\r' && i+1 < len(src) && src[i+1] == '\n':
			dst = append(dst, '\n')
			i += 2
			continue
		case c == '\n' || c == '\t':
			dst = append(dst, c)
			i++
			continue
		case c < utf8.RuneSelf:
			if IsControl(rune(c)) {
				c = Mark
			}
			dst = append(dst, c)
			i++
			continue
		case !final && !utf8.FullRune(src[i:]):
			return dst, src[i:]
		}
		r, n := utf8.DecodeRune(src[i:])
		if r == utf8.RuneError && n == 1 || IsControl(r) || IsBidi(r) {
			dst = append(dst, Mark)
		} else {
			dst = append(dst, src[i:i+n]...)
		}
		i += n
	}
	return dst, nil
}

// textClean reports whether Text leaves s as it is.
func textClean(s string) bool {
	for i, r := range s {
		switch {
		case r == '\n' || r == '\t':
		case r == utf8.RuneError:
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				return false
			}
		case IsControl(r) || IsBidi(r):
			return false
		}
	}
	return true
}
