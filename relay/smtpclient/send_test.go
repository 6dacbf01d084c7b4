package smtpclient

import (
	"bytes"
	"strings"
	"testing"
)

// encodeBody, for tests, returns the whole DATA payload of body (see bodyEncoder).
func encodeBody(body []byte) []byte {
	var out []byte
	enc := newBodyEncoder(body)
	for {
		n := len(out)
		out = enc.next(out, n+64<<10)
		if len(out) == n {
			return out
		}
	}
}

func TestEncodeBody(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ".\r\n"},
		{"a", "a\r\n.\r\n"},
		{"a\r\nb\r\n", "a\r\nb\r\n.\r\n"},
		{"a\nb", "a\r\nb\r\n.\r\n"},
		{"a\rb\r\n", "a b\r\n.\r\n"},
		{"a\r\r\nb", "a \r\nb\r\n.\r\n"},
		{".\r\n", "..\r\n.\r\n"},
		{"x\r\n.\r\nMAIL FROM:<a@b>\r\n", "x\r\n..\r\nMAIL FROM:<a@b>\r\n.\r\n"},
		{"x\n.\nMAIL", "x\r\n..\r\nMAIL\r\n.\r\n"},
		{"x\r.\rMAIL", "x . MAIL\r\n.\r\n"},
		{"x\r\n.\r\r\n", "x\r\n.. \r\n.\r\n"},
		{"..a\r\n", "...a\r\n.\r\n"},
		{"a.\r\n", "a.\r\n.\r\n"},
	}
	for _, tt := range tests {
		if got := string(encodeBody([]byte(tt.in))); got != tt.want {
			t.Errorf("encodeBody(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// checkWire asserts that data is well-formed DATA payload: only CRLF line
// endings, the only "\r\n.\r\n" is the terminator.
func checkWire(t *testing.T, data []byte) {
	t.Helper()
	if !bytes.HasSuffix(data, []byte(".\r\n")) || (len(data) > 3 && !bytes.HasSuffix(data, []byte("\r\n.\r\n"))) {
		t.Fatalf("payload does not end with CRLF.CRLF: %q", data)
	}
	for i, b := range data {
		if b == '\r' && (i+1 == len(data) || data[i+1] != '\n') {
			t.Fatalf("bare CR at %d in %q", i, data)
		}
		if b == '\n' && (i == 0 || data[i-1] != '\r') {
			t.Fatalf("bare LF at %d in %q", i, data)
		}
	}
	if i := bytes.Index(data, []byte("\r\n.\r\n")); i >= 0 && i != len(data)-5 {
		t.Fatalf("early end-of-data at %d in %q", i, data)
	}
	if bytes.HasPrefix(data, []byte(".\r\n")) && len(data) != 3 {
		t.Fatalf("early end-of-data at 0 in %q", data)
	}
}

// referenceEncode is the DATA payload of body, one byte at a time: the
// plain statement of what bodyEncoder does a run at a time.
func referenceEncode(body []byte) []byte {
	var out []byte
	bol := true
	for i := 0; i < len(body); i++ {
		b := body[i]
		if bol && b == '.' {
			out = append(out, '.')
		}
		bol = false
		switch {
		case b == '\r' && i+1 < len(body) && body[i+1] == '\n':
			out = append(out, '\r', '\n')
			i++
			bol = true
		case b == '\r':
			out = append(out, ' ')
		case b == '\n':
			out = append(out, '\r', '\n')
			bol = true
		default:
			out = append(out, b)
		}
	}
	if !bol {
		out = append(out, '\r', '\n')
	}
	return append(out, '.', '\r', '\n')
}

// FuzzEncodeBody: the payload is always well-formed, and un-stuffing it
// gives back the body with line endings normalised.
func FuzzEncodeBody(f *testing.F) {
	for _, s := range []string{"", "a", ".\r\n", "\r\n.\r\n", "x\r.\n\r\n.\r\r\n", "\n\n.", "\r", "..x\r\n..\r\n.", "long line without end"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out := encodeBody(body)
		if ref := referenceEncode(body); string(out) != string(ref) {
			t.Fatalf("encodeBody(%q) = %q, the byte-by-byte reference gives %q", body, out, ref)
		}
		checkWire(t, out)
		norm := strings.NewReplacer("\r\n", "\r\n", "\r", " ", "\n", "\r\n").Replace(string(body))
		if norm != "" && !strings.HasSuffix(norm, "\r\n") {
			norm += "\r\n"
		}
		lines := strings.SplitAfter(strings.TrimSuffix(string(out), ".\r\n"), "\r\n")
		for i, l := range lines {
			lines[i] = strings.TrimPrefix(l, ".")
		}
		if got := strings.Join(lines, ""); got != norm {
			t.Fatalf("unstuffed %q, want %q", got, norm)
		}
		// Sending happens in parts: any part size gives the same bytes,
		// and a part overshoots its limit by at most the terminator.
		for _, limit := range []int{1, 2, 3, 7, 64} {
			var parts []byte
			enc := newBodyEncoder(body)
			for {
				part := enc.next(nil, limit)
				if len(part) == 0 {
					break
				}
				if len(part) > limit+4 { // "\r\n.\r\n" goes out whole
					t.Fatalf("part of %d bytes for a limit of %d", len(part), limit)
				}
				parts = append(parts, part...)
			}
			if string(parts) != string(out) {
				t.Fatalf("in parts of %d: %q, want %q", limit, parts, out)
			}
		}
	})
}

func TestXtext(t *testing.T) {
	tests := []struct{ in, want string }{
		{"abc@example.test", "abc@example.test"},
		{"a+b=c", "a+2Bb+3Dc"},
		{"a b\r\n", "a+20b+0D+0A"},
		{"ü", "+C3+BC"},
	}
	for _, tt := range tests {
		if got := xtext(tt.in); got != tt.want {
			t.Errorf("xtext(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestPathLine(t *testing.T) {
	tests := []struct {
		path   string
		params []string
		want   string
	}{
		{"a@b", nil, "MAIL FROM:<a@b>"},
		{"", []string{"SIZE=10"}, "MAIL FROM:<> SIZE=10"},
		{"a\r\n@b", nil, ""},
		{"a>@b", nil, ""},
		{"a@b", []string{"X=1\r\nRCPT"}, ""},
		{"a@b", []string{"X Y"}, ""},
		{strings.Repeat("a", 990) + "@b", nil, ""},
	}
	for _, tt := range tests {
		got, err := pathLine("MAIL FROM:", tt.path, tt.params)
		if (err != nil) != (tt.want == "") || got != tt.want {
			t.Errorf("pathLine(%.20q, %q) = %q, %v; want %q", tt.path, tt.params, got, err, tt.want)
		}
	}
}

func TestRcptParams(t *testing.T) {
	tests := []struct {
		rc   Rcpt
		want string
		err  bool
	}{
		{Rcpt{Notify: "success,failure"}, "NOTIFY=SUCCESS,FAILURE", false},
		{Rcpt{Notify: "NEVER"}, "NOTIFY=NEVER", false},
		{Rcpt{Notify: "NEVER,SUCCESS"}, "", true},
		{Rcpt{Notify: "SOMETIMES"}, "", true},
		{Rcpt{ORCPT: "rfc822;a+b@c"}, "ORCPT=rfc822;a+2Bb@c", false},
		{Rcpt{ORCPT: "RFC822;x@y"}, "ORCPT=rfc822;x@y", false},
		{Rcpt{ORCPT: "x=y@z"}, "ORCPT=rfc822;x+3Dy@z", false},
	}
	for _, tt := range tests {
		p, err := rcptParams(tt.rc)
		if got := strings.Join(p, " "); (err != nil) != tt.err || got != tt.want {
			t.Errorf("rcptParams(%+v) = %q, %v; want %q", tt.rc, got, err, tt.want)
		}
	}
}

// BenchmarkEncodeBody encodes a 4 KiB message of 72-octet lines, the
// benchmark's message size, run by run and byte by byte (the reference).
func BenchmarkEncodeBody(b *testing.B) {
	line := strings.Repeat("x", 70) + "\r\n"
	body := []byte(strings.Repeat(line, 4096/len(line)))
	b.Run("runs", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		buf := make([]byte, 0, 64<<10)
		for b.Loop() {
			newBodyEncoder(body).next(buf[:0], 64<<10)
		}
	})
	b.Run("reference", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			referenceEncode(body)
		}
	})
}
