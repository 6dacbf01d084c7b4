package smtpvocab

import (
	"fmt"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/greyrelay/greyrelay/internal/safetext"
)

// Reply is an SMTP reply as received from a peer. It implements error so
// that an SMTP client can return it as is.
type Reply struct {
	Code     int    // three-digit reply code (RFC 5321 §4.2)
	Enhanced string // RFC 3463 code such as "4.7.1", or "" if none was sent
	Text     string // text without code or enhanced prefixes; lines joined by "\n"
}

// Error renders the reply on one line: "451 4.7.1 text".
func (r *Reply) Error() string {
	s := fmt.Sprintf("%03d", r.Code)
	if r.Enhanced != "" {
		s += " " + r.Enhanced
	}
	if t := safetext.Line(r.Text); t != "" {
		s += " " + t
	}
	return s
}

// Parser parses one SMTP reply a line at a time (RFC 5321 §4.2.1),
// without reading anything itself: the caller reads lines (with CRLF or LF
// removed) under its own limits and hands them to Add. The zero value is
// ready for one reply.
//
// It is strict: every line is "ddd text", "ddd-text" or "ddd"; every line of
// a reply carries the same code; codes outside 200-599 cannot be a reply to
// anything a client sends (1xx is unused by SMTP, 6xx-9xx do not exist).
// Malformed input is a textproto.ProtocolError. The text is returned as the
// peer sent it.
type Parser struct {
	code  int
	lines []string
}

// Add parses the next line. It returns the reply when line was the last one
// (a space after the code, or nothing), and nil while more lines follow.
func (p *Parser) Add(line string) (*Reply, error) {
	code, final, text, err := splitLine(line)
	if err != nil {
		return nil, err
	}
	if p.code != 0 && code != p.code {
		// RFC 5321 §4.2.1: every line of a reply carries the same code.
		return nil, textproto.ProtocolError("inconsistent codes in multi-line reply: " + quote(line))
	}
	p.code = code
	// A CR left before the line end (a peer that sent CR CR LF) is line
	// ending, not text: kept, it would make the joined text carry a CRLF.
	p.lines = append(p.lines, strings.TrimRight(text, "\r"))
	if !final {
		return nil, nil
	}
	return buildReply(code, p.lines), nil
}

// Lines returns the text of each line added so far (after "ddd-" or
// "ddd "), which EHLO parsing needs.
func (p *Parser) Lines() []string { return p.lines }

// splitLine parses "ddd text", "ddd-text" or "ddd".
func splitLine(line string) (code int, final bool, text string, err error) {
	if len(line) < 3 || !digit(line[0]) || !digit(line[1]) || !digit(line[2]) {
		return 0, false, "", textproto.ProtocolError("malformed reply: " + quote(line))
	}
	code = int(line[0]-'0')*100 + int(line[1]-'0')*10 + int(line[2]-'0')
	if code < 200 || code > 599 {
		return 0, false, "", textproto.ProtocolError("invalid reply code: " + quote(line))
	}
	if len(line) == 3 {
		return code, true, "", nil
	}
	switch line[3] {
	case ' ':
		return code, true, line[4:], nil
	case '-':
		return code, false, line[4:], nil
	}
	return 0, false, "", textproto.ProtocolError("malformed reply: " + quote(line))
}

// buildReply joins the lines and extracts the enhanced status code.
//
// RFC 2034 §3 lets a client rely on enhanced codes only when the server
// advertised ENHANCEDSTATUSCODES, but greetings and EHLO replies arrive
// before we know, and many servers send them regardless. So we take one
// whenever the first line starts with a well-formed x.y.z whose class
// matches the reply code's first digit; text that merely looks like one in
// another class (e.g. "250 1.2.3.4 accepted") is left alone. The code is
// stripped from every line that repeats it (RFC 2034 §4).
func buildReply(code int, lines []string) *Reply {
	r := &Reply{Code: code}
	if enh, ok := enhancedPrefix(lines[0], code/100); ok {
		r.Enhanced = enh
		out := make([]string, len(lines))
		for i, l := range lines {
			if e, ok := enhancedPrefix(l, code/100); ok && e == enh {
				l = strings.TrimPrefix(l[len(e):], " ")
			}
			out[i] = l
		}
		lines = out
	}
	r.Text = strings.Join(lines, "\n")
	return r
}

// enhancedPrefix returns the RFC 3463 code "class.subject.detail" that
// starts text, if any: class is one digit, subject and detail 1-3 digits.
// It is read once per reply a delivery gets, so it cuts rather than
// splits: no allocation.
func enhancedPrefix(text string, class int) (string, bool) {
	tok, _, _ := strings.Cut(text, " ")
	head, rest, ok := strings.Cut(tok, ".")
	if !ok || head != string(rune('0'+class)) {
		return "", false
	}
	subject, detail, ok := strings.Cut(rest, ".")
	if !ok || !codeNumber(subject) || !codeNumber(detail) {
		return "", false
	}
	return tok, true
}

// codeNumber reports whether s is 1-3 digits (RFC 3463 §2).
func codeNumber(s string) bool {
	if len(s) < 1 || len(s) > 3 {
		return false
	}
	for i := range len(s) {
		if !digit(s[i]) {
			return false
		}
	}
	return true
}

func digit(b byte) bool { return '0' <= b && b <= '9' }

// quote shortens and quotes peer text for error messages.
func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strconv.Quote(s)
}
