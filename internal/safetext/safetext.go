// Package safetext makes text from outside (SMTP peers, clients, queue
// records) safe to put into a reply, a log line, a mail header field or a
// terminal, with one rule everywhere:
//
//   - A control character is a C0 control (U+0000-U+001F), DEL (U+007F) or
//     a C1 control (U+0080-U+009F). C1 controls matter as much as C0 ones:
//     U+009B is a terminal's CSI and U+0085 (NEL) a line break to some
//     readers.
//   - A bidirectional formatting character (Unicode's Bidi_Control: the
//     embeddings, overrides and isolates U+202A-U+202E and U+2066-U+2069,
//     and the marks U+200E, U+200F, U+061C) is unsafe too: it reorders
//     the text around it on display, so that a line reads differently
//     from what it holds (the "Trojan Source" trick, CVE-2021-42574), and
//     an override left open runs on into the text printed after it.
//   - Invalid UTF-8 counts as unsafe too; each invalid byte is one unsafe
//     character.
//   - Cutting to a length in octets never splits a UTF-8 sequence.
//
// Text and Writer are the terminal's form, for multi-line text (message
// content, a report): they keep line breaks and tabs.
//
// The functions are pure and allocate only when they change something.
package safetext

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// IsControl reports whether r is a C0 control, DEL or a C1 control.
func IsControl(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }

// IsBidi reports whether r is a bidirectional formatting character
// (Unicode's Bidi_Control property).
func IsBidi(r rune) bool { return r >= 0x61c && unicode.Is(unicode.Bidi_Control, r) }

// unsafe reports whether r, from ranging over a string, is a control
// character, a bidi formatting character or stands for an invalid byte.
func unsafe(r rune) bool { return r == utf8.RuneError || IsControl(r) || IsBidi(r) }

// Replace returns s with every control character, bidi formatting
// character and invalid UTF-8 byte (and U+FFFD, which stands for one)
// replaced by with. Nothing else changes.
func Replace(s string, with rune) string {
	if clean(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unsafe(r) {
			r = with
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Line returns s as one line of printable text: control characters, bidi
// formatting characters and runs of white space become one space, leading and trailing space goes,
// and each invalid UTF-8 byte becomes U+FFFD.
func Line(s string) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		if IsControl(r) || IsBidi(r) || unicode.IsSpace(r) {
			space = true
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteRune(r)
	}
	return b.String()
}

// Cut returns the longest prefix of s of at most n octets that does not
// split a UTF-8 sequence.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Escape prepares client-supplied text for a log line: it is cut to max
// octets (with "..." appended when cut), and if anything but printable
// ASCII remains, written with Go escapes (\x00, \u00e9), so that a control
// character or a look-alike is visible as such.
func Escape(s string, max int) string {
	if len(s) > max {
		s = Cut(s, max) + "..."
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			q := strconv.Quote(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}

// clean reports whether s is valid UTF-8 without control or bidi
// formatting characters.
func clean(s string) bool {
	for _, r := range s {
		if unsafe(r) {
			return false
		}
	}
	return true
}
