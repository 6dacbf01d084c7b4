package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestText(t *testing.T) {
	cases := map[string]string{
		"plain\n\ttext é ü\ufffd": "plain\n\ttext é ü\ufffd",
		"a\r\nb\rc\r":             "a\nb?c?",
		"\x1b[2J\x08x\x7f\n":      "?[2J?x?\n",
		"csi \u009b31m nel\u0085": "csi ?31m nel?",
		"nbsp\u00a0ok":            "nbsp\u00a0ok",
		"bad \xff\xc2 \xe2\x80":   "bad ?? ??",
		"rlo \u202egpj.exe\u202c": "rlo ?gpj.exe?",
		"isolate \u2067x\u2069":   "isolate ?x?",
		"":                        "",
	}
	for in, want := range cases {
		if got := Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestWriter: Writer streams Text, whatever the cut between writes (a
// CRLF, a C1 control's two octets or a bidi override's three split
// across two writes).
func TestWriter(t *testing.T) {
	tests := []struct {
		writes []string
		want   string
	}{
		{[]string{"a\r", "\nb\r", "c\x7f\td\r"}, "a\nb?c?\td?"},
		{[]string{"\x1b[2J\x08x\n"}, "?[2J?x\n"},
		{[]string{"csi \xc2", "\x9b31m é \xc2\xa0"}, "csi ?31m é \xc2\xa0"}, // C1 CSI; é and NBSP stay
		{[]string{"rlo \xe2\x80", "\xaeexe"}, "rlo ?exe"},
		{[]string{"end \xc2"}, "end ?"}, // an incomplete sequence at the end is one invalid octet
		{[]string{"\r\r\n"}, "?\n"},
		{[]string{"\r", "", "\n"}, "\n"},
	}
	for _, tc := range tests {
		var out strings.Builder
		w := NewWriter(&out)
		for _, p := range tc.writes {
			if n, err := w.Write([]byte(p)); n != len(p) || err != nil {
				t.Fatalf("Write: %d, %v", n, err)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("%q: got %q, want %q", tc.writes, out.String(), tc.want)
		}
		if all := strings.Join(tc.writes, ""); Text(all) != tc.want {
			t.Errorf("Text(%q) = %q, Writer gave %q", all, Text(all), tc.want)
		}
	}
}

// FuzzText: Text's output is valid UTF-8 with no control character but LF
// and tab and no bidi formatting character; it keeps safe text as it is;
// and Writer gives the same, however the input is cut.
func FuzzText(f *testing.F) {
	for _, s := range []string{"a\r\nb", "\xff", "\u009b", "\u202e", "é\tx\n", "\xe2\x80"} {
		f.Add(s, 1)
	}
	f.Fuzz(func(t *testing.T, s string, cut int) {
		out := Text(s)
		if !utf8.ValidString(out) || strings.ContainsFunc(out, func(r rune) bool {
			return r != '\n' && r != '\t' && IsControl(r) || IsBidi(r)
		}) {
			t.Fatalf("Text(%q) = %q: unsafe", s, out)
		}
		if textClean(s) && out != s {
			t.Fatalf("Text(%q) = %q changed safe text", s, out)
		}
		if cut < 0 || cut > len(s) {
			return
		}
		var b strings.Builder
		w := NewWriter(&b)
		w.Write([]byte(s[:cut]))
		w.Write([]byte(s[cut:]))
		if err := w.Flush(); err != nil || b.String() != out {
			t.Fatalf("Writer(%q | %q) = %q, Text %q", s[:cut], s[cut:], b.String(), out)
		}
	})
}
