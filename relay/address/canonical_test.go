package address

import (
	"strings"
	"testing"

	"golang.org/x/net/idna"

	"github.com/greyrelay/greyrelay/internal/spelling"
)

func TestCanonicalDomain(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"example.com", "example.com"},
		{"Example.COM.", "example.com"},
		{"bücher.test", "xn--bcher-kva.test"},
		{"BÜCHER.test", "xn--bcher-kva.test"},
		{"bücher.test.", "xn--bcher-kva.test"},
		{"xn--bcher-kva.test", "xn--bcher-kva.test"},
		{"XN--BCHER-KVA.TEST.", "xn--bcher-kva.test"},
		{"mail.bücher.xn--bcher-kva.test", "mail.xn--bcher-kva.xn--bcher-kva.test"},
		{"[192.0.2.1]", "[192.0.2.1]"},
		{"[IPv6:2001:DB8::1]", "[IPv6:2001:db8::1]"},
	} {
		got, err := CanonicalDomain(c.in)
		if err != nil || got != c.want {
			t.Errorf("CanonicalDomain(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
		if k := DomainKey(c.in); k != c.want {
			t.Errorf("DomainKey(%q) = %q, want %q", c.in, k, c.want)
		}
	}
	for _, bad := range []string{"", ".", "a..b", "xn--zz.test", "bu\u0308cher.test", "a.b..", "x.123"} {
		if got, err := CanonicalDomain(bad); err == nil {
			t.Errorf("CanonicalDomain(%q) = %q, want an error", bad, got)
		}
	}
	// An invalid name still equals its case and trailing-dot spellings,
	// and no valid name.
	if DomainKey("Under_Score.test.") != "under_score.test" {
		t.Errorf("DomainKey of an invalid name: %q", DomainKey("Under_Score.test."))
	}
}

// FuzzCanonicalDomain: every spelling of a domain has the canonical form
// of the domain, the canonical form is a fixed point, and every spelling
// has the same DomainKey.
func FuzzCanonicalDomain(f *testing.F) {
	for _, s := range []string{"example.com", "bücher.test", "xn--bcher-kva.test", "Straße.test", "ñandú.test",
		"العربية.test", "日本語.jp", "a.xn--fiqs8s", "[192.0.2.1]", "x.test.",
		"Xn--0-0000AAAAAAAAAAAAAAAA.test", // a 26-octet A-label whose U-label is 65 octets
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := CanonicalDomain(s)
		if err != nil {
			return
		}
		if again, err := CanonicalDomain(d); err != nil || again != d {
			t.Fatalf("CanonicalDomain(%q) = %q, but again %q, %v", s, d, again, err)
		}
		if !isASCII(d) || d != strings.ToLower(d) || strings.HasSuffix(d, ".") {
			t.Fatalf("CanonicalDomain(%q) = %q: not ASCII, lower case, without a final dot", s, d)
		}
		if strings.HasPrefix(d, "[") {
			return
		}
		for _, sp := range spelling.Of(d) {
			got, err := CanonicalDomain(sp)
			if err == nil && got != d {
				t.Fatalf("spelling %q of %q is canonically %q", sp, d, got)
			}
			if DomainKey(sp) != DomainKey(s) || DomainKey(sp) != d {
				t.Fatalf("spelling %q of %q (from %q): DomainKey %q", sp, d, s, DomainKey(sp))
			}
		}
	})
}

// TestLongULabel: a label's 63-octet limit is its A-label's (RFC 5890
// §2.3.2.1). Sixteen four-octet characters and a digit are 65 octets of
// UTF-8 but the A-label xn--0-0000aaaaaaaaaaaaaaaa: both spellings are one
// valid name (FuzzKeysSpellings in relay/dkim found the U-label refused
// while its A-label was accepted). A U-label whose A-label is longer than
// 63 octets stays refused.
func TestLongULabel(t *testing.T) {
	u := strings.Repeat("\U0002AE9B", 16) + "0"
	for _, d := range []string{u + ".test", "Xn--0-0000AAAAAAAAAAAAAAAA.test"} {
		got, err := CanonicalDomain(d)
		if err != nil || got != "xn--0-0000aaaaaaaaaaaaaaaa.test" {
			t.Errorf("CanonicalDomain(%q) = %q, %v; want xn--0-0000aaaaaaaaaaaaaaaa.test", d, got, err)
		}
		if _, err := ParseDomain(d, Options{SMTPUTF8: true}); err != nil {
			t.Errorf("ParseDomain(%q): %v", d, err)
		}
	}
	// Four such labels: 277 octets of UTF-8, 113 as A-labels.
	four := strings.Repeat(u+".", 4) + "test"
	if got, err := CanonicalDomain(four); err != nil || got != strings.Repeat("xn--0-0000aaaaaaaaaaaaaaaa.", 4)+"test" {
		t.Errorf("CanonicalDomain of %d octets of U-labels = %q, %v; want its A-labels", len(four), got, err)
	}
	var b strings.Builder
	for i := range 30 {
		b.WriteRune(rune(0x4E00 + 97*i)) // distinct: Punycode spends several octets on each
	}
	long := b.String() + ".test"
	if a, _ := idna.Punycode.ToASCII(b.String()); len(a) <= 63 {
		t.Fatalf("%q's A-label %q is not over 63 octets", b.String(), a)
	}
	if got, err := CanonicalDomain(long); err == nil {
		t.Errorf("CanonicalDomain of a U-label whose A-label is over 63 octets = %q, want an error", got)
	}
	// And the whole name: five labels whose A-labels are over 50 octets
	// each pass 255 octets as A-labels.
	var l strings.Builder
	for i := range 19 {
		l.WriteRune(rune(0x4E00 + 97*i))
	}
	a, _ := idna.Punycode.ToASCII(l.String())
	if len(a) < 52 || len(a) > 63 {
		t.Fatalf("%q's A-label %q is not 52 to 63 octets", l.String(), a)
	}
	if got, err := CanonicalDomain(strings.Repeat(l.String()+".", 5) + "test"); err == nil {
		t.Errorf("CanonicalDomain of a name over 255 octets as A-labels = %q, want an error", got)
	}
}
