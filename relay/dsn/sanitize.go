package dsn

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/greyrelay/greyrelay/internal/safetext"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

const (
	// foldAt is the RFC 5322 §2.1.1 recommended line length; generated
	// fields are folded at whitespace to stay near it.
	foldAt = 78
	// maxWord bounds a run without whitespace. Longer runs are cut into
	// pieces (unfolding then shows a space at each cut), so that no folded
	// line can reach the 998-octet limit of RFC 5322 §2.1.1.
	maxWord = 900
	// maxValue caps one outside value (a remote reply, an address), so a
	// hostile 100 kB reply cannot blow up the DSN.
	maxValue = 4000
	// truncMarker ends a value that was cut at maxValue.
	truncMarker = " [truncated]"
)

// oneLine turns outside text into one line of printable text
// (safetext.Line: every control character, C1 included, and every run of
// whitespace becomes a single space, invalid UTF-8 becomes U+FFFD), and
// with ascii set every non-ASCII character becomes '?'. The result is capped
// at maxValue octets.
func oneLine(s string, ascii bool) string {
	truncated := false
	if len(s) > 4*maxValue {
		s, truncated = s[:4*maxValue], true
	}
	out := safetext.Line(s)
	if ascii && !isASCII(out) {
		out = strings.Map(func(r rune) rune {
			if r >= utf8.RuneSelf {
				return '?'
			}
			return r
		}, out)
	}
	if truncated || len(out) > maxValue {
		out = safetext.Cut(out, maxValue-len(truncMarker)) + truncMarker
	}
	return out
}

// lines splits outside multi-line text (such as a multi-line SMTP reply)
// at CR, LF or CRLF and cleans each line with oneLine, dropping empty lines.
// The total is bounded like oneLine's.
func lines(s string) []string {
	truncated := false
	if len(s) > maxValue {
		s, truncated = safetext.Cut(s, maxValue), true
	}
	var out []string
	for _, l := range strings.FieldsFunc(s, func(r rune) bool { return r == '\r' || r == '\n' }) {
		if l = oneLine(l, false); l != "" {
			out = append(out, l)
		}
	}
	if truncated {
		out = append(out, strings.TrimSpace(truncMarker))
	}
	return out
}

// cleanAddr reduces an outside address to printable text without spaces,
// controls or enclosing angle brackets. Invalid UTF-8 becomes U+FFFD.
func cleanAddr(s string) string {
	s = strings.Join(strings.Fields(oneLine(s, false)), "")
	s = strings.TrimSuffix(strings.TrimPrefix(s, "<"), ">")
	return s
}

// cleanHost keeps only the characters of a DNS host name (letters, digits,
// "-", ".", "_"), at most 255 octets, so the name is also safe as the
// domain of the From address. Callers pass names, not address literals.
func cleanHost(s string) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < 255; i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '.' || c == '_' {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// cleanMsgID keeps the printable ASCII of a Message-ID other than angle
// brackets, at most 250 octets.
func cleanMsgID(s string) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < 250; i++ {
		if c := s[i]; c > ' ' && c < 0x7f && c != '<' && c != '>' {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// isASCII reports whether s is plain US-ASCII.
func isASCII[T string | []byte](s T) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// field renders "Name: value" with CRLF, folding between words (RFC 5322
// §2.2.3) so that lines stay near foldAt and always under 998 octets. value
// must already be one clean line (see oneLine).
func field(name, value string) string {
	var b strings.Builder
	b.WriteString(name + ":")
	n, first := len(name)+1, true
	for _, w := range strings.Fields(value) {
		for _, c := range chunks(w, maxWord) {
			if !first && n+1+len(c) > foldAt {
				b.WriteString("\r\n")
				n = 0
			}
			b.WriteString(" " + c)
			n += 1 + len(c)
			first = false
		}
	}
	b.WriteString("\r\n")
	return b.String()
}

// chunks cuts w into pieces of at most n octets at rune boundaries.
func chunks(w string, n int) []string {
	var out []string
	for len(w) > n {
		c := safetext.Cut(w, n)
		if c == "" {
			c = w[:n]
		}
		out = append(out, c)
		w = w[len(c):]
	}
	return append(out, w)
}

// typedAddr renders an address for Final-Recipient or Original-Recipient.
// ASCII addresses are "rfc822". RFC 6533 §3: a non-ASCII address is typed
// "utf-8"; in message/global-delivery-status it appears as is, in the
// ASCII-only message/delivery-status as utf-8-addr-xtext.
func typedAddr(addr string, global bool) string {
	switch {
	case isASCII(addr):
		return "rfc822; " + addr
	case global:
		return "utf-8; " + addr
	default:
		return "utf-8; " + utf8AddrXtext(addr)
	}
}

// originalRecipient renders the Original-Recipient value from an
// xtext-decoded ORCPT "addr-type;address" (RFC 3464 §2.3.1).
func originalRecipient(orcpt string, global bool) string {
	typ, addr, ok := strings.Cut(orcpt, ";")
	if !ok {
		typ, addr = "rfc822", orcpt
	}
	typ = strings.ToLower(strings.TrimSpace(typ))
	addr = cleanAddr(addr)
	if addr == "" {
		return ""
	}
	if typ == "rfc822" || typ == "utf-8" || !isToken(typ) {
		return typedAddr(addr, global)
	}
	return typ + "; " + oneLine(addr, !global)
}

// isToken reports whether s is a non-empty address-type atom.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return s != ""
}

// utf8AddrXtext encodes addr as RFC 6533 §3 utf-8-addr-xtext: printable
// ASCII other than "+", "=" and "\" stays, everything else becomes
// \x{HEXPOINT} with upper-case hex and no leading zeros (two digits
// at least).
func utf8AddrXtext(addr string) string {
	var b strings.Builder
	for _, r := range addr {
		if r > ' ' && r < 0x7f && r != '+' && r != '=' && r != '\\' {
			b.WriteRune(r)
			continue
		}
		h := strings.ToUpper(strconv.FormatInt(int64(r), 16))
		if len(h) < 2 {
			h = "0" + h
		}
		b.WriteString(`\x{` + h + `}`)
	}
	return b.String()
}

// status returns the recipient's status, or a generic one for its action
// when the given status is not a valid RFC 3463 code.
func status(rc Recipient) string {
	if s := strings.TrimSpace(rc.Status); smtpvocab.NormEnhanced(s) != "" {
		return s
	}
	switch rc.Action {
	case Failed:
		return "5.0.0"
	case Delayed:
		return "4.0.0"
	default:
		return "2.0.0"
	}
}
