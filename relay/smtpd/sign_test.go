package smtpd

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net/netip"
	"strings"
	"testing"

	msgauth "github.com/emersion/go-msgauth/dkim"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dkim"
)

// loopbackGrant is the default dkim.trusted_clients: loopback clients
// may have every domain with a key signed.
var loopbackGrant = []dkim.Grant{{Networks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, Domains: []string{dkim.AnyDomain}}}

func testSigner(t *testing.T, refuse bool) (*dkim.Signer, map[string]string) {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys := dkim.NewKeys([]dkim.Selector{{Domain: "example.org", Name: "s1", Key: k}}, refuse).WithGrants(loopbackGrant)
	return dkim.NewSigner(keys), map[string]string{"s1._domainkey.example.org": dkim.Record(k.Public())}
}

func verifies(t *testing.T, msg []byte, recs map[string]string) error {
	t.Helper()
	vs, err := msgauth.VerifyWithOptions(bytes.NewReader(msg), &msgauth.VerifyOptions{
		LookupTXT: func(name string) ([]string, error) {
			if r, ok := recs[name]; ok {
				return []string{r}, nil
			}
			return nil, errors.New("no record")
		}})
	if err != nil {
		return err
	}
	if len(vs) != 1 {
		return errors.New("not exactly one signature")
	}
	return vs[0].Err
}

// A message from a domain with a key is stored with its DKIM-Signature in
// front of our Received header; one from another domain is stored
// unchanged; with without_key: refuse it gets 550 5.7.1 and nothing is
// queued.
func TestData_DKIM(t *testing.T) {
	signer, recs := testSigner(t, false)
	e := startServer(t, trustedConfig(t), func(o *Options) { o.DKIM = signer })
	c := dial(t, e.addr(0))
	c.hello()
	c.sendMessage("bounce@example.org", []string{"b@y.example"}, "From: A <a@example.org>\r\nSubject: s\r\n\r\nhello\r\n")
	c.sendMessage("a@example.org", []string{"b@y.example"}, "From: a@other.example\r\nSubject: s\r\n\r\nhello\r\n")
	msgs := e.q.messages()
	signed, plain := msgs[0].Body, msgs[1].Body
	if !bytes.HasPrefix(signed, []byte("DKIM-Signature: ")) || !bytes.Contains(signed, []byte("\r\nReceived: from ")) {
		t.Fatalf("signed message starts %q", signed[:min(len(signed), 200)])
	}
	if err := verifies(t, signed, recs); err != nil {
		t.Errorf("signed message does not verify: %v", err)
	}
	if !bytes.HasPrefix(plain, []byte("Received: ")) {
		t.Errorf("unsigned message starts %q", plain[:40])
	}

	refusing, _ := testSigner(t, true)
	e = startServer(t, trustedConfig(t), func(o *Options) { o.DKIM = refusing })
	c = dial(t, e.addr(0))
	c.hello()
	for _, body := range []string{"From: a@other.example\r\n\r\nx\r\n", "Subject: no from\r\n\r\nx\r\n"} {
		if got := c.sendMessage("a@example.org", []string{"b@y.example"}, body); !strings.HasPrefix(got, "550 5.7.1 ") {
			t.Errorf("without_key refuse: %q", got)
		}
	}
	c.cmd("NOOP", "250 ")
	if n := len(e.q.messages()); n != 0 {
		t.Errorf("%d messages queued, want 0", n)
	}
}

// A spooled body is signed too: the stored file starts with the signature
// and verifies, and only that one spool file is left.
func TestSpool_DKIMSigned(t *testing.T) {
	signer, recs := testSigner(t, false)
	e, q := startSpoolServer(t, func(e *testEnv) { e.srv.dkim = signer })
	c := dial(t, e.addr(0))
	c.hello()
	last := c.sendMessage("a@example.org", []string{"r@example.net"}, "From: a@example.org\r\n"+bigBody(queue.SpoolThreshold*2))
	id, err := queue.ParseID(last[strings.LastIndexByte(last, ' ')+1:])
	if err != nil {
		t.Fatalf("%q: %v", last, err)
	}
	got, err := q.Body(id)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte("DKIM-Signature: ")) {
		t.Fatalf("spooled message starts %q", got[:100])
	}
	if err := verifies(t, got, recs); err != nil {
		t.Errorf("spooled signed message does not verify: %v", err)
	}
	if m, _ := q.Show(id); m.Size != int64(len(got)) {
		t.Errorf("Size = %d, body has %d", m.Size, len(got))
	}
	if n := len(spoolFiles(t, q, e.srv.cfg.Queue.Path)); n != 1 {
		t.Errorf("%d spool files, want 1", n)
	}
}
