package suppress

import (
	"strings"
	"testing"
	"time"
)

// TestImport: an imported file's addresses are suppressed for every
// sender (also with the sender-domain scope) and without end; a line
// removed takes its entry off; an address already suppressed for another
// reason keeps its entry.
func TestImport(t *testing.T) {
	now := t0
	l := open(t, ScopeSenderDomain, &now)
	if _, err := l.Suppress("a@shop.example", "bounced@dest.example", "no-such-user", "550 5.1.1 unknown", t0); err != nil {
		t.Fatal(err)
	}
	addrs, err := ParseAddresses(strings.NewReader("# old ESP\nOne@dest.example\n\ntwo@dest.example # role\n"))
	if err != nil {
		t.Fatal(err)
	}
	if add, rm, err := l.Import("/etc/list", append(addrs, "bounced@dest.example")); err != nil || add != 3 || rm != 0 {
		t.Fatalf("first import: %d added, %d removed, %v", add, rm, err)
	}
	now = t0.Add(24 * 365 * time.Hour)
	for _, rcpt := range []string{"one@dest.example", "TWO@dest.example"} {
		if _, ok := l.Check("x@other.example", rcpt); !ok {
			t.Errorf("%s: not suppressed a year after its import", rcpt)
		}
	}
	now = t0
	if add, rm, err := l.Import("/etc/list", []string{"two@dest.example"}); err != nil || add != 0 || rm != 2 {
		t.Fatalf("second import: %d added, %d removed, %v", add, rm, err)
	}
	if _, ok := l.Check("x@other.example", "one@dest.example"); ok {
		t.Error("an address taken out of the file is still suppressed")
	}
	if e, ok := l.Check("a@shop.example", "bounced@dest.example"); !ok || e.Reason != "no-such-user" {
		t.Errorf("the bounce's own entry: %+v, %v", e, ok)
	}
}

func TestParseAddressesRefuses(t *testing.T) {
	for _, in := range []string{"not-an-address\n", "a b@c\n", "a@b\x00\n"} {
		if _, err := ParseAddresses(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: %v, want an error naming line 1", in, err)
		}
	}
}

func FuzzParseAddresses(f *testing.F) {
	f.Add("a@b\n# c\n d@e # f\n")
	f.Fuzz(func(t *testing.T, in string) {
		as, err := ParseAddresses(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, a := range as {
			if !strings.Contains(a, "@") || strings.ContainsAny(a, " \t\x00#\n") {
				t.Fatalf("%q parsed to address %q", in, a)
			}
		}
	})
}
