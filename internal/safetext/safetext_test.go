package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestIsControl(t *testing.T) {
	for r, want := range map[rune]bool{0: true, '\t': true, '\n': true, 0x1f: true, ' ': false, '~': false,
		0x7f: true, 0x80: true, 0x85: true, 0x9b: true, 0x9f: true, 0xa0: false, 'é': false, 0xfffd: false} {
		if got := IsControl(r); got != want {
			t.Errorf("IsControl(%U) = %v, want %v", r, got, want)
		}
	}
}

func TestIsBidi(t *testing.T) {
	for r, want := range map[rune]bool{0x61c: true, 0x200e: true, 0x200f: true, 0x202a: true, 0x202e: true,
		0x2066: true, 0x2069: true, 0x2029: false, 0x202f: false, 0x2065: false, 0x5d0: false, 'a': false, 0x9b: false} {
		if got := IsBidi(r); got != want {
			t.Errorf("IsBidi(%U) = %v, want %v", r, got, want)
		}
	}
}

func TestReplace(t *testing.T) {
	cases := map[string]string{
		"plain é text":      "plain é text",
		"a\r\nb\x00c":       "a??b?c",
		"csi \u009b31m":     "csi ?31m",
		"bad \xff\xfe":      "bad ??",
		"nbsp\u00a0ok":      "nbsp\u00a0ok",
		"ff \ufffd":         "ff ?",
		"rlo \u202egpj.exe": "rlo ?gpj.exe",
		"lri \u2066x\u2069": "lri ?x?",
	}
	for in, want := range cases {
		if got := Replace(in, '?'); got != want {
			t.Errorf("Replace(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLine(t *testing.T) {
	cases := map[string]string{
		"a\r\nb":          "a b",
		"a\x00b\tc":       "a b c",
		"  lots   of \n ": "lots of",
		"\xffbad":         "\uFFFDbad",
		"x\u0085y":        "x y",
		"x\u009by":        "x y",
		"nbsp\u00a0x":     "nbsp x",
		"x\u202ey":        "x y",
		"x\u200fy":        "x y",
		"":                "",
	}
	for in, want := range cases {
		if got := Line(in); got != want {
			t.Errorf("Line(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCut(t *testing.T) {
	cases := []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"}, {"abc", 2, "ab"}, {"aé", 2, "a"}, {"aé", 3, "aé"}, {"é", 0, ""},
	}
	for _, tc := range cases {
		if got := Cut(tc.in, tc.n); got != tc.want {
			t.Errorf("Cut(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestEscape(t *testing.T) {
	cases := []struct {
		in   string
		max  int
		want string
	}{
		{"user@example.org", 512, "user@example.org"},
		{"a\r\nb", 512, `a\r\nb`},
		{"é", 512, `é`}, // strconv.Quote keeps printable Unicode
		{"x\u009by", 512, `x\u009by`},
		{"abcdé", 4, "abcd..."},
		{"abcé", 4, "abc..."},
	}
	for _, tc := range cases {
		if got := Escape(tc.in, tc.max); got != tc.want {
			t.Errorf("Escape(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
}

// FuzzLine: whatever comes in, Line, Replace and Cut give valid UTF-8
// without control characters, and Cut never grows or splits a rune.
func FuzzLine(f *testing.F) {
	for _, s := range []string{"a\r\nb", "\xff", "\u009b", " x ", "é"} {
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		for _, out := range []string{Line(s), Replace(s, ' ')} {
			if !utf8.ValidString(out) || strings.ContainsFunc(out, IsControl) || strings.ContainsFunc(out, IsBidi) {
				t.Fatalf("unsafe output %q for %q", out, s)
			}
		}
		if strings.Contains(Line(s), "  ") {
			t.Fatalf("Line(%q) has a run of spaces", s)
		}
		if n < 0 {
			return
		}
		c := Cut(s, n)
		if len(c) > n || !strings.HasPrefix(s, c) || (utf8.ValidString(s) && !utf8.ValidString(c)) {
			t.Fatalf("Cut(%q, %d) = %q", s, n, c)
		}
		e := Escape(s, n)
		if strings.ContainsFunc(e, IsControl) {
			t.Fatalf("Escape(%q) = %q", s, e)
		}
	})
}
