// Package dkim signs mail at intake with the sender domain's keys (DKIM,
// RFC 6376; Ed25519 keys per RFC 8463), using github.com/emersion/go-msgauth
// for the canonicalisation and the signature itself.
//
// Design notes:
//
//   - The signing domain is the domain of the message's From header (the
//     RFC 5322.From author), not the envelope sender: DMARC (RFC 7489 §3.1)
//     aligns d= with the From domain, and a signature for any other domain
//     does nothing for the message's reputation. A message without exactly
//     one From address has no signing domain.
//   - Signing happens once, at intake, after the relay's own Received
//     header was prepended and before the message is queued: the stored
//     message carries its DKIM-Signature fields, so every retry sends the
//     same signature (a signature made per attempt would change t= and
//     could expire under a long queue wait). Received is never signed: a
//     later hop's Received is added above it anyway, and ours is trace
//     data, not authorship (RFC 6376 §5.4.1 leaves trace fields out).
//   - Every selector configured for the domain signs, each adding its own
//     DKIM-Signature: during a key rotation the old and new key both sign,
//     and an Ed25519 key is meant to sign beside an RSA one, because not
//     every verifier knows Ed25519 yet (RFC 8463 §1).
//   - relaxed/relaxed canonicalisation (RFC 6376 §3.4.2, §3.4.4): simple
//     breaks on the whitespace changes relays make in transit. No l= tag:
//     a signature limited to a body prefix lets anyone append content
//     (RFC 6376 §8.2).
//   - Signed headers are RFC 6376 §5.4.1's recommended set plus
//     Message-ID and the MIME fields. From, To, Subject, Date, Message-ID
//     and Content-Type are "oversigned": h= names them once more than the
//     message has them, so a header of that name added after signing breaks
//     the signature (RFC 6376 §5.4.2, §8.15).
//   - Domains are compared in their canonical form (address.DomainKey: the
//     A-label spelling, lower case, no final dot), so a key configured for
//     "bücher.test" signs mail From "xn--bcher-kva.test" and the reverse,
//     and d= is always the A-label form, the name verifiers look up in
//     DNS (RFC 6376 §3.5 d= is a domain name; RFC 8616 §4 leaves A-labels
//     the form every verifier understands).
//   - Who may have which domain signed is the caller's decision, except for
//     the grants to unauthenticated clients of trusted networks (Grant),
//     which are kept with the keys because they change with them.
//   - Keys are swapped whole (Signer.Store) when the relay re-reads its
//     configuration; a session takes one Keys value and uses it throughout.
package dkim

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/mail"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	msgauth "github.com/emersion/go-msgauth/dkim"

	"github.com/greyrelay/greyrelay/relay/address"
)

// Algorithms, as the a= tag names them.
const (
	RSASHA256     = "rsa-sha256"
	Ed25519SHA256 = "ed25519-sha256"
)

// Selector is one signing key of a domain.
type Selector struct {
	Domain string // signing domain (d=), canonical (address.CanonicalDomain)
	Name   string // selector (s=)
	Key    crypto.Signer
}

// Algorithm returns the selector's a= value.
func (s Selector) Algorithm() string { return Algorithm(s.Key.Public()) }

// Record returns the DNS TXT record that publishes the selector's public
// key at Name._domainkey.Domain.
func (s Selector) Record() string { return Record(s.Key.Public()) }

// Algorithm returns the a= value for a public key: rsa-sha256 or
// ed25519-sha256, or "" for any other key type.
func Algorithm(pub crypto.PublicKey) string {
	switch pub.(type) {
	case *rsa.PublicKey:
		return RSASHA256
	case ed25519.PublicKey:
		return Ed25519SHA256
	}
	return ""
}

// PublicKeyData returns the p= value for pub: the DER SubjectPublicKeyInfo
// for RSA (RFC 6376 §3.6.1), the raw 32-octet key for Ed25519 (RFC 8463
// §4.2), base64-encoded.
func PublicKeyData(pub crypto.PublicKey) string {
	if ed, ok := pub.(ed25519.PublicKey); ok {
		return base64.StdEncoding.EncodeToString(ed)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return ""
	}
	return base64.StdEncoding.EncodeToString(der)
}

