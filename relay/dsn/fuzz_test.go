package dsn

import (
	"net/mail"
	"testing"
)

// FuzzCompose feeds hostile replies, addresses, ENVIDs and originals to
// Compose. Whatever the input, the DSN must parse as multipart/report with a
// readable delivery-status part, and contain no bare CR, LF or NUL, no line
// of 998 octets or more, and no 8-bit octet unless it is an SMTPUTF8 DSN.
func FuzzCompose(f *testing.F) {
	f.Add("550 5.1.1 <x@y>: Recipient address rejected", "bob@example.com", "rfc822;bob@example.com", "ENV1", []byte(origMsg), false, false)
	f.Add("550 no\r\nBcc: victim@x", "b\r\nBcc: y@z", "rfc822;a\r\nB@c", "x\r\nBcc: y", []byte("Subject: a\rb\nc\x00\r\n\r\nbody\r"), false, true)
	f.Add("550 \x00\xff\xfe", "bøb@exämple.com", "utf-8;bøb@exämple.com", "", []byte("Subject: Grüße\r\n\r\n\xff\r\n"), true, true)
	f.Add(string(make([]byte, 3000)), "--=_dsn_", "", "", []byte("\r\n\r\n--=_dsn_\r\n"), false, true)
	f.Fuzz(func(t *testing.T, reply, final, orcpt, envid string, original []byte, utf8, full bool) {
		r := report(Failed)
		r.Recipients[0].Diagnostic = reply
		r.Recipients[0].Final = final
		r.Recipients[0].Original = orcpt
		r.Recipients[0].Explanation = reply
		r.EnvID = envid
		r.Original = original
		r.UTF8 = utf8
		if full {
			r.Return = ReturnFull
		}
		out, err := Compose(r)
		if err != nil {
			if cleanAddr(final) != "" {
				t.Fatalf("Compose: %v", err)
			}
			return
		}
		checkWire(t, out, !utf8)
		p, err := parseDSN(out)
		if err != nil {
			t.Fatalf("parse: %v\n%q", err, out)
		}
		if p.header.Get("Bcc") != "" {
			t.Fatal("injected Bcc header")
		}
		_, rcpts, err := parseStatus(p.parts[1].body)
		if err != nil {
			t.Fatalf("status: %v\n%q", err, p.parts[1].body)
		}
		if len(rcpts) != 1 || mail.Header(rcpts[0]).Get("Action") != "failed" {
			t.Fatalf("recipient groups: %v", rcpts)
		}
	})
}
