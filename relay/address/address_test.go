package address

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

var (
	rcpt   = Options{}
	utf    = Options{SMTPUTF8: true}
	sender = Options{Sender: true}
	pm     = Options{Postmaster: true}
	dec    = Options{Decoded: true}
	decS   = Options{Decoded: true, Sender: true}
)

func TestParse_Valid(t *testing.T) {
	tests := []struct {
		in         string
		opt        Options
		want       Address
		wantString string
	}{
		{"user@example.com", rcpt, Address{"user", "example.com"}, "user@example.com"},
		{"USER@TARGET.EXAMPLE", rcpt, Address{"USER", "target.example"}, "USER@target.example"},
		{"first.last+tag@sub.example.org", rcpt, Address{"first.last+tag", "sub.example.org"}, ""},
		{`"a.b"@example.com`, rcpt, Address{"a.b", "example.com"}, "a.b@example.com"},
		{`"john doe"@example.com`, rcpt, Address{"john doe", "example.com"}, `"john doe"@example.com`},
		{`"a\"b"@x.org`, rcpt, Address{`a"b`, "x.org"}, `"a\"b"@x.org`},
		{`"a\\b"@x.org`, rcpt, Address{`a\b`, "x.org"}, `"a\\b"@x.org`},
		{"user@localhost", rcpt, Address{"user", "localhost"}, ""},
		{"user@[127.0.0.1]", rcpt, Address{"user", "[127.0.0.1]"}, ""},
		{"user@[IPv6:::1]", rcpt, Address{"user", "[IPv6:::1]"}, ""},
		{"user@[ipv6:2001:DB8::1]", rcpt, Address{"user", "[IPv6:2001:db8::1]"}, "user@[IPv6:2001:db8::1]"},
		{"user@[IPv6:::ffff:192.0.2.1]", rcpt, Address{"user", "[IPv6:::ffff:192.0.2.1]"}, ""},
		{"user@xn--bcher-kva.example", rcpt, Address{"user", "xn--bcher-kva.example"}, ""},
		{"user@XN--BCHER-KVA.Example", rcpt, Address{"user", "xn--bcher-kva.example"}, ""},
		{"ü@Bücher.example", utf, Address{"ü", "bücher.example"}, "ü@bücher.example"},
		{"Postmaster", pm, Address{"Postmaster", ""}, "Postmaster"},
		{"postmaster@example.com", pm, Address{"postmaster", "example.com"}, ""},
		{"a@b-c.d1", rcpt, Address{"a", "b-c.d1"}, ""},
		// The root's trailing dot is dropped (Postfix's trivial-rewrite does the same).
		{"user@Target.Example.", rcpt, Address{"user", "target.example"}, "user@target.example"},
		{"ü@Bücher.example.", utf, Address{"ü", "bücher.example"}, "ü@bücher.example"},
		{"#$&'*+-/=?^_`{|}~@x.example", rcpt, Address{"#$&'*+-/=?^_`{|}~", "x.example"}, ""},
		// As go-smtp hands them over: quotes already removed (RFC 5321
		// §4.1.2 Quoted-string), quoted again by String.
		{"a b@example.com", dec, Address{"a b", "example.com"}, `"a b"@example.com`},
		{`a"b@x.org`, dec, Address{`a"b`, "x.org"}, `"a\"b"@x.org`},
		{`a\b@x.org`, dec, Address{`a\b`, "x.org"}, `"a\\b"@x.org`},
		{"a..b@x.org", dec, Address{"a..b", "x.org"}, `"a..b"@x.org`},
		{"john.doe@x.org", dec, Address{"john.doe", "x.org"}, ""},
		{`"q"@x.org`, dec, Address{`"q"`, "x.org"}, `"\"q\""@x.org`},
		{"a b@example.com", decS, Address{"a b", "example.com"}, `"a b"@example.com`},
		{"ü b@x.example", Options{Decoded: true, SMTPUTF8: true}, Address{"ü b", "x.example"}, `"ü b"@x.example`},
	}
	for _, tc := range tests {
		got, err := Parse(tc.in, tc.opt)
		if err != nil {
			t.Errorf("Parse(%q) error %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("Parse(%q) = %#v, want %#v", tc.in, got, tc.want)
		}
		ws := tc.wantString
		if ws == "" {
			ws = tc.want.Local + "@" + tc.want.Domain
		}
		if got.String() != ws {
			t.Errorf("Parse(%q).String() = %q, want %q", tc.in, got.String(), ws)
		}
	}
}

func TestParse_Refused(t *testing.T) {
	const (
		syntax   = "501 5.1.3"
		ssyntax  = "501 5.1.7"
		routing  = "553 5.1.3"
		srouting = "553 5.1.7"
		long     = "501 5.5.4"
		ascii    = "553 5.6.7"
	)
	tests := []struct {
		in   string
		opt  Options
		want string
	}{
		// The nmap smtp-open-relay tests, as written and as go-smtp hands
		// them over (quotes and routes stripped).
		{"user%target@[192.0.2.1]", rcpt, routing},    // nmap 5
		{"user%target@relay.example", rcpt, routing},  // nmap 6
		{`"user@target"`, rcpt, routing},              // nmap 7
		{`"user%target"`, rcpt, routing},              // nmap 8
		{"user@target@[192.0.2.1]", rcpt, routing},    // nmap 9
		{`"user@target"@[192.0.2.1]`, rcpt, routing},  // nmap 10
		{"user@target@relay.example", rcpt, routing},  // nmap 11 and 10 after go-smtp
		{"@[192.0.2.1]:user@target", rcpt, routing},   // nmap 12
		{"@relay.example:user@target", rcpt, routing}, // nmap 13
		{"target!user", rcpt, syntax},                 // nmap 14 (no domain at all)
		{"target!user@[192.0.2.1]", rcpt, routing},    // nmap 15
		{"target!user@relay.example", rcpt, routing},  // nmap 16
		{`"a@b"@c.example`, rcpt, routing},            // @ inside quotes
		{`"a%b"@c.example`, rcpt, routing},
		{"spamtest", rcpt, syntax},   // MAPS: no domain
		{"postmaster", rcpt, syntax}, // only with Options.Postmaster
		{"postmaster", sender, ssyntax},
		{"user@target..", rcpt, syntax}, // two trailing dots
		{"user@.", rcpt, syntax},        // the root alone
		{"user@[192.0.2.1].", rcpt, syntax},
		{"user@0x7f000001", rcpt, syntax}, // inet_aton trick
		{"user@127.0.0.1", rcpt, syntax},  // unbracketed IP
		{"user@2130706433", rcpt, syntax},
		// Control characters and injection.
		{"user@target\x00.relay", rcpt, syntax},
		{"us\rer@target.example", rcpt, syntax},
		{"a\r@b.example", rcpt, syntax},
		{"a@b.example\r\nRCPT TO:<x@y>", rcpt, syntax},
		{"a\x7f@b.example", rcpt, syntax},
		{"a\tb@b.example", rcpt, syntax},
		{"a\u0085b@b.example", utf, syntax}, // C1 control (NEL)
		{`a"b@x.example`, rcpt, syntax},     // go-smtp's form of "a\"b"@x
		{"a b@x.example", rcpt, syntax},
		{"\xff@x.example", utf, syntax}, // invalid UTF-8
		{"\xff@x.example", rcpt, syntax},
		{"ü@x.example", rcpt, ascii},      // 8-bit without SMTPUTF8
		{"u@bücher.example", rcpt, ascii}, // unicode domain without SMTPUTF8
		// IDNA and labels.
		{"user@xn---", rcpt, syntax},
		{"user@xn--", rcpt, syntax},
		{"user@xn--a.example", rcpt, syntax},   // decodes to a control character
		{"user@xn--abc.example", rcpt, syntax}, // not a valid A-label
		// Accepted by the letters-marks-digits approximation that IDNA2008
		// replaced, refused by IDNA2008.
		{"user@\u0301abc.example", utf, syntax},     // leading combining mark
		{"user@xn--abc-jdc.example", rcpt, syntax},  // the same as an A-label
		{"user@abc\u05d0.example", utf, syntax},     // Latin and Hebrew in one label (bidi)
		{"user@a\u0660.example", utf, syntax},       // Arabic-Indic digit in a Latin label (bidi)
		{"user@1abc.\u05d0\u05d1", utf, syntax},     // bidi name with a label starting with a digit
		{"user@\u02b0.example", utf, syntax},        // modifier letter, not PVALID
		{"user@\u01c5.example", utf, syntax},        // titlecase letter, not PVALID
		{"user@e\u0301xample.example", utf, syntax}, // not NFC
		{"user@ab--cd.example", rcpt, syntax},       // reserved R-LDH label
		{"user@-a.example", rcpt, syntax},
		{"user@a-.example", rcpt, syntax},
		{"user@a_b.example", rcpt, syntax},
		{"user@a..b", rcpt, syntax},
		{"user@.a.b", rcpt, syntax},
		{"user@a.b!c", rcpt, syntax},
		{"user@" + strings.Repeat("a", 64) + ".example", rcpt, syntax},
		// Address literals.
		{"user@[192.0.2.1", rcpt, syntax},
		{"user@[300.1.1.1]", rcpt, syntax},
		{"user@[01.2.3.4]", rcpt, syntax},
		{"user@[IPv6:fe80::1%25eth0]", rcpt, syntax},
		{"user@[IPv6:192.0.2.1]", rcpt, syntax},
		{"user@[::1]", rcpt, syntax},
		{"user@[tag:content]", rcpt, syntax},
		{"user@[]", rcpt, syntax},
		// Empty parts and local-part syntax.
		{"", rcpt, syntax},
		{"@", rcpt, routing},
		{"user@", rcpt, syntax},
		{"@example.com", rcpt, routing},
		{`""@example.com`, rcpt, syntax},
		{".user@x.example", rcpt, syntax},
		{"user.@x.example", rcpt, syntax},
		{"us..er@x.example", rcpt, syntax},
		{`"unterminated@x.example`, rcpt, syntax},
		{`"a"b@x.example`, rcpt, syntax},
		{`"a\`, rcpt, syntax},
		// Sender context.
		{"user%x@y.example", sender, srouting},
		{"bad..dots@x.example", sender, ssyntax},
		// Length limits (RFC 5321 §4.5.3.1).
		{strings.Repeat("a", 65) + "@x.example", rcpt, long},
		{`"` + strings.Repeat("a", 63) + `"@x.example`, rcpt, long}, // 65 octets as written
		{strings.Repeat("a", 2000) + "@x.example", rcpt, long},
		// Decoded (go-smtp's form): the routing and control rules still
		// hold inside what were quotes.
		{"user@target@relay.example", dec, routing},
		{"a%b@x.example", dec, routing},
		{"a!b@x.example", dec, routing},
		{"a\rb@x.example", dec, syntax},
		{"a\tb@x.example", dec, syntax},
		{"@x.example", dec, routing},
		{"no-domain", dec, syntax},
		{"ü b@x.example", dec, ascii},
		{strings.Repeat("a", 63) + " @x.example", dec, long},   // 66 octets once quoted
		{strings.Repeat(`"`, 31) + "@x.example", dec, "<nil>"}, // 64 octets once quoted
		{strings.Repeat(`"`, 32) + "@x.example", dec, long},
	}
	for _, tc := range tests {
		_, err := Parse(tc.in, tc.opt)
		if got := replyPrefix(err); got != tc.want {
			t.Errorf("Parse(%q, %+v) = %v, want %s", tc.in, tc.opt, err, tc.want)
		}
	}
}

func replyPrefix(err error) string {
	var e *Error
	if !errors.As(err, &e) {
		if err == nil {
			return "<nil>"
		}
		return "untyped: " + err.Error()
	}
	s := e.Error()
	if i := strings.IndexByte(s, ' '); i > 0 {
		if j := strings.IndexByte(s[i+1:], ' '); j > 0 {
			return s[:i+1+j]
		}
	}
	return s
}

// TestParse_Boundaries probes each RFC 5321 §4.5.3.1 limit at L-1, L, L+1.
func TestParse_Boundaries(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	dom := func(n int) string { // a domain of exactly n octets ending in a letter
		var parts []string
		for n > 64 {
			parts = append(parts, label63)
			n -= 64
		}
		parts = append(parts, strings.Repeat("b", n))
		return strings.Join(parts, ".")
	}
	tests := []struct {
		in   string
		want string
	}{
		{strings.Repeat("l", 63) + "@x.example", "<nil>"},
		{strings.Repeat("l", 64) + "@x.example", "<nil>"},
		{strings.Repeat("l", 65) + "@x.example", "501 5.5.4"},
		// Path: "<" mailbox ">" is at most 256 octets, so a mailbox 254.
		{"a@" + dom(252), "<nil>"},     // 254
		{"a@" + dom(253), "501 5.5.4"}, // 255: path 257
		{"ab@" + dom(251), "<nil>"},
	}
	for _, tc := range tests {
		_, err := Parse(tc.in, rcpt)
		if got := replyPrefix(err); got != tc.want {
			t.Errorf("Parse(len %d) = %v, want %s", len(tc.in), err, tc.want)
		}
	}
	for _, n := range []int{254, 255, 256} {
		_, err := ParseDomain(dom(n), rcpt)
		want := "<nil>"
		if n > MaxDomain {
			want = "501 5.5.4"
		}
		if got := replyPrefix(err); got != want {
			t.Errorf("ParseDomain(len %d) = %v, want %s", n, err, want)
		}
	}
}

// TestDecodeALabel: what the Punycode decoder used to be tested with, now
// through x/net/idna.
func TestDecodeALabel(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{"bcher-kva", "bücher", true},
		{"mnchen-3ya", "münchen", true},
		{"wgv71a119e", "日本語", true},
		{"-", "", false},
		{"zzzzzzzzzzzzzzzzzzzz", "", false}, // overflow
		{"a€", "", false},
		{"abc-", "", false},        // decodes to ASCII: needs no encoding
		{"abc-jdc", "", false},     // a leading combining mark
		{"9pa", "", false},         // U+02B0, not PVALID
		{"example-tge", "", false}, // not NFC
	}
	for _, tc := range tests {
		got, ok := decodeALabel("xn--" + tc.in)
		if ok != tc.ok || ok && got != tc.want {
			t.Errorf("decodeALabel(%q) = %q, %v; want %q, %v", "xn--"+tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestError_Text(t *testing.T) {
	_, err := Parse("a%b@c.example", rcpt)
	if err == nil || err.Error() != "553 5.1.3 % and ! routing is not accepted" {
		t.Fatalf("got %v", err)
	}
}

// FuzzParse checks the invariants every accepted address must keep: it
// round-trips through String, stays within the RFC 5321 limits and carries
// nothing a header or command could be injected with.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"user@example.com", `"a b"@x.y`, "user@target@relay", "@a:b@c",
		"a%b@c", "user@[IPv6:::1]", "user@[127.0.0.1]", "ü@bücher.de", "user@xn--bcher-kva.de",
		"a\r\n@b", "postmaster", `"a\"b"@c.d`, "x@0x7f000001", "user@example.com.", "user@x.."} {
		f.Add(s, false, false)
		f.Add(s, true, false)
		f.Add(s, false, true)
	}
	for _, s := range []string{"a b@x.y", `a"b@c.d`, `a\b@c.d`, "a..b@c", `"@x.y`, "a b@c@d.e"} {
		f.Add(s, false, true)
	}
	f.Fuzz(func(t *testing.T, s string, smtputf8, decoded bool) {
		opt := Options{SMTPUTF8: smtputf8, Postmaster: true, Decoded: decoded}
		a, err := Parse(s, opt)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code/100 != 5 || strings.ContainsAny(e.Msg, "\r\n\x00") {
				t.Fatalf("bad error %#v", err)
			}
			return
		}
		for _, part := range []string{a.Local, a.Domain} {
			for i := 0; i < len(part); i++ {
				if part[i] < 0x20 || part[i] == 0x7f || !smtputf8 && part[i] >= 0x80 {
					t.Fatalf("accepted %q with byte %#x", s, part[i])
				}
			}
			if !utf8.ValidString(part) {
				t.Fatalf("accepted invalid UTF-8 %q", s)
			}
		}
		if strings.ContainsAny(a.Local, "@%!") || strings.Contains(a.Domain, "@") {
			t.Fatalf("accepted routing trick %q -> %#v", s, a)
		}
		if a.Domain == "" && !strings.EqualFold(a.Local, "postmaster") {
			t.Fatalf("empty domain for %q", s)
		}
		if strings.HasSuffix(a.Domain, ".") {
			t.Fatalf("domain %q of %q keeps a trailing dot: a second spelling of its name", a.Domain, s)
		}
		if len(a.Domain) > MaxDomain || len(a.String())+2 > MaxPath {
			t.Fatalf("limits exceeded for %q", s)
		}
		// What String writes is the quoted form, read back undecoded.
		b, err := Parse(a.String(), Options{SMTPUTF8: smtputf8, Postmaster: true})
		if err != nil || b != a {
			t.Fatalf("round trip %q -> %q -> %#v, %v", s, a.String(), b, err)
		}
	})
}
