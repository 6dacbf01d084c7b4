package smtpclient

import (
	"bufio"
	"bytes"
	"errors"
	"net/textproto"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/classifier"
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

func TestReadReply(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want classifier.Reply
		err  bool
	}{
		{"simple", "250 ok\r\n", classifier.Reply{Code: 250, Text: "ok"}, false},
		{"bare code", "250\r\n", classifier.Reply{Code: 250}, false},
		{"bare LF tolerated", "250 ok\n", classifier.Reply{Code: 250, Text: "ok"}, false},
		{"enhanced", "451 4.7.1 Greylisted, try later\r\n", classifier.Reply{Code: 451, Enhanced: "4.7.1", Text: "Greylisted, try later"}, false},
		{"enhanced only", "250 2.0.0\r\n", classifier.Reply{Code: 250, Enhanced: "2.0.0"}, false},
		{"multi-line enhanced stripped", "550-5.1.1 no such\r\n550-5.1.1 user\r\n550 5.1.1 here\r\n",
			classifier.Reply{Code: 550, Enhanced: "5.1.1", Text: "no such\nuser\nhere"}, false},
		{"class mismatch is text", "250 1.2.3 x\r\n", classifier.Reply{Code: 250, Text: "1.2.3 x"}, false},
		{"ip is not enhanced", "250 2.1.1.1 x\r\n", classifier.Reply{Code: 250, Text: "2.1.1.1 x"}, false},
		{"too many digits", "550 5.1234.1 x\r\n", classifier.Reply{Code: 550, Text: "5.1234.1 x"}, false},
		{"multi-line ehlo", "250-mx.test hi\r\n250-SIZE 10\r\n250 8BITMIME\r\n",
			classifier.Reply{Code: 250, Text: "mx.test hi\nSIZE 10\n8BITMIME"}, false},
		{"999", "999 weird\r\n", classifier.Reply{}, true},
		{"1xx", "110 weird\r\n", classifier.Reply{}, true},
		{"600", "600 weird\r\n", classifier.Reply{}, true},
		{"non-numeric", "2x0 ok\r\n", classifier.Reply{}, true},
		{"short", "25\r\n", classifier.Reply{}, true},
		{"bad separator", "250_ok\r\n", classifier.Reply{}, true},
		{"inconsistent codes", "250-a\r\n251 b\r\n", classifier.Reply{}, true},
		{"html", "<html>\r\n", classifier.Reply{}, true},
		{"no CRLF then EOF", "250 ok", classifier.Reply{}, true},
		{"continuation then EOF", "250-ok\r\n", classifier.Reply{}, true},
		{"line too long", "250 " + strings.Repeat("x", maxReplyLine) + "\r\n", classifier.Reply{}, true},
		{"too many lines", strings.Repeat("250-x\r\n", maxReplyLines) + "250 x\r\n", classifier.Reply{}, true},
		{"max lines ok", strings.Repeat("250-x\r\n", maxReplyLines-1) + "250 x\r\n",
			classifier.Reply{Code: 250, Text: strings.TrimSuffix(strings.Repeat("x\n", maxReplyLines), "\n")}, false},
		{"too many bytes", strings.Repeat("250-"+strings.Repeat("y", 1000)+"\r\n", 70) + "250 x\r\n", classifier.Reply{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _, err := readReply(bufio.NewReader(strings.NewReader(tt.in)))
			if tt.err {
				if err == nil {
					t.Fatalf("readReply = %+v, want error", r)
				}
				return
			}
			if err != nil || *r != tt.want {
				t.Fatalf("readReply = %+v, %v; want %+v", r, err, tt.want)
			}
		})
	}
}

func TestReadReplyErrorsAreProtocolErrors(t *testing.T) {
	for _, in := range []string{"999 x\r\n", "hello\r\n", strings.Repeat("250-x\r\n", 200)} {
		_, _, err := readReply(bufio.NewReader(strings.NewReader(in)))
		var pe textproto.ProtocolError
		if !errors.As(err, &pe) {
			t.Errorf("readReply(%.20q) err = %v (%T), want textproto.ProtocolError", in, err, err)
		}
	}
}

// FuzzReadReply: the parser never panics, never accepts more than the
// limits, and what it accepts is a valid reply.
func FuzzReadReply(f *testing.F) {
	for _, s := range []string{"250 ok\r\n", "550-5.1.1 a\r\n550 5.1.1 b\r\n", "999 x\r\n", "250-", "451 4.7.1\n", "2", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		br := bufio.NewReader(bytes.NewReader(in))
		for range 5 {
			r, lines, err := readReply(br)
			if err != nil {
				return
			}
			if r.Code < 200 || r.Code > 599 || len(lines) == 0 || len(lines) > maxReplyLines {
				t.Fatalf("accepted invalid reply %+v (%d lines)", r, len(lines))
			}
			if r.Enhanced != "" && r.Enhanced[0] != byte('0'+r.Code/100) {
				t.Fatalf("enhanced %q does not match code %d", r.Enhanced, r.Code)
			}
		}
	})
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
