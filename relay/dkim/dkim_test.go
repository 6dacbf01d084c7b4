package dkim

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	msgauth "github.com/emersion/go-msgauth/dkim"

	"github.com/greyrelay/greyrelay/internal/spelling"
	"github.com/greyrelay/greyrelay/relay/address"
)

func testKeys(t *testing.T) (rsaKey *rsa.PrivateKey, edKey ed25519.PrivateKey) {
	t.Helper()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err = ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return rsaKey, edKey
}

const testMsg = "Received: from client (127.0.0.1) by relay.test; Tue, 1 Dec 2026 10:00:00 +0000\r\n" +
	"From: Alice <alice@Example.COM>\r\n" +
	"To: bob@dest.test\r\n" +
	"Subject: hello\r\n" +
	"Date: Tue, 1 Dec 2026 10:00:00 +0000\r\n" +
	"Message-ID: <1@example.com>\r\n" +
	"X-Other: not signed\r\n" +
	"\r\n" +
	"body line\r\n"

// verify checks every signature of msg against the records.
func verify(t *testing.T, msg []byte, records map[string]string) []*msgauth.Verification {
	t.Helper()
	vs, err := msgauth.VerifyWithOptions(bytes.NewReader(msg), &msgauth.VerifyOptions{
		LookupTXT: func(name string) ([]string, error) {
			if r, ok := records[name]; ok {
				return []string{r}, nil
			}
			return nil, errors.New("no record " + name)
		}})
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// A message is signed by every selector of its From domain; both
// signatures verify, cover the recommended fields with the oversigned
// ones named once more, never Received or unlisted fields, and have no
// l= tag; altering a signed field or the body breaks both.
func TestSign_VerifiesAndCoversTheRightFields(t *testing.T) {
	rk, ek := testKeys(t)
	keys := NewKeys([]Selector{{Domain: "example.com", Name: "r1", Key: rk}, {Domain: "example.com", Name: "e1", Key: ek}}, false)
	plan, dom, err := keys.Match([]byte(testMsg))
	if err != nil || plan == nil || dom != "example.com" {
		t.Fatalf("Match: %v %q %v", plan, dom, err)
	}
	sig, err := plan.Sign(strings.NewReader(testMsg))
	if err != nil {
		t.Fatal(err)
	}
	signed := append(sig, testMsg...)
	recs := map[string]string{
		"r1._domainkey.example.com": Record(rk.Public()),
		"e1._domainkey.example.com": Record(ek.Public()),
	}
	vs := verify(t, signed, recs)
	if len(vs) != 2 {
		t.Fatalf("%d signatures, want 2", len(vs))
	}
	wantH := []string{"From", "From", "Subject", "Subject", "Date", "Date", "To", "To",
		"Message-ID", "Message-ID", "Content-Type"}
	for _, v := range vs {
		if v.Err != nil {
			t.Errorf("%s: %v", v.Domain, v.Err)
		}
		if !slices.Equal(v.HeaderKeys, wantH) {
			t.Errorf("h=%v, want %v", v.HeaderKeys, wantH)
		}
	}
	if !strings.Contains(string(sig), "c=relaxed/relaxed") || !strings.Contains(string(sig), "a=ed25519-sha256") ||
		!strings.Contains(string(sig), "a=rsa-sha256") || strings.Contains(strings.Join(strings.Fields(string(sig)), ""), ";l=") {
		t.Errorf("signature fields: %s", sig)
	}
	for name, alter := range map[string]func(string) string{
		"subject":  func(m string) string { return strings.Replace(m, "Subject: hello", "Subject: hullo", 1) },
		"body":     func(m string) string { return strings.Replace(m, "body line", "body lime", 1) },
		"added To": func(m string) string { return strings.Replace(m, "\r\n\r\n", "\r\nTo: eve@evil.test\r\n\r\n", 1) },
		// Reply-To is signed when present, not oversigned: adding one keeps
		// the signature valid.
		"added Reply-To": func(m string) string { return strings.Replace(m, "\r\n\r\n", "\r\nReply-To: x@y.test\r\n\r\n", 1) },
	} {
		vs := verify(t, []byte(alter(string(signed))), recs)
		for _, v := range vs {
			if ok := v.Err == nil; ok != (name == "added Reply-To") {
				t.Errorf("%s: verification error %v", name, v.Err)
			}
		}
	}
	// Our Received field is outside the signed set: a changed one verifies.
	changed := strings.Replace(string(signed), "by relay.test", "by other.test", 1)
	for _, v := range verify(t, []byte(changed), recs) {
		if v.Err != nil {
			t.Errorf("changed Received: %v", v.Err)
		}
	}
}

func TestMatch(t *testing.T) {
	_, ek := testKeys(t)
	keys := NewKeys([]Selector{{Domain: "Example.com.", Name: "e1", Key: ek}}, true)
	for _, tc := range []struct {
		head, domain string
		signs        bool
		err          error
	}{
		{"From: a@example.com\r\n\r\n", "example.com", true, nil},
		{"from : \"A, B\" <a@EXAMPLE.com>\r\n\r\nx", "example.com", true, nil},
		{"From: A\r\n <a@example.com>\r\n\r\n", "example.com", true, nil},
		{"From: a@other.test\r\n\r\n", "other.test", false, nil},
		{"Subject: x\r\n\r\nFrom: a@example.com\r\n", "", false, ErrNoAuthor},
		{"From: a@example.com\r\nFrom: b@example.com\r\n\r\n", "", false, ErrNoAuthor},
		{"From: a@example.com, b@example.com\r\n\r\n", "", false, ErrNoAuthor},
		{"From: undisclosed\r\n\r\n", "", false, ErrNoAuthor},
	} {
		plan, dom, err := keys.Match([]byte(tc.head))
		if (plan != nil) != tc.signs || dom != tc.domain || !errors.Is(err, tc.err) {
			t.Errorf("%q: plan %v domain %q err %v", tc.head, plan != nil, dom, err)
		}
	}
	if !keys.Active() || !keys.RefuseUnsigned() || (*Keys)(nil).Active() || NewKeys(nil, false).Active() {
		t.Error("Active/RefuseUnsigned")
	}
}

func writePEM(t *testing.T, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "k.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadKey(t *testing.T) {
	rk, ek := testKeys(t)
	pk8 := func(k crypto.Signer) []byte {
		b, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name, path, want, errHas string
	}{
		{"rsa pkcs1", writePEM(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rk)), RSASHA256, ""},
		{"rsa pkcs8", writePEM(t, "PRIVATE KEY", pk8(rk)), "", ""},
		{"ed25519", writePEM(t, "PRIVATE KEY", pk8(ek)), Ed25519SHA256, ""},
		{"wrong algorithm", writePEM(t, "PRIVATE KEY", pk8(ek)), RSASHA256, "not rsa-sha256"},
		{"public key", writePEM(t, "PUBLIC KEY", []byte{1}), "", "not a private key"},
		{"garbage", writePEM(t, "PRIVATE KEY", []byte("junk")), "", "asn1"},
		{"missing", filepath.Join(t.TempDir(), "nope"), "", "no such file"},
	} {
		_, err := ReadKey(tc.path, tc.want)
		if (err == nil) != (tc.errHas == "") || err != nil && !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%s: %v, want error containing %q", tc.name, err, tc.errHas)
		}
	}
}

