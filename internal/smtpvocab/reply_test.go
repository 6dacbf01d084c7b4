package smtpvocab

import (
	"net/textproto"
	"strings"
	"testing"
)

// ParseReply parses a whole reply written as text, lines separated by LF
// or CRLF, with Parser, as Read does when it reads one.
func ParseReply(s string) (Reply, error) {
	var p Parser
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for i, l := range lines {
		r, err := p.Add(strings.TrimSuffix(l, "\r"))
		switch {
		case err != nil:
			return Reply{}, err
		case r != nil && i == len(lines)-1:
			return *r, nil
		case r != nil:
			return Reply{}, textproto.ProtocolError("text after the last line of a reply")
		}
	}
	return Reply{}, textproto.ProtocolError("reply without a last line")
}

func TestParseReply(t *testing.T) {
	cases := []struct {
		in   string
		want Reply
	}{
		{"451 4.7.1 Greylisted", Reply{451, "4.7.1", "Greylisted"}},
		{"451 4.7.1 Greylisted\r\n", Reply{451, "4.7.1", "Greylisted"}},
		{"450-4.2.1 first\r\n450-4.2.1 second\r\n450 4.2.1 third", Reply{450, "4.2.1", "first\nsecond\nthird"}},
		{"550-5.1.1 a\n550 b", Reply{550, "5.1.1", "a\nb"}},
		{"421", Reply{421, "", ""}},
		{"421 ", Reply{421, "", ""}},
		{"554 Transaction failed", Reply{554, "", "Transaction failed"}},
		{"451 4.07.001 odd but valid", Reply{451, "4.07.001", "odd but valid"}}, // normalised by Classify
		{"451 4.7 not an enhanced code", Reply{451, "", "4.7 not an enhanced code"}},
		{"451 6.7.1 not a class", Reply{451, "", "6.7.1 not a class"}},
		{"451 4.7.1", Reply{451, "4.7.1", ""}},
		// The text is kept as sent; Error and Classify sanitise it.
		{"451 4.7.1 tab\there\x00nul", Reply{451, "4.7.1", "tab\there\x00nul"}},
		{"450 4.7.1 bad \xff utf8", Reply{450, "4.7.1", "bad \xff utf8"}},
		// A stray CR before CRLF is not text, or the joined lines would hold a CRLF.
		{"450-\r\r\n450 x\r", Reply{450, "", "\nx"}},
		{"450-a\rb\r\n450 c", Reply{450, "", "a\rb\nc"}},
	}
	for _, tc := range cases {
		got, err := ParseReply(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseReply(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseReply_Malformed(t *testing.T) {
	for _, in := range []string{"", "\r\n", "45", "4510 x", "abc def", "hello world", "ESMTP ready", " 451 x", "45a x",
		"421-", "999 odd code", "199 x", "450-a\r\n451 b", "250 a\r\n250 b"} {
		r, err := ParseReply(in)
		if err == nil {
			t.Errorf("ParseReply(%q) = %+v, want error", in, r)
		}
		if r.Code != 0 || strings.ContainsAny(r.Text, "\r\n\x00") {
			t.Errorf("ParseReply(%q) on error returned %+v", in, r)
		}
	}
}

func TestReply_Error(t *testing.T) {
	cases := map[string]Reply{
		"451 4.7.1 Try again later": {451, "4.7.1", "Try again later"},
		"550 No such user":          {550, "", "No such user"},
		"421":                       {421, "", ""},
		"450 4.2.1 one two":         {450, "4.2.1", "one\ntwo"},
		"451 a b":                   {451, "", "a\r\nb\x00"},
	}
	for want, r := range cases {
		if got := r.Error(); got != want {
			t.Errorf("%+v.Error() = %q, want %q", r, got, want)
		}
	}
}