// Record returns the key record (RFC 6376 §3.6.1) for pub.
func Record(pub crypto.PublicKey) string {
	k := "rsa"
	if _, ok := pub.(ed25519.PublicKey); ok {
		k = "ed25519"
	}
	return "v=DKIM1; k=" + k + "; p=" + PublicKeyData(pub)
}

// ReadKey reads a PEM private key file (PKCS #8, or PKCS #1 for RSA as
// opendkim-genkey writes it). want, if not empty, is the algorithm the key
// must have (RSASHA256 or Ed25519SHA256).
func ReadKey(path, want string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := ParseKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if got := Algorithm(k.Public()); want != "" && got != want {
		return nil, fmt.Errorf("%s: the key is %s, not %s", path, got, want)
	}
	return k, nil
}

// ParseKey parses a PEM private key: RSA or Ed25519. crypto/x509 itself
// refuses RSA keys under 1024 bits, which RFC 8301 §3.2 tells verifiers
// to ignore.
func ParseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM private key found")
	}
	var key any
	var err error
	switch blk.Type {
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	default:
		return nil, fmt.Errorf("PEM block %q is not a private key (want PRIVATE KEY or RSA PRIVATE KEY)", blk.Type)
	}
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	}
	return nil, fmt.Errorf("unsupported key type %T (want RSA or Ed25519)", key)
}

// Keys is an immutable set of signing keys by domain, with the policy for
// messages from other domains.
type Keys struct {
	domains map[string][]Selector
	refuse  bool
	grants  []Grant
}

// Grant lets clients from Networks that did not authenticate (they relay
// because they are in trusted_networks) have mail From Domains signed.
// Domains are canonical (address.DomainKey); "*" stands for every domain
// with a key, as OpenDKIM signs everything from its InternalHosts.
type Grant struct {
	Networks []netip.Prefix
	Domains  []string
}

// AnyDomain in Grant.Domains grants every domain that has a key.
const AnyDomain = "*"

// NewKeys groups sels by domain, in the order given. refuseUnsigned makes
// a message that no key can sign a refusal rather than relayed unsigned.
func NewKeys(sels []Selector, refuseUnsigned bool) *Keys {
	k := &Keys{domains: map[string][]Selector{}, refuse: refuseUnsigned}
	for _, s := range sels {
		d := address.DomainKey(s.Domain)
		s.Domain = d
		k.domains[d] = append(k.domains[d], s)
	}
	return k
}

// WithGrants returns k with the grants to unauthenticated trusted clients
// replaced by g (domains canonicalised).
func (k *Keys) WithGrants(g []Grant) *Keys {
	c := *k
	c.grants = make([]Grant, len(g))
	for i, gr := range g {
		c.grants[i].Networks = append([]netip.Prefix(nil), gr.Networks...)
		for _, d := range gr.Domains {
			if d != AnyDomain {
				d = address.DomainKey(d)
			}
			c.grants[i].Domains = append(c.grants[i].Domains, d)
		}
	}
	return &c
}

// Granted reports whether an unauthenticated client at addr may have mail
// From domain signed: some grant covers both. Without grants nobody may.
func (k *Keys) Granted(addr netip.Addr, domain string) bool {
	if k == nil {
		return false
	}
	domain = address.DomainKey(domain)
	addr = addr.Unmap()
	for _, g := range k.grants {
		if !containsAddr(g.Networks, addr) {
			continue
		}
		for _, d := range g.Domains {
			if d == AnyDomain || d == domain {
				return true
			}
		}
	}
	return false
}

