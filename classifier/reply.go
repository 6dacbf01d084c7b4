package classifier

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxText bounds Verdict.Text: enough for any real reply, small enough for
// a log line, a queue record and a DSN's Diagnostic-Code.
const maxText = 512

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
	if t := flatten(r.Text); t != "" {
		s += " " + t
	}
	return s
}

// ParseReply parses a reply line such as "451 4.7.1 Greylisted" or
// "450-4.2.1 ...". It is tolerant: several lines separated by CRLF or LF are
// joined, repeated codes and enhanced codes on continuation lines
// (RFC 2034 §4) are stripped, and a missing text is fine. It fails only if
// the input does not start with a three-digit code followed by a space, a
// hyphen or the end; the returned Reply then holds the cleaned input as Text.
func ParseReply(line string) (Reply, error) {
	lines := strings.Split(strings.TrimRight(line, "\r\n"), "\n")
	code, ok := replyCode(strings.TrimRight(lines[0], "\r"))
	if !ok {
		return Reply{Text: flatten(line)}, fmt.Errorf("classifier: malformed SMTP reply %q", sanitize(line))
	}
	for i, l := range lines {
		l = strings.TrimRight(l, "\r")
		if _, ok := replyCode(l); ok {
			l = l[min(4, len(l)):]
		}
		lines[i] = l
	}
	return buildReply(code, strings.Join(lines, "\n")), nil
}

// replyCode reads the three-digit code that starts an SMTP reply line.
func replyCode(l string) (int, bool) {
	if len(l) < 3 || (len(l) > 3 && l[3] != ' ' && l[3] != '-') {
		return 0, false
	}
	for i := range 3 {
		if l[i] < '0' || l[i] > '9' {
			return 0, false
		}
	}
	n, _ := strconv.Atoi(l[:3])
	return n, true
}

// buildReply splits an enhanced code off the text of a reply whose lines
// already lost their reply codes (as textproto and go-smtp deliver them).
func buildReply(code int, msg string) Reply {
	r := Reply{Code: code}
	var out []string
	for i, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(l)
		tok, rest, _ := strings.Cut(l, " ")
		if e, ok := parseEnhanced(tok); ok && (i == 0 || fmtEnhanced(e) == r.Enhanced) {
			if i == 0 {
				r.Enhanced = fmtEnhanced(e)
			}
			l = rest
		}
		if l = flatten(l); l != "" {
			out = append(out, l)
		}
	}
	r.Text = strings.Join(out, "\n")
	return r
}

// parseEnhanced parses an RFC 3463 code: class 2, 4 or 5, then subject and
// detail of one to three digits each.
func parseEnhanced(s string) ([3]int, bool) {
	var e [3]int
	parts := strings.Split(s, ".")
	if len(parts) != 3 || (parts[0] != "2" && parts[0] != "4" && parts[0] != "5") {
		return e, false
	}
	for i, p := range parts {
		if len(p) < 1 || len(p) > 3 || strings.Trim(p, "0123456789") != "" {
			return e, false
		}
		e[i], _ = strconv.Atoi(p)
	}
	return e, true
}

func fmtEnhanced(e [3]int) string { return fmt.Sprintf("%d.%d.%d", e[0], e[1], e[2]) }

// normEnhanced returns s in canonical form ("4.07.1" is "4.7.1"), or "" if
// it is not a valid enhanced status code.
func normEnhanced(s string) string {
	if e, ok := parseEnhanced(s); ok {
		return fmtEnhanced(e)
	}
	return ""
}

// flatten makes text safe for one log or DSN line: invalid UTF-8 and control
// characters (CR, LF, NUL, ...) become spaces, and runs of space collapse.
func flatten(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return strings.Join(strings.Fields(s), " ")
}

// sanitize flattens s and cuts it to maxText bytes on a rune boundary.
func sanitize(s string) string {
	s = flatten(s)
	if len(s) <= maxText {
		return s
	}
	i := maxText
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return strings.TrimSpace(s[:i])
}
