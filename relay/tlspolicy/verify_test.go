package tlspolicy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"
)

var now0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// issue makes a certificate for name signed by parent (self-signed if nil).
func issue(t *testing.T, name string, isCA bool, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, notAfter time.Time) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: now0.Add(-time.Hour), NotAfter: notAfter, DNSNames: []string{name},
		BasicConstraintsValid: true, IsCA: isCA, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func sha(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

// TestVerifyDANE covers RFC 7672 §3.1: DANE-EE matches the leaf whatever
// its name and dates; DANE-TA needs a chain to the matched anchor and the
// MX name; PKIX usages are unusable (TLS without authentication).
func TestVerifyDANE(t *testing.T) {
	ca, caKey := issue(t, "ca.test", true, nil, nil, now0.Add(24*time.Hour))
	leaf, _ := issue(t, "mx.dane.test", false, ca, caKey, now0.Add(24*time.Hour))
	expired, _ := issue(t, "other.test", false, nil, nil, now0.Add(-time.Minute))
	host := func(rs ...TLSA) HostDANE {
		return HostDANE{Host: "mx.dane.test", Base: "mx.dane.test", Names: []string{"mx.dane.test"}, State: Secure, Records: rs}
	}
	for _, c := range []struct {
		name  string
		h     HostDANE
		chain []*x509.Certificate
		ok    bool
	}{
		{"EE SPKI", host(TLSA{3, 1, 1, sha(leaf.RawSubjectPublicKeyInfo)}), []*x509.Certificate{leaf, ca}, true},
		{"EE full, expired and misnamed", host(TLSA{3, 0, 0, expired.Raw}), []*x509.Certificate{expired}, true},
		{"EE mismatch", host(TLSA{3, 1, 1, sha(ca.RawSubjectPublicKeyInfo)}), []*x509.Certificate{leaf, ca}, false},
		{"TA", host(TLSA{2, 0, 1, sha(ca.Raw)}), []*x509.Certificate{leaf, ca}, true},
		{"TA anchor not sent", host(TLSA{2, 0, 1, sha(ca.Raw)}), []*x509.Certificate{leaf}, false},
		{"TA wrong name", HostDANE{Host: "mx.other.test", Base: "mx.other.test", Names: []string{"mx.other.test"},
			State: Secure, Records: []TLSA{{2, 0, 1, sha(ca.Raw)}}}, []*x509.Certificate{leaf, ca}, false},
		{"PKIX-EE only: unusable, unauthenticated TLS", host(TLSA{1, 1, 1, sha(ca.RawSubjectPublicKeyInfo)}), []*x509.Certificate{leaf}, true},
		{"PKIX-EE matching, DANE-EE not", host(TLSA{1, 1, 1, sha(leaf.RawSubjectPublicKeyInfo)}, TLSA{3, 1, 1, sha(ca.RawSubjectPublicKeyInfo)}), []*x509.Certificate{leaf}, false},
		{"no certificate", host(TLSA{3, 1, 1, sha(leaf.RawSubjectPublicKeyInfo)}), nil, false},
	} {
		if err := VerifyDANE(c.h, c.chain, now0); (err == nil) != c.ok {
			t.Errorf("%s: VerifyDANE = %v, want ok=%v", c.name, err, c.ok)
		}
	}
}
