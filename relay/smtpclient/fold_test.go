package smtpclient

import (
	"bytes"
	"strings"
	"testing"
)

// TestEncodeBody_Fold: with a line length limit, longer lines are broken
// by CRLF SP as Postfix's smtp_line_length_limit does, so no line on the
// wire is longer than the limit; shorter lines are untouched.
func TestEncodeBody_Fold(t *testing.T) {
	tests := []struct {
		in, want string
		fold     int
	}{
		{"abcde\r\n", "abcde\r\n.\r\n", 5},
		{"abcdef", "abcde\r\n f\r\n.\r\n", 5},
		{"abcdefghij\r\nk\r\n", "abcde\r\n fghi\r\n j\r\nk\r\n.\r\n", 5},
		{".bcdefgh\r\n", "..bcde\r\n fgh\r\n.\r\n", 5}, // the stuffed "." does not count
		{"abcd\re\rf\n", "abcd \r\n e f\r\n.\r\n", 5},  // a stray CR is a space
		{"abcdefghij\r\n", "abcdefghij\r\n.\r\n", 0},
		{"abcdefghij\r\n", "abcdefghij\r\n.\r\n", 1},
	}
	for _, tt := range tests {
		if got := string(encodeFolded([]byte(tt.in), tt.fold)); got != tt.want {
			t.Errorf("fold %d: encodeBody(%q) = %q, want %q", tt.fold, tt.in, got, tt.want)
		}
	}
	// The 2,100-octet HTML line: three lines of at most 998 octets.
	line := strings.Repeat("h", 2100)
	out := string(encodeFolded([]byte("Subject: x\r\n\r\n"+line+"\r\n"), 998))
	want := "Subject: x\r\n\r\n" + line[:998] + "\r\n " + line[998:1995] + "\r\n " + line[1995:] + "\r\n.\r\n"
	if out != want {
		t.Errorf("2100-octet line folded as %q", out)
	}
}

func encodeFolded(body []byte, fold int) []byte {
	enc := newBodyEncoder(body)
	enc.fold = fold
	var out []byte
	for {
		n := len(out)
		if out = enc.next(out, n+64<<10); len(out) == n {
			return out
		}
	}
}

// referenceFold folds each CRLF-terminated line of payload byte by byte:
// the first fold octets, then CRLF SP and fold-1 octets at a time.
func referenceFold(payload []byte, fold int) []byte {
	var out []byte
	for _, l := range strings.SplitAfter(string(payload), "\r\n") {
		text := strings.TrimSuffix(l, "\r\n")
		col := 0
		for i := 0; i < len(text); i++ {
			if col == fold {
				out = append(out, "\r\n "...)
				col = 1
			}
			out = append(out, text[i])
			col++
		}
		out = append(out, l[len(text):]...)
	}
	return out
}

// FuzzFold: folded DATA payload and BDAT chunks deliver the reference
// folding of the unfolded message, every line within the limit (plus a
// stuffed "."), and a chunk's size is announced right.
func FuzzFold(f *testing.F) {
	for _, s := range []string{"", "abcdefghijkl", ".abcdefghijkl\r\n", "a\rbcdefgh\r\rij\n", "abcdef\r\n.\r\n"} {
		f.Add([]byte(s), uint8(5))
	}
	f.Fuzz(func(t *testing.T, body []byte, k uint8) {
		fold := int(k%16) + 2
		out := encodeFolded(body, fold)
		checkWire(t, out)
		plain := encodeBody(body)
		// Folding the message's lines, then stuffing: DATA and BDAT
		// deliver the same lines.
		if want := unstuffed(out); want != string(referenceFold([]byte(unstuffed(plain)), fold)) {
			t.Fatalf("fold %d of %q: %q", fold, body, out)
		}
		for _, l := range bytes.Split(out, []byte("\r\n")) {
			if len(l) > fold+1 || len(l) == fold+1 && l[0] != '.' {
				t.Fatalf("fold %d of %q: line %q", fold, body, l)
			}
		}
		ch := newFoldedChunk(body, fold)
		got, _ := readChunk(t, ch)
		if want := referenceFold([]byte(unstuffed(plain)), fold); string(got) != string(want) {
			t.Fatalf("fold %d: chunk(%q) = %q, want %q", fold, body, got, want)
		}
		if ch.size != int64(len(got)) {
			t.Fatalf("fold %d: chunk(%q): size %d announced, %d sent", fold, body, ch.size, len(got))
		}
	})
}