func containsAddr(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Active reports whether intake has anything to do: some key, or a policy
// that refuses unsigned mail.
func (k *Keys) Active() bool { return k != nil && (len(k.domains) > 0 || k.refuse) }

// RefuseUnsigned reports whether a message no key signs is refused.
func (k *Keys) RefuseUnsigned() bool { return k != nil && k.refuse }

// For returns the selectors of domain (in any spelling: address.DomainKey),
// or nil.
func (k *Keys) For(domain string) []Selector {
	if k == nil {
		return nil
	}
	return k.domains[address.DomainKey(domain)]
}

// Domains returns the number of domains with keys.
func (k *Keys) Domains() int {
	if k == nil {
		return 0
	}
	return len(k.domains)
}

// Selectors returns every selector, by domain and then in the order
// given: the status page lists them with the records to publish.
func (k *Keys) Selectors() []Selector {
	if k == nil {
		return nil
	}
	var out []Selector
	for _, d := range slices.Sorted(maps.Keys(k.domains)) {
		out = append(out, k.domains[d]...)
	}
	return out
}

// Signer holds the current Keys. It is safe for concurrent use; Store
// replaces the keys for every message whose signing starts afterwards.
type Signer struct{ keys atomic.Pointer[Keys] }

// NewSigner returns a Signer holding k.
func NewSigner(k *Keys) *Signer {
	s := &Signer{}
	s.keys.Store(k)
	return s
}

// Keys returns the current keys (nil for a nil Signer).
func (s *Signer) Keys() *Keys {
	if s == nil {
		return nil
	}
	return s.keys.Load()
}

// Store makes k the current keys.
func (s *Signer) Store(k *Keys) { s.keys.Store(k) }

// Plan is the signing of one message: its domain, the selectors that sign
// and the h= list.
type Plan struct {
	Domain    string
	Selectors []Selector
	Headers   []string
}

// ErrNoAuthor is returned by Match when the message has no single From
// address, so no signing domain.
var ErrNoAuthor = errors.New("no single From address")

// Match finds the signing domain of a message from its start head (which
// must hold the whole header section to count headers exactly; a longer
// header section only oversigns less). It returns the plan, or a nil plan
// and the author domain when no key signs for it. The domain is canonical
// (address.DomainKey).
func (k *Keys) Match(head []byte) (*Plan, string, error) {
	hs := parseHeaders(head)
	from := hs.values["from"]
	if len(from) != 1 {
		return nil, "", ErrNoAuthor
	}
	addrs, err := mail.ParseAddressList(from[0])
	if err != nil || len(addrs) != 1 {
		return nil, "", ErrNoAuthor
	}
	at := strings.LastIndexByte(addrs[0].Address, '@')
	if at < 0 {
		return nil, "", ErrNoAuthor
	}
	domain := address.DomainKey(addrs[0].Address[at+1:])
	sels := k.For(domain)
	if len(sels) == 0 {
		return nil, domain, nil
	}
	return &Plan{Domain: domain, Selectors: sels, Headers: signedHeaders(hs.count)}, domain, nil
}

// ErrBadAuthor is returned by Authors when a From or Sender field does
// not parse as a list of addresses.
var ErrBadAuthor = errors.New("a From or Sender field is not a list of addresses")

// Authors returns the address of every mailbox in the From and Sender
// fields of the header section at the start of head: whom a reader, and
// DMARC for From (RFC 7489 §3.1), takes the message to come from. The
// fields are found as Match finds From, so a message cannot show Match
// one author and Authors another. An empty From group has no address.
func Authors(head []byte) ([]string, error) {
	hs := parseHeaders(head)
	var out []string
	for _, name := range []string{"from", "sender"} {
		for _, v := range hs.values[name] {
			addrs, err := mail.ParseAddressList(v)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrBadAuthor, name, err)
			}
			for _, a := range addrs {
				out = append(out, a.Address)
			}
		}
	}
	return out, nil
}

