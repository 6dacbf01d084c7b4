package dsn

import (
	"fmt"
	"unicode/utf8"

	"github.com/greyrelay/greyrelay/internal/safetext"
)

// wrapAt is where over-long lines of the returned original are broken, well
// below the 998-octet limit of RFC 5322 §2.1.1 (a header continuation adds
// one leading space).
const wrapAt = 990

// returnedPart builds the third part (the original message or its headers,
// RFC 3464 §2 and RFC 3461 §4.3) and the sentence that tells the sender what
// it contains. It returns nil when there is no original.
func returnedPart(r Report) (*part, string) {
	if len(r.Original) == 0 {
		return nil, ""
	}
	ascii := !r.UTF8
	hdr, rest := splitHeader(r.Original, ascii)
	note := "The headers of your message are attached."
	if r.Return == ReturnFull {
		limit := r.MaxReturned
		if limit <= 0 {
			limit = DefaultMaxReturned
		}
		switch size := len(r.Original); {
		case size > limit:
			note = fmt.Sprintf("Your message (%d bytes) is larger than the %d-byte limit "+
				"for returned messages, so only its headers are attached.", size, limit)
		case ascii && !isASCII(rest):
			// RFC 2046 §5.2.1: message/rfc822 cannot be re-encoded, and this
			// DSN must stay 7-bit.
			note = "Your message contains 8-bit data that this notice cannot carry, " +
				"so only its headers are attached."
		default:
			return fullPart(hdr, rest, r.UTF8), "Your message is attached."
		}
	}
	p := part{body: hdr}
	if r.UTF8 {
		// RFC 6533 §6.3: headers that may hold UTF-8.
		p.header = "Content-Type: message/global-headers\r\n" + eightBit(hdr)
	} else {
		// RFC 6522 §4.
		p.header = "Content-Type: text/rfc822-headers\r\n"
	}
	p.header += "Content-Description: Headers of the original message\r\n"
	return &p, note
}

// fullPart returns the whole original as message/rfc822, or message/global
// for an SMTPUTF8 message (RFC 6532 §3.7; RFC 6533 §4 uses it for returns).
func fullPart(hdr, rest []byte, utf8 bool) *part {
	body := append(append([]byte{}, hdr...), "\r\n"...)
	for _, l := range splitLines(rest) {
		body = appendWrapped(body, cleanBody(l), "")
	}
	p := part{body: body, header: "Content-Type: message/rfc822\r\n"}
	if utf8 {
		p.header = "Content-Type: message/global\r\n" + eightBit(body)
	}
	p.header += "Content-Description: The original message\r\n"
	return &p
}

// splitHeader returns the original's header block, normalised (see
// cleanHeader) with CRLF line ends, and the raw remainder after the blank
// line that ends it. A message without a blank line is all header.
func splitHeader(raw []byte, ascii bool) (hdr, rest []byte) {
	for len(raw) > 0 {
		line, next := nextLine(raw)
		raw = next
		if len(line) == 0 {
			return hdr, raw
		}
		hdr = appendWrapped(hdr, cleanHeader(line, ascii), " ")
	}
	return hdr, nil
}

// splitLines splits raw at CRLF, bare CR or bare LF, the way Postfix's
// cleanup_replace_stray_cr_lf treats stray line ends.
func splitLines(raw []byte) [][]byte {
	var out [][]byte
	for len(raw) > 0 {
		var line []byte
		line, raw = nextLine(raw)
		out = append(out, line)
	}
	return out
}

// nextLine cuts the first line off raw; CRLF, a bare CR and a bare LF all
// end a line.
func nextLine(raw []byte) (line, rest []byte) {
	for i, c := range raw {
		switch c {
		case '\n':
			return raw[:i], raw[i+1:]
		case '\r':
			if i+1 < len(raw) && raw[i+1] == '\n' {
				return raw[:i], raw[i+2:]
			}
			return raw[:i], raw[i+1:]
		}
	}
	return raw, nil
}

// cleanHeader makes one returned header line safe: safetext.Text (control
// characters other than TAB, C1 and NUL included, bidi formatting
// characters and invalid UTF-8 become '?'), and in an ASCII DSN every
// other non-ASCII character too, one '?' each.
func cleanHeader(line []byte, ascii bool) []byte {
	s := safetext.Text(string(line)) // a split line holds no CR or LF
	if !ascii {
		return []byte(s)
	}
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r >= utf8.RuneSelf {
			r = '?'
		}
		out = utf8.AppendRune(out, r)
	}
	return out
}

// cleanBody replaces NUL, which no transfer encoding of a returned body may
// carry (RFC 2045 §2.7, §2.8), with '?'.
func cleanBody(line []byte) []byte {
	out := make([]byte, len(line))
	for i, c := range line {
		if c == 0 {
			c = '?'
		}
		out[i] = c
	}
	return out
}

// appendWrapped appends line and CRLF to dst, breaking it (at rune
// boundaries) into pieces of at most wrapAt octets; each continuation
// starts with cont (" " turns the break into a header fold).
func appendWrapped(dst, line []byte, cont string) []byte {
	for len(line) > wrapAt {
		cut := wrapAt
		for cut > wrapAt-4 && !utf8.RuneStart(line[cut]) {
			cut--
		}
		dst = append(dst, line[:cut]...)
		dst = append(dst, "\r\n"+cont...)
		line = line[cut:]
	}
	dst = append(dst, line...)
	return append(dst, "\r\n"...)
}
