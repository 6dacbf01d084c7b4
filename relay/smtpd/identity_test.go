package smtpd

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dkim"
)

// identityUsers: bob may send only as bob@b.test, alice owns alice@a.test,
// carol owns *@bücher.test, app has no list.
func identityUsers(t testing.TB) *Users {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	u, err := ParseUsers(strings.NewReader("bob:" + string(h) + ":bob@b.test\n" +
		"alice:" + string(h) + ":alice@a.test\ncarol:" + string(h) + ":*@bücher.test\napp:" + string(h) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// identitySigner has keys for a.test, b.test, bücher.test and free.test;
// grants is dkim.trusted_clients.
func identitySigner(t testing.TB, refuse bool, grants []dkim.Grant) *dkim.Signer {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var sels []dkim.Selector
	for _, d := range []string{"a.test", "b.test", "bücher.test", "free.test"} {
		sels = append(sels, dkim.Selector{Domain: d, Name: "s1", Key: k})
	}
	return dkim.NewSigner(dkim.NewKeys(sels, refuse).WithGrants(grants))
}

// authed dials e and authenticates as user.
func authed(t *testing.T, e *testEnv, user string) *client {
	t.Helper()
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("AUTH PLAIN "+plainAuth("", user, "pw"), "235 ")
	return c
}

// signedBy returns the d= of the DKIM signature at the start of body, or "".
func signedBy(body []byte) string {
	if !bytes.HasPrefix(body, []byte("DKIM-Signature: ")) {
		return ""
	}
	i := bytes.Index(body, []byte(" d="))
	if i < 0 {
		return "?"
	}
	d := body[i+3:]
	return string(d[:bytes.IndexByte(d, ';')])
}

// TestData_HeaderFromIsIdentity is the DMARC-aligned forgery: bob, who may
// send only as bob@b.test, puts alice's address in From (or Sender). It is
// refused after DATA with 550 5.7.1 and nothing is queued, however the
// address is spelt; his own address in any spelling is signed.
func TestData_HeaderFromIsIdentity(t *testing.T) {
	e := startServer(t, testConfig(t), withUsers(identityUsers(t)),
		func(o *Options) { o.DKIM = identitySigner(t, false, nil) })
	for _, c := range []struct {
		user, head, want, signed string
	}{
		{"bob", "From: Alice <alice@a.test>\r\n", "550 5.7.1 Header From/Sender <alice@a.test>: Sender address rejected: not owned by user bob", ""},
		{"bob", "From: Bob <bob@b.test>\r\nSender: alice@a.test\r\n", "550 5.7.1", ""},
		{"bob", "From: bob@b.test, alice@a.test\r\n", "550 5.7.1", ""},
		{"bob", "From: bob@b.test\r\nFrom: alice@a.test\r\n", "550 5.7.1", ""},
		{"bob", "From: x@xn--bcher-kva.test\r\n", "550 5.7.1", ""},
		{"bob", "From: undisclosed\r\n", "550 5.7.1 Header From/Sender (not a list of addresses)", ""},
		{"bob", "Subject: no author\r\n", "250 ", ""},
		{"bob", "From: Bob <BOB@B.TEST>\r\n", "250 ", "b.test"},
		// app has no list: anything nobody owns, nothing anybody owns.
		{"app", "From: alice@a.test\r\n", "550 5.7.1", ""},
		{"app", "From: news@Bücher.test\r\n", "550 5.7.1", ""},
		{"app", "From: app@free.test\r\n", "250 ", "free.test"},
		{"carol", "From: carol@xn--bcher-kva.test\r\n", "250 ", "xn--bcher-kva.test"},
		{"carol", "From: carol@bücher.test\r\n", "250 ", "xn--bcher-kva.test"},
	} {
		cl := authed(t, e, c.user)
		before := len(e.q.messages())
		envFrom := map[string]string{"bob": "bob@b.test", "app": "app@free.test", "carol": "carol@bücher.test"}[c.user]
		cl.cmd("MAIL FROM:<"+envFrom+"> SMTPUTF8", "250 ")
		cl.cmd("RCPT TO:<r@dest.test>", "250 ")
		cl.cmd("DATA", "354 ")
		cl.write(c.head + "Subject: s\r\n\r\nhello\r\n.\r\n")
		lines := cl.reply()
		got := lines[len(lines)-1]
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("%s with %q: %q, want %q", c.user, c.head, got, c.want)
			continue
		}
		msgs := e.q.messages()
		if strings.HasPrefix(c.want, "550") {
			if len(msgs) != before {
				t.Errorf("%s with %q: refused but queued", c.user, c.head)
			}
			continue
		}
		if d := signedBy(msgs[len(msgs)-1].Body); d != c.signed {
			t.Errorf("%s with %q: signed d=%q, want %q", c.user, c.head, d, c.signed)
		}
	}
}

// With foreign_header_from: unsigned the forgery is relayed without any
// signature; under dkim.without_key: refuse it is refused after all.
func TestData_HeaderFromUnsigned(t *testing.T) {
	cfg := testConfig(t)
	cfg.ForeignHeaderFrom = "unsigned"
	e := startServer(t, cfg, withUsers(identityUsers(t)), func(o *Options) { o.DKIM = identitySigner(t, false, nil) })
	c := authed(t, e, "bob")
	if got := c.sendMessage("bob@b.test", []string{"r@dest.test"}, "From: alice@a.test\r\n\r\nx\r\n"); !strings.HasPrefix(got, "250 ") {
		t.Fatalf("unsigned: %q", got)
	}
	if d := signedBy(e.q.messages()[0].Body); d != "" {
		t.Errorf("the foreign From was signed d=%s", d)
	}
	if got := c.sendMessage("bob@b.test", []string{"r@dest.test"}, "From: bob@b.test\r\n\r\nx\r\n"); !strings.HasPrefix(got, "250 ") {
		t.Fatalf("own From: %q", got)
	}
	if d := signedBy(e.q.messages()[1].Body); d != "b.test" {
		t.Errorf("bob's own From signed d=%q", d)
	}

	e = startServer(t, cfg, withUsers(identityUsers(t)), func(o *Options) { o.DKIM = identitySigner(t, true, nil) })
	c = authed(t, e, "bob")
	if got := c.sendMessage("bob@b.test", []string{"r@dest.test"}, "From: alice@a.test\r\n\r\nx\r\n"); !strings.HasPrefix(got, "550 5.7.1 ") {
		t.Errorf("unsigned under without_key refuse: %q", got)
	}
}

// A spooled message's header is checked as well, and one whose header
// section is too long to read whole is refused: a From past the part read
// would go unchecked.
func TestSpool_HeaderFromIsIdentity(t *testing.T) {
	e, _ := startSpoolServer(t, func(e *testEnv) { e.srv.users = identityUsers(t) })
	c := authed(t, e, "bob")
	got := c.sendMessage("bob@b.test", []string{"r@example.net"}, "From: alice@a.test\r\n"+bigBody(queue.SpoolThreshold*2))
	if !strings.HasPrefix(got, "550 5.7.1 ") {
		t.Errorf("spooled forgery: %q", got)
	}
	if got := c.sendMessage("bob@b.test", []string{"r@example.net"}, "From: bob@b.test\r\n"+bigBody(queue.SpoolThreshold*2)); !strings.HasPrefix(got, "250 ") {
		t.Errorf("spooled own message: %q", got)
	}
	filler := strings.Repeat("X-Filler: "+strings.Repeat("x", 70)+"\r\n", queue.SpoolThreshold/80+10)
	got = c.sendMessage("bob@b.test", []string{"r@example.net"}, filler+"From: alice@a.test\r\n\r\nx\r\n")
	if !strings.HasPrefix(got, "550 5.7.1 Header From/Sender (header section too long to check)") {
		t.Errorf("From past the part read: %q", got)
	}
}

// TestData_TrustedClientGrants: a client relaying without AUTH gets
// signatures only for the domains dkim.trusted_clients grants its network;
// another domain with a key is relayed unsigned, or refused under
// without_key: refuse. Without any grant nothing is signed.
func TestData_TrustedClientGrants(t *testing.T) {
	cfg := trustedConfig(t)
	grants := []dkim.Grant{
		{Networks: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, Domains: []string{"xn--bcher-kva.test"}},
		{Networks: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, Domains: []string{dkim.AnyDomain}},
	}
	e := startServer(t, cfg, func(o *Options) { o.DKIM = identitySigner(t, false, grants) })
	for _, c := range []struct{ src, from, signed string }{
		{"127.0.0.1", "x@bücher.test", "xn--bcher-kva.test"},
		{"127.0.0.1", "x@XN--BCHER-KVA.test", "xn--bcher-kva.test"},
		{"127.0.0.1", "x@a.test", ""},
		{"127.0.0.2", "x@a.test", "a.test"},
		{"127.0.0.3", "x@a.test", ""},
	} {
		cl := dialFrom(t, e.addr(0), c.src)
		cl.hello()
		before := len(e.q.messages())
		cl.cmd("MAIL FROM:<app@app.test> SMTPUTF8", "250 ")
		cl.cmd("RCPT TO:<r@dest.test>", "250 ")
		cl.cmd("DATA", "354 ")
		cl.write("From: " + c.from + "\r\n\r\nx\r\n.\r\n")
		cl.expect("250 ")
		msgs := e.q.messages()
		if len(msgs) != before+1 {
			t.Fatalf("%s From %s: not queued", c.src, c.from)
		}
		if d := signedBy(msgs[before].Body); d != c.signed {
			t.Errorf("%s From %s: signed d=%q, want %q", c.src, c.from, d, c.signed)
		}
	}

	e = startServer(t, cfg, func(o *Options) { o.DKIM = identitySigner(t, true, grants) })
	cl := dialFrom(t, e.addr(0), "127.0.0.1")
	cl.hello()
	if got := cl.sendMessage("app@app.test", []string{"r@dest.test"}, "From: x@a.test\r\n\r\nx\r\n"); !strings.HasPrefix(got, "550 5.7.1 This client may not have the From domain a.test signed") {
		t.Errorf("ungranted domain under without_key refuse: %q", got)
	}
}

// A bounce relayed by a smarthost client (MAIL FROM:<>, which its list
// allows) names the client's MTA in From (MAILER-DAEMON@its-host-name): it
// is relayed unsigned, never refused, so the client's bounces still go out;
// a signature for a domain the user owns is still made.
func TestData_BounceWithForeignFromUnsigned(t *testing.T) {
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	users, err := ParseUsers(strings.NewReader("smarthost:" + string(h) + ":*@b.test,<>\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := startServer(t, testConfig(t), withUsers(users), func(o *Options) { o.DKIM = identitySigner(t, false, nil) })
	c := authed(t, e, "smarthost")
	for _, tc := range []struct{ from, head, signed string }{
		{"", "From: MAILER-DAEMON@client.b-host.test\r\n", ""},
		{"", "From: postmaster@b.test\r\n", "b.test"},
	} {
		before := len(e.q.messages())
		if got := c.sendMessage(tc.from, []string{"r@dest.test"}, tc.head+"\r\nbounce\r\n"); !strings.HasPrefix(got, "250 ") {
			t.Errorf("bounce with %q: %q, want 250", tc.head, got)
			continue
		}
		msgs := e.q.messages()
		if len(msgs) != before+1 {
			t.Fatalf("bounce with %q: not queued", tc.head)
		}
		if d := signedBy(msgs[len(msgs)-1].Body); d != tc.signed {
			t.Errorf("bounce with %q: signed d=%q, want %q", tc.head, d, tc.signed)
		}
	}
	// The same foreign From with a sender is still refused.
	if got := c.sendMessage("x@b.test", []string{"r@dest.test"}, "From: MAILER-DAEMON@client.b-host.test\r\n\r\nx\r\n"); !strings.HasPrefix(got, "550 5.7.1") {
		t.Errorf("foreign From with a sender: %q, want 550 5.7.1", got)
	}
}
