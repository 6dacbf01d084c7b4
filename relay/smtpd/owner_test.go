package smtpd

import (
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/greyrelay/greyrelay/internal/spelling"
	"github.com/greyrelay/greyrelay/relay/address"
)

// ownerUsers is a users file where addresses have owners:
//
//	alice  alice@a.test
//	bob    (no list: any address nobody else lists)
//	carol  *@corp.example
//	dave   dave@corp.example and <>
//	erin   Shared@a.test  and frank shared@A.TEST (one address, two owners)
func ownerUsers(t testing.TB) *Users {
	t.Helper()
	var b strings.Builder
	for _, l := range []struct{ name, senders string }{
		{"alice", "alice@a.test"}, {"bob", ""}, {"carol", "*@corp.example"},
		{"dave", "dave@corp.example,<>"}, {"erin", "Shared@a.test"}, {"frank", "shared@A.TEST"},
	} {
		h, err := bcrypt.GenerateFromPassword([]byte(l.name+"-pw"), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(l.name + ":" + string(h))
		if l.senders != "" {
			b.WriteString(":" + l.senders)
		}
		b.WriteString("\n")
	}
	u, err := ParseUsers(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestUsers_OwnedByOther(t *testing.T) {
	u := ownerUsers(t)
	tests := []struct {
		user, from string
		other      bool
	}{
		{"bob", "alice@a.test", true},
		{"bob", "ALICE@A.Test", true},
		{"bob", "other@a.test", false}, // a.test has no "@a.test" entry
		{"bob", "bob@b.test", false},
		{"bob", "x@corp.example", true}, // carol's *@corp.example
		{"bob", "x@sub.corp.example", false},
		{"bob", "dave@corp.example", true},
		{"carol", "dave@corp.example", true}, // the address's own entry decides
		{"carol", "anyone@CORP.example", false},
		{"dave", "Dave@corp.example", false},
		{"alice", "alice@a.test", false},
		{"alice", "shared@a.test", true},
		{"erin", "shared@a.test", false},
		{"frank", "SHARED@a.test", false},
		{"nobody", "alice@a.test", true},
	}
	for _, tt := range tests {
		a, err := address.Parse(tt.from, address.Options{Sender: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := u.ownedByOther(tt.user, a); got != tt.other {
			t.Errorf("%s as %s: owned by another user = %v, want %v", tt.user, tt.from, got, tt.other)
		}
	}
}

// TestAuth_SenderOwnedByAnotherUser: an authenticated user without a
// sender list may not use an address listed for someone else (553 5.7.1
// with Postfix's text), and nothing is queued; unlisted addresses and <>
// stay open to them, and the owner is not affected.
func TestAuth_SenderOwnedByAnotherUser(t *testing.T) {
	e := startServer(t, testConfig(t), withUsers(ownerUsers(t)))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "bob", "bob-pw"), "235 ")
	for from, want := range map[string]string{
		"<alice@a.test>":      "553 5.7.1 <alice@a.test>: Sender address rejected: not owned by user bob",
		"<ALICE@A.TEST>":      "553 5.7.1 <ALICE@a.test>: Sender address rejected: not owned by user bob",
		"<x@corp.example>":    "553 5.7.1 <x@corp.example>: Sender address rejected: not owned by user bob",
		"<dave@corp.example>": "553 5.7.1",
		"<Shared@a.test>":     "553 5.7.1",
		"<other@a.test>":      "250 ",
		"<bob@b.test>":        "250 ",
		"<>":                  "250 ",
	} {
		c.cmd("MAIL FROM:"+from, want)
		if strings.HasPrefix(want, "553") {
			c.cmd("RCPT TO:<x@target.example>", "50") // no transaction was started
		}
		c.cmd("RSET", "250 ")
	}
	if got := c.sendMessage("bob@b.test", []string{"x@target.example"}, "Subject: x\r\n\r\nx\r\n"); !strings.HasPrefix(got, "250 ") {
		t.Fatalf("bob as bob@b.test: %q", got)
	}
	if ms := e.q.messages(); len(ms) != 1 || ms[0].From != "bob@b.test" {
		t.Fatalf("queued %+v, want only bob@b.test's message", ms)
	}

	// A user with a list is held to it and to the owners: carol's
	// *@corp.example does not cover dave's own address.
	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "carol", "carol-pw"), "235 ")
	c.cmd("MAIL FROM:<dave@corp.example>", "553 5.7.1 <dave@corp.example>: Sender address rejected: not owned by user carol")
	c.cmd("MAIL FROM:<carol@corp.example>", "250 ")

	// The owner sends as usual.
	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "alice", "alice-pw"), "235 ")
	c.cmd("MAIL FROM:<Alice@a.test>", "250 ")
}