// Sign reads the whole message from msg and returns the DKIM-Signature
// fields to put in front of it, one per selector, each ending in CRLF.
func (p *Plan) Sign(msg io.Reader) ([]byte, error) {
	signers := make([]*msgauth.Signer, 0, len(p.Selectors))
	defer func() {
		for _, s := range signers {
			s.Close() // a no-op after a successful Close
		}
	}()
	ws := make([]io.Writer, 0, len(p.Selectors))
	for _, sel := range p.Selectors {
		s, err := msgauth.NewSigner(&msgauth.SignOptions{
			Domain: p.Domain, Selector: sel.Name, Signer: sel.Key, Hash: crypto.SHA256,
			HeaderCanonicalization: msgauth.CanonicalizationRelaxed,
			BodyCanonicalization:   msgauth.CanonicalizationRelaxed,
			HeaderKeys:             p.Headers,
		})
		if err != nil {
			return nil, fmt.Errorf("dkim: %s._domainkey.%s: %w", sel.Name, p.Domain, err)
		}
		signers = append(signers, s)
		ws = append(ws, s)
	}
	var end sectionEnd
	if _, err := io.Copy(io.MultiWriter(append(ws, &end)...), msg); err != nil {
		return nil, fmt.Errorf("dkim: %w", err)
	}
	if !end.seen {
		// RFC 5322 allows a message without a body, and so without the
		// empty line; go-msgauth needs it to end the header section.
		// The body is then empty (RFC 6376 §3.4.3, §3.4.4), as verifiers
		// read the message too.
		if _, err := io.WriteString(io.MultiWriter(ws...), "\r\n"); err != nil {
			return nil, fmt.Errorf("dkim: %w", err)
		}
	}
	var out bytes.Buffer
	for i, s := range signers {
		if err := s.Close(); err != nil {
			return nil, fmt.Errorf("dkim: %s._domainkey.%s: %w", p.Selectors[i].Name, p.Domain, err)
		}
		out.WriteString(s.Signature())
	}
	return out.Bytes(), nil
}

// recommended is RFC 6376 §5.4.1's list of fields to sign, with
// Message-ID and the MIME fields, in the order they appear in h=.
var recommended = []string{
	"From", "Reply-To", "Subject", "Date", "To", "Cc",
	"Resent-Date", "Resent-From", "Resent-To", "Resent-Cc",
	"In-Reply-To", "References", "Message-ID",
	"List-Id", "List-Help", "List-Unsubscribe", "List-Subscribe", "List-Post", "List-Owner", "List-Archive",
	"MIME-Version", "Content-Type", "Content-Transfer-Encoding",
}

// oversigned fields are named once more than present, so that one added
// later breaks the signature (and, for an absent one, adding it at all).
var oversigned = map[string]bool{
	"from": true, "to": true, "subject": true, "date": true, "message-id": true, "content-type": true,
}

// signedHeaders returns the h= list for a message with count fields of
// each (lower-case) name.
func signedHeaders(count map[string]int) []string {
	var h []string
	for _, name := range recommended {
		n := count[strings.ToLower(name)]
		if oversigned[strings.ToLower(name)] {
			n++
		}
		for range n {
			h = append(h, name)
		}
	}
	return h
}

// sectionEnd watches a message go by for the empty line that ends its
// header section.
type sectionEnd struct {
	seen    bool
	started bool
	state   int // octets of "\r\n\r\n" matched so far
}

func (e *sectionEnd) Write(p []byte) (int, error) {
	const end = "\r\n\r\n"
	if !e.started {
		e.started, e.state = true, 2 // the message starts as if after a CRLF
	}
	for i := 0; i < len(p) && !e.seen; i++ {
		switch {
		case p[i] == end[e.state]:
			e.state++
			e.seen = e.state == len(end)
		case p[i] == '\r':
			e.state = 1
		default:
			e.state = 0
		}
	}
	return len(p), nil
}

// headers is what Match needs from a header section.
type headers struct {
	count  map[string]int      // fields by lower-case name
	values map[string][]string // unfolded values of the fields Match reads
}

// parseHeaders reads the header section at the start of msg (up to the
// first empty line or the end of msg). Obsolete syntax with blanks before
// the colon (RFC 5322 §4.5) is counted under the trimmed name, as
// go-msgauth reads it.
func parseHeaders(msg []byte) headers {
	h := headers{count: map[string]int{}, values: map[string][]string{}}
	last := ""
	for len(msg) > 0 {
		line := msg
		if i := bytes.Index(msg, []byte("\r\n")); i >= 0 {
			line, msg = msg[:i], msg[i+2:]
		} else {
			msg = nil
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			if last != "" {
				v := h.values[last]
				v[len(v)-1] += " " + strings.TrimSpace(string(line))
			}
			continue
		}
		last = ""
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		n := strings.ToLower(string(bytes.TrimRight(name, " \t")))
		h.count[n]++
		if n == "from" || n == "sender" {
			last = n
			h.values[n] = append(h.values[n], strings.TrimSpace(string(value)))
		}
	}
	return h
}
