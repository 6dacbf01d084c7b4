package smtpclient

import (
	"bufio"
	"errors"
	"io"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/greyrelay/greyrelay/classifier"
)

// Limits on what we read from a peer, which may be hostile. RFC 5321 §4.5.3.1.5
// allows 512 octets per reply line; real servers exceed that in EHLO and
// error texts, so we are generous, but never unbounded: textproto.Reader's
// ReadLine would buffer an endless line, which is why replies are read here.
const (
	maxReplyLine  = 4096     // octets per line, without CRLF
	maxReplyLines = 100      // lines per reply
	maxReplyBytes = 64 << 10 // octets per reply
)

// readReply reads one possibly multi-line reply (RFC 5321 §4.2.1) and also
// returns the text of each line (after "ddd-"), which EHLO parsing needs.
// Malformed replies are textproto.ProtocolError; the classifier treats them
// as temporary.
func readReply(br *bufio.Reader) (*classifier.Reply, []string, error) {
	var lines []string
	code, total := 0, 0
	for {
		line, err := readLine(br)
		if err != nil {
			return nil, nil, err
		}
		total += len(line) + 2
		if total > maxReplyBytes || len(lines) >= maxReplyLines {
			return nil, nil, textproto.ProtocolError("reply longer than allowed")
		}
		c, final, text, err := splitLine(line)
		if err != nil {
			return nil, nil, err
		}
		if code != 0 && c != code {
			// RFC 5321 §4.2.1: every line of a reply carries the same code.
			return nil, nil, textproto.ProtocolError("inconsistent codes in multi-line reply: " + quote(line))
		}
		code = c
		lines = append(lines, text)
		if final {
			return buildReply(code, lines), lines, nil
		}
	}
}

// readLine reads one line ending in LF (CRLF expected, bare LF tolerated)
// of at most maxReplyLine octets.
func readLine(br *bufio.Reader) (string, error) {
	var buf []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(buf)+len(frag) > maxReplyLine+2 {
			return "", textproto.ProtocolError("reply line too long")
		}
		buf = append(buf, frag...)
		switch {
		case err == nil:
			s := strings.TrimSuffix(string(buf), "\n")
			return strings.TrimSuffix(s, "\r"), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > 0:
			return "", io.ErrUnexpectedEOF
		default:
			return "", err
		}
	}
}

// splitLine parses "ddd text", "ddd-text" or "ddd". Codes outside 200-599
// cannot be a reply to anything we send: 1xx is unused by SMTP and 6xx-9xx
// do not exist (RFC 5321 §4.2.1).
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
func buildReply(code int, lines []string) *classifier.Reply {
	r := &classifier.Reply{Code: code}
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
func enhancedPrefix(text string, class int) (string, bool) {
	end := strings.IndexByte(text, ' ')
	if end < 0 {
		end = len(text)
	}
	parts := strings.Split(text[:end], ".")
	if len(parts) != 3 || parts[0] != string(rune('0'+class)) {
		return "", false
	}
	for _, p := range parts[1:] {
		if len(p) < 1 || len(p) > 3 {
			return "", false
		}
		for i := range len(p) {
			if !digit(p[i]) {
				return "", false
			}
		}
	}
	return text[:end], true
}

func digit(b byte) bool { return '0' <= b && b <= '9' }

// quote shortens and quotes peer text for error messages.
func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strconv.Quote(s)
}