// FuzzUsersSenders parses users files whose sender lists are arbitrary. A
// file that loads must give every listed address to its user and to no
// one else: the owner may send as it, a user without a list may not.
func FuzzUsersSenders(f *testing.F) {
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"a@b.test", "*@B.Test,<>", "@x.test, A@x.test", "\"a b\"@c.test", "a@[192.0.2.1]", ",,", "*@", "x@y@z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, senders string) {
		u, err := ParseUsers(strings.NewReader("owner:" + string(h) + ":" + senders + "\nother:" + string(h) + "\n"))
		if err != nil {
			return
		}
		_, allowed := u.Authenticate("owner", "pw")
		for _, e := range allowed {
			if e == "<>" || strings.HasPrefix(e, "@") {
				continue
			}
			a, err := address.Parse(e, address.Options{SMTPUTF8: true, Sender: true})
			if err != nil {
				t.Fatalf("listed sender %q does not parse again: %v", e, err)
			}
			if u.ownedByOther("owner", a) || !u.ownedByOther("other", a) {
				t.Errorf("%q (from %q): owner refused or other allowed", e, senders)
			}
		}
	})
}

// idnUsers: carol owns *@bücher.test (written with a U-label), dora owns
// *@xn--mnchen-3ya.test (written with its A-label), and bob has no list.
func idnUsers(t testing.TB) *Users {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	file := "carol:" + string(h) + ":*@bücher.test\n" +
		"dora:" + string(h) + ":*@XN--MNCHEN-3YA.test,Dora@Post.bücher.test.\n" +
		"bob:" + string(h) + "\n"
	u, err := ParseUsers(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestUsers_OwnerIDNSpellings: a domain owned in one spelling is owned in
// every other: U-label or A-label, any case, with or without the final
// dot. Before domains were compared canonically, bob could send as
// x@xn--bcher-kva.test although carol owns *@bücher.test.
func TestUsers_OwnerIDNSpellings(t *testing.T) {
	u := idnUsers(t)
	for _, from := range []string{"x@bücher.test", "x@xn--bcher-kva.test", "x@XN--BCHER-KVA.TEST", "x@BÜCHER.test",
		"x@münchen.test", "x@xn--mnchen-3ya.test", "dora@post.xn--bcher-kva.test"} {
		a, err := address.Parse(from, address.Options{SMTPUTF8: true, Sender: true, Decoded: true})
		if err != nil {
			t.Fatal(err)
		}
		if !u.ownedByOther("bob", a) {
			t.Errorf("bob may send as %s", from)
		}
	}
	for _, c := range []struct{ user, from string }{
		{"carol", "x@xn--bcher-kva.test"}, {"carol", "x@Bücher.test"},
		{"dora", "x@münchen.test"}, {"dora", "x@xn--mnchen-3ya.test"}, {"dora", "DORA@post.bücher.test"},
	} {
		a, err := address.Parse(c.from, address.Options{SMTPUTF8: true, Sender: true, Decoded: true})
		if err != nil {
			t.Fatal(err)
		}
		_, allowed := u.Authenticate(c.user, "pw")
		if u.ownedByOther(c.user, a) || !senderAllowed(allowed, a.String(), a) {
			t.Errorf("%s may not send as %s (list %q)", c.user, c.from, allowed)
		}
	}
}

// TestAuth_OwnerIDNSpellings is the attack at the SMTP level: bob's MAIL
// FROM in the other spelling of carol's domain is refused too.
func TestAuth_OwnerIDNSpellings(t *testing.T) {
	e := startServer(t, testConfig(t), withUsers(idnUsers(t)))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "bob", "pw"), "235 ")
	c.cmd("MAIL FROM:<x@xn--bcher-kva.test>", "553 5.7.1")
	c.cmd("MAIL FROM:<x@bücher.test> SMTPUTF8", "553 5.7.1")
	c.cmd("MAIL FROM:<x@münchen.test> SMTPUTF8", "553 5.7.1")
	c.cmd("MAIL FROM:<x@xn--mnchen-3ya.test>", "553 5.7.1")
	c.cmd("MAIL FROM:<bob@b.test>", "250 ")

	c = dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", "carol", "pw"), "235 ")
	c.cmd("MAIL FROM:<carol@xn--bcher-kva.test>", "250 ")
}