// RFC 8463 §4.2: an Ed25519 key record carries the raw 32-octet key.
func TestRecord(t *testing.T) {
	rk, ek := testKeys(t)
	if r := Record(ek.Public()); !strings.HasPrefix(r, "v=DKIM1; k=ed25519; p=") || len(r) != len("v=DKIM1; k=ed25519; p=")+44 {
		t.Errorf("ed25519 record %q", r)
	}
	if r := Record(rk.Public()); !strings.HasPrefix(r, "v=DKIM1; k=rsa; p=MIIBIjAN") {
		t.Errorf("rsa record %q", r)
	}
}

func FuzzMatch(f *testing.F) {
	f.Add([]byte(testMsg))
	f.Add([]byte("From: \r\n \r\n\r\n"))
	_, ek, _ := ed25519.GenerateKey(rand.Reader)
	keys := NewKeys([]Selector{{Domain: "example.com", Name: "e1", Key: ek}}, false)
	f.Fuzz(func(t *testing.T, head []byte) {
		plan, _, _ := keys.Match(head)
		if plan != nil && !slices.Contains(plan.Headers, "From") {
			t.Fatalf("plan without From: %v", plan.Headers)
		}
	})
}

// A message may end in its header section (no empty line, no body):
// it is signed with an empty body and verifies.
func TestSign_NoBody(t *testing.T) {
	_, ek := testKeys(t)
	keys := NewKeys([]Selector{{Domain: "example.com", Name: "e1", Key: ek}}, false)
	msg := "From: a@example.com\r\nSubject: headers only\r\n"
	plan, _, err := keys.Match([]byte(msg))
	if err != nil || plan == nil {
		t.Fatal(plan, err)
	}
	sig, err := plan.Sign(strings.NewReader(msg))
	if err != nil {
		t.Fatal(err)
	}
	// go-msgauth's verifier needs the empty line too: give it one, which
	// changes nothing DKIM hashes.
	for _, v := range verify(t, append(sig, msg+"\r\n"...), map[string]string{"e1._domainkey.example.com": Record(ek.Public())}) {
		if v.Err != nil {
			t.Error(v.Err)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	_, ek, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(ek)
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	f.Add([]byte("-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseKey(b)
		if err == nil && Algorithm(k.Public()) == "" {
			t.Fatalf("accepted a key of type %T", k)
		}
	})
}

func TestSectionEnd(t *testing.T) {
	for _, tc := range []struct {
		chunks []string
		want   bool
	}{
		{[]string{"A: b\r\n\r\nbody"}, true},
		{[]string{"A: b\r", "\n\r", "\nbody"}, true},
		{[]string{"\r\nbody only"}, true},
		{[]string{"A: b\r\n"}, false},
		{[]string{"A: b\r\r\n\r\n"}, true},
		{[]string{"A: b\n\nc\r\n"}, false},
		{[]string{"A: b\r\n \r\nB: c\r\n"}, false},
	} {
		var e sectionEnd
		for _, c := range tc.chunks {
			e.Write([]byte(c))
		}
		if e.seen != tc.want {
			t.Errorf("%q: seen %v, want %v", tc.chunks, e.seen, tc.want)
		}
	}
}

// TestMatch_Spellings: a key configured under one spelling of a domain
// signs mail From any other spelling, and d= is the A-label form.
func TestMatch_Spellings(t *testing.T) {
	_, ek := testKeys(t)
	for _, configured := range []string{"bücher.test", "XN--BCHER-KVA.test.", "Bücher.Test"} {
		keys := NewKeys([]Selector{{Domain: configured, Name: "e1", Key: ek}}, false)
		for _, from := range spelling.Of("bücher.test") {
			if strings.HasSuffix(from, ".") {
				continue // not an RFC 5322 addr-spec: no From domain at all
			}
			plan, dom, err := keys.Match([]byte("From: a@" + from + "\r\n\r\n"))
			if err != nil || plan == nil || plan.Domain != "xn--bcher-kva.test" || dom != plan.Domain {
				t.Errorf("key for %q, From a@%s: plan %v, domain %q, %v", configured, from, plan != nil, dom, err)
			}
		}
	}
}

// FuzzKeysSpellings: whatever domain a key is configured under, every
// spelling of it finds the key, and so does every spelling in a From field.
func FuzzKeysSpellings(f *testing.F) {
	for _, s := range []string{"example.com", "bücher.test", "xn--mnchen-3ya.test", "日本語.jp", "Straße.test"} {
		f.Add(s)
	}
	_, ek, _ := ed25519.GenerateKey(rand.Reader)
	f.Fuzz(func(t *testing.T, d string) {
		canon, err := address.CanonicalDomain(d)
		if err != nil || strings.HasPrefix(canon, "[") {
			return
		}
		keys := NewKeys([]Selector{{Domain: d, Name: "e1", Key: ek}}, false)
		grant := keys.WithGrants([]Grant{{Networks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Domains: []string{d}}})
		for _, sp := range spelling.Of(d) {
			if len(keys.For(sp)) != 1 {
				t.Fatalf("key for %q not found as %q", d, sp)
			}
			if plan, _, _ := keys.Match([]byte("From: <a@" + sp + ">\r\n\r\n")); !strings.HasSuffix(sp, ".") && (plan == nil || plan.Domain != canon) {
				t.Fatalf("key for %q: From a@%s has no plan for %q", d, sp, canon)
			}
			if !grant.Granted(netip.MustParseAddr("127.0.0.1"), sp) {
				t.Fatalf("grant for %q does not cover %q", d, sp)
			}
		}
	})
}

func TestGranted(t *testing.T) {
	_, ek := testKeys(t)
	keys := NewKeys([]Selector{{Domain: "a.test", Name: "e1", Key: ek}, {Domain: "bücher.test", Name: "e1", Key: ek}}, false)
	if keys.Granted(netip.MustParseAddr("127.0.0.1"), "a.test") {
		t.Error("granted without grants")
	}
	keys = keys.WithGrants([]Grant{
		{Networks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, Domains: []string{AnyDomain}},
		{Networks: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, Domains: []string{"xn--bcher-kva.test"}},
	})
	for _, c := range []struct {
		addr, domain string
		want         bool
	}{
		{"127.0.0.1", "a.test", true},
		{"::1", "anything.test", true},
		{"::ffff:127.0.0.1", "a.test", true},
		{"10.1.2.3", "bücher.test", true},
		{"10.1.2.3", "BÜCHER.test.", true},
		{"10.1.2.3", "a.test", false},
		{"10.2.0.1", "bücher.test", false},
	} {
		if got := keys.Granted(netip.MustParseAddr(c.addr), c.domain); got != c.want {
			t.Errorf("Granted(%s, %s) = %v, want %v", c.addr, c.domain, got, c.want)
		}
	}
}

func TestAuthors(t *testing.T) {
	for _, c := range []struct {
		head string
		want []string
		err  bool
	}{
		{"From: A <a@a.test>\r\nSubject: x\r\n\r\n", []string{"a@a.test"}, false},
		{"From: a@a.test, b@b.test\r\nSender: s@s.test\r\n\r\n", []string{"a@a.test", "b@b.test", "s@s.test"}, false},
		{"From: a@a.test\r\nFROM : b@b.test\r\n\r\n", []string{"a@a.test", "b@b.test"}, false},
		{"Subject: x\r\n\r\nFrom: a@a.test\r\n", nil, false},
		{"From: Alice\r\n <alice@a.test>\r\n\r\n", []string{"alice@a.test"}, false},
		{"From: undisclosed\r\n\r\n", nil, true},
		{"From: a@a.test\r\nSender: <\r\n\r\n", nil, true},
	} {
		got, err := Authors([]byte(c.head))
		if (err != nil) != c.err || !slices.Equal(got, c.want) {
			t.Errorf("%q: %q, %v; want %q (error %v)", c.head, got, err, c.want, c.err)
		}
	}
}
