package smtpvocab

import (
	"bufio"
	"bytes"
	"errors"
	"net/textproto"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Reply
		err  bool
	}{
		{"simple", "250 ok\r\n", Reply{Code: 250, Text: "ok"}, false},
		{"bare code", "250\r\n", Reply{Code: 250}, false},
		{"bare LF tolerated", "250 ok\n", Reply{Code: 250, Text: "ok"}, false},
		{"enhanced", "451 4.7.1 Greylisted, try later\r\n", Reply{Code: 451, Enhanced: "4.7.1", Text: "Greylisted, try later"}, false},
		{"enhanced only", "250 2.0.0\r\n", Reply{Code: 250, Enhanced: "2.0.0"}, false},
		{"multi-line enhanced stripped", "550-5.1.1 no such\r\n550-5.1.1 user\r\n550 5.1.1 here\r\n",
			Reply{Code: 550, Enhanced: "5.1.1", Text: "no such\nuser\nhere"}, false},
		{"class mismatch is text", "250 1.2.3 x\r\n", Reply{Code: 250, Text: "1.2.3 x"}, false},
		{"ip is not enhanced", "250 2.1.1.1 x\r\n", Reply{Code: 250, Text: "2.1.1.1 x"}, false},
		{"too many digits", "550 5.1234.1 x\r\n", Reply{Code: 550, Text: "5.1234.1 x"}, false},
		{"multi-line ehlo", "250-mx.test hi\r\n250-SIZE 10\r\n250 8BITMIME\r\n",
			Reply{Code: 250, Text: "mx.test hi\nSIZE 10\n8BITMIME"}, false},
		{"999", "999 weird\r\n", Reply{}, true},
		{"1xx", "110 weird\r\n", Reply{}, true},
		{"600", "600 weird\r\n", Reply{}, true},
		{"non-numeric", "2x0 ok\r\n", Reply{}, true},
		{"short", "25\r\n", Reply{}, true},
		{"bad separator", "250_ok\r\n", Reply{}, true},
		{"inconsistent codes", "250-a\r\n251 b\r\n", Reply{}, true},
		{"html", "<html>\r\n", Reply{}, true},
		{"no CRLF then EOF", "250 ok", Reply{}, true},
		{"continuation then EOF", "250-ok\r\n", Reply{}, true},
		{"line too long", "250 " + strings.Repeat("x", maxLine) + "\r\n", Reply{}, true},
		{"too many lines", strings.Repeat("250-x\r\n", maxLines) + "250 x\r\n", Reply{}, true},
		{"max lines ok", strings.Repeat("250-x\r\n", maxLines-1) + "250 x\r\n",
			Reply{Code: 250, Text: strings.TrimSuffix(strings.Repeat("x\n", maxLines), "\n")}, false},
		{"too many bytes", strings.Repeat("250-"+strings.Repeat("y", 1000)+"\r\n", 70) + "250 x\r\n", Reply{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _, err := Read(bufio.NewReader(strings.NewReader(tt.in)))
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

func TestReadErrorsAreProtocolErrors(t *testing.T) {
	for _, in := range []string{"999 x\r\n", "hello\r\n", strings.Repeat("250-x\r\n", 200)} {
		_, _, err := Read(bufio.NewReader(strings.NewReader(in)))
		var pe textproto.ProtocolError
		if !errors.As(err, &pe) {
			t.Errorf("Read(%.20q) err = %v (%T), want textproto.ProtocolError", in, err, err)
		}
	}
}

// FuzzRead: the parser never panics, never accepts more than the
// limits, and what it accepts is a valid reply.
func FuzzRead(f *testing.F) {
	for _, s := range []string{"250 ok\r\n", "550-5.1.1 a\r\n550 5.1.1 b\r\n", "999 x\r\n", "250-", "451 4.7.1\n", "2", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		br := bufio.NewReader(bytes.NewReader(in))
		for range 5 {
			r, lines, err := Read(br)
			if err != nil {
				return
			}
			if r.Code < 200 || r.Code > 599 || len(lines) == 0 || len(lines) > maxLines {
				t.Fatalf("accepted invalid reply %+v (%d lines)", r, len(lines))
			}
			if r.Enhanced != "" && r.Enhanced[0] != byte('0'+r.Code/100) {
				t.Fatalf("enhanced %q does not match code %d", r.Enhanced, r.Code)
			}
		}
	})
}
