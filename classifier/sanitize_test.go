package classifier

import (
	"bufio"
	"net/textproto"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// parseReply parses a whole reply written as text, lines separated by LF
// or CRLF, the way relay/smtpclient reads one off the wire.
func parseReply(s string) (smtpvocab.Reply, error) {
	br := bufio.NewReader(strings.NewReader(strings.TrimSuffix(s, "\n") + "\n"))
	r, _, err := smtpvocab.Read(br)
	switch {
	case err != nil:
		return smtpvocab.Reply{}, err
	case br.Buffered() > 0:
		return smtpvocab.Reply{}, textproto.ProtocolError("text after the last line of a reply")
	}
	return *r, nil
}

func TestSanitize(t *testing.T) {
	long := strings.Repeat("é", 400) // 800 bytes
	cases := map[string]string{
		"a\r\nb":          "a b",
		"a\x00b\tc":       "a b c",
		"  lots   of \n ": "lots of",
		"\xffbad":         "\uFFFDbad",
		"x\u0085y":        "x y",
	}
	for in, want := range cases {
		if got := sanitize(in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
	got := sanitize(long)
	if len(got) > maxText || !utf8.ValidString(got) || len(got) < maxText-utf8.UTFMax {
		t.Errorf("sanitize(long) = %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}