// FuzzOwnerSpellings: a domain owned in the users file in one spelling is
// owned in every spelling, for the owner (allowed) and for everyone else
// (refused), and a recipient in any spelling has the one canonical domain.
func FuzzOwnerSpellings(f *testing.F) {
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"example.com", "bücher.test", "XN--MNCHEN-3YA.test.", "日本語.jp", "Straße.test",
		"Xn--0-0000AAAAAAAAAAAAAAAA.test", // a 26-octet A-label whose U-label is 65 octets
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, d string) {
		canon, err := address.CanonicalDomain(d)
		if err != nil || strings.HasPrefix(canon, "[") || strings.ContainsAny(d, ",:\n\r") {
			return
		}
		u, err := ParseUsers(strings.NewReader("carol:" + string(h) + ":*@" + d + ",Boss@" + d + "\nbob:" + string(h) + "\n"))
		if err != nil {
			return
		}
		_, allowed := u.Authenticate("carol", "pw")
		for _, sp := range spelling.Of(d) {
			for _, local := range []string{"x", "boss"} {
				a, err := address.Parse(local+"@"+strings.TrimSuffix(sp, "."), address.Options{SMTPUTF8: true, Sender: true, Decoded: true})
				if err != nil {
					t.Fatalf("%s@%s: %v", local, sp, err)
				}
				if !u.ownedByOther("bob", a) {
					t.Fatalf("bob may send as %s (carol owns *@%s)", a, d)
				}
				if u.ownedByOther("carol", a) || !senderAllowed(allowed, a.String(), a) {
					t.Fatalf("carol may not send as %s (she owns *@%s)", a, d)
				}
				if address.DomainKey(a.Domain) != canon {
					t.Fatalf("recipient domain of %s is %q, want %q", a, address.DomainKey(a.Domain), canon)
				}
			}
		}
	})
}

// Recipients in two spellings of one domain are one destination: the
// queue gets the canonical domain for both, and each address as written.
func TestRcpt_CanonicalDomain(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@app.test> SMTPUTF8", "250 ")
	for _, r := range []string{"x@bücher.test", "y@XN--BCHER-KVA.test", "z@Bücher.Test"} {
		c.cmd("RCPT TO:<"+r+">", "250 ")
	}
	c.cmd("DATA", "354 ")
	c.write("Subject: s\r\n\r\nx\r\n.\r\n")
	c.expect("250 ")
	var got []string
	for _, r := range e.q.messages()[0].To {
		got = append(got, r.Addr+" "+r.Domain)
	}
	want := "x@bücher.test xn--bcher-kva.test,y@xn--bcher-kva.test xn--bcher-kva.test,z@bücher.test xn--bcher-kva.test"
	if strings.Join(got, ",") != want {
		t.Errorf("recipients %q, want %q", got, want)
	}
}
