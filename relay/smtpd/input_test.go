package smtpd

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestSession_Greeting: an EHLO/HELO argument that is neither a domain nor
// an address literal gets 501 5.5.2 without being echoed, so a bare CR
// never reaches the client (RFC 5321 §2.3.8); the client may greet again.
// Names that are merely unusual pass.
func TestSession_Greeting(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	for _, bad := range []string{"EHLO evil.test\rX-Injected: yes", "HELO evil.test\rX", "EHLO x\x00y",
		"EHLO a:b", "EHLO [300.1.1.1]", "EHLO [tag:x]", "EHLO " + strings.Repeat("a", 256), "EHLO a\x7fb"} {
		c := dial(t, e.addr(0))
		c.expect("220 ")
		lines := c.cmd(bad, "501 5.5.2 Invalid EHLO/HELO argument")
		for _, l := range lines {
			if strings.ContainsAny(l, "\r\x00") || strings.Contains(l, "evil") {
				t.Errorf("%q: reply line %q", bad, l)
			}
		}
		c.cmd("MAIL FROM:<a@x.example>", "502 ") // no session yet
		c.cmd("EHLO client.example", "250 ")
		c.cmd("MAIL FROM:<a@x.example>", "250 ")
	}
	for _, ok := range []string{"EHLO [192.0.2.1]", "EHLO [IPv6:2001:db8::1]", "EHLO my_pc", "EHLO 192.168.1.5",
		"EHLO localhost", "HELO client.example", "EHLO münchen.example", "EHLO " + strings.Repeat("a", 255)} {
		c := dial(t, e.addr(0))
		c.expect("220 ")
		c.cmd(ok, "250")
	}
	// A second greeting with a bad name: 501 and the connection closes
	// (go-smtp has already taken the name and would echo it).
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("EHLO evil.test\rX-Injected: yes", "501 5.5.2")
	c.expectClosed()
}

// TestSession_PostmasterAndQuotedLocalParts: RCPT TO:<Postmaster> without
// a domain (RFC 5321 §4.5.1) goes to the postmaster address, and quoted
// local parts (RFC 5321 §4.1.2) are taken and stored quoted again.
func TestSession_PostmasterAndQuotedLocalParts(t *testing.T) {
	for _, tc := range []struct {
		postmaster, want string
	}{
		{"", "postmaster@relay.test"},
		{`"ops desk"@Ops.Example`, `"ops desk"@ops.example`},
	} {
		cfg := trustedConfig(t)
		cfg.Postmaster = tc.postmaster
		e := startServer(t, cfg)
		c := dial(t, e.addr(0))
		c.hello()
		c.cmd(`MAIL FROM:<"john doe"@x.example>`, "250 ")
		c.cmd("RCPT TO:<Postmaster>", "250 ")
		c.cmd(`RCPT TO:<"a b"@example.com>`, "250 ")
		c.cmd(`RCPT TO:<"a\"b"@example.com>`, "250 ")
		c.cmd(`RCPT TO:<"a@b"@example.com>`, "553 5.1.3")
		c.cmd("DATA", "354 ")
		c.write("Subject: x\r\n\r\nx\r\n.\r\n")
		c.expect("250 ")
		m := e.q.messages()[0]
		var got []string
		for _, r := range m.To {
			got = append(got, r.Addr)
		}
		want := tc.want + `,"a b"@example.com,"a\"b"@example.com`
		if m.From != `"john doe"@x.example` || strings.Join(got, ",") != want {
			t.Errorf("from %q, to %q; want %q", m.From, got, want)
		}
		c.cmd("MAIL FROM:<Postmaster>", "501 ") // a reverse-path needs a domain
	}
	// A client that may not relay gets no further with the postmaster.
	e := startServer(t, testConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<postmaster>", "554 5.7.1")
	// A system hostname that is no domain leaves no default to go to.
	cfg := trustedConfig(t)
	cfg.Hostname = "host_name"
	e = startServer(t, cfg)
	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<postmaster>", "550 5.1.1 No postmaster address configured")
}

// TestSession_AddressLiterals: delivery.address_literals refuse (the
// default) answers RCPT with 550 5.1.2; deliver takes the recipient with
// the literal as its domain (the router delivers to that address).
func TestSession_AddressLiterals(t *testing.T) {
	for _, mode := range []string{"refuse", "deliver"} {
		cfg := trustedConfig(t)
		cfg.Delivery.AddressLiterals = mode
		e := startServer(t, cfg)
		c := dial(t, e.addr(0))
		c.hello()
		c.cmd("MAIL FROM:<a@[192.0.2.9]>", "250 ") // a sender may be a literal
		for _, rcpt := range []string{"user@[192.0.2.1]", "user@[IPv6:2001:db8::1]"} {
			if mode == "refuse" {
				c.cmd("RCPT TO:<"+rcpt+">", "550 5.1.2 Mail to address literals is not accepted")
			} else {
				c.cmd("RCPT TO:<"+rcpt+">", "250 ")
			}
		}
		c.cmd("RCPT TO:<user@example.com>", "250 ")
		c.cmd("DATA", "354 ")
		c.write("Subject: x\r\n\r\nx\r\n.\r\n")
		c.expect("250 ")
		var domains []string
		for _, r := range e.q.messages()[0].To {
			domains = append(domains, r.Domain)
		}
		want := "example.com"
		if mode == "deliver" {
			want = "[192.0.2.1],[IPv6:2001:db8::1],example.com"
		}
		if got := strings.Join(domains, ","); got != want {
			t.Errorf("%s: domains %s, want %s", mode, got, want)
		}
	}
}

// FuzzGreetingOK: whatever greetingOK passes is safe to echo: valid UTF-8
// without control characters, spaces or angle brackets, at most 255 octets.
func FuzzGreetingOK(f *testing.F) {
	for _, s := range []string{"client.example", "[192.0.2.1]", "[IPv6:::1]", "my_pc", "evil.test\rX", "a:b", "münchen.example", "[300.1.1.1]", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		if !greetingOK(h) {
			return
		}
		if len(h) > 255 || !utf8.ValidString(h) || strings.ContainsFunc(h, func(r rune) bool {
			return unicode.IsControl(r) || unicode.IsSpace(r) || r == '<' || r == '>'
		}) {
			t.Fatalf("greetingOK(%q)", h)
		}
	})
}
