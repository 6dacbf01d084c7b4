package tlspolicy

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// ErrDANEMismatch is returned when no usable TLSA record matches the
// server's certificate chain.
var ErrDANEMismatch = errors.New("no TLSA record matches the server certificate")

// matches reports whether cert matches t (RFC 6698 §2.1.2, §2.1.3).
func matches(t TLSA, cert *x509.Certificate) bool {
	var data []byte
	switch t.Selector {
	case 0:
		data = cert.Raw
	case 1:
		data = cert.RawSubjectPublicKeyInfo
	default:
		return false
	}
	switch t.MatchingType {
	case 0:
	case 1:
		h := sha256.Sum256(data)
		data = h[:]
	case 2:
		h := sha512.Sum512(data)
		data = h[:]
	default:
		return false
	}
	return bytes.Equal(data, t.Data)
}

// VerifyDANE checks a server's chain against the TLSA records of h.
// DANE-EE(3) matches the leaf and ignores names and validity dates (RFC
// 7672 §3.1.1). DANE-TA(2) matches a certificate the server sent (RFC 7672
// §3.1.2: servers must include the trust anchor) and verifies the leaf up
// to it for one of h.Names (§3.2.2). With no usable record, TLS is
// required but not authenticated (§2.2), so any chain passes.
func VerifyDANE(h HostDANE, chain []*x509.Certificate, now time.Time) error {
	if len(chain) == 0 {
		return errors.New("server sent no certificate")
	}
	usable := false
	for _, t := range h.Records {
		if !t.Usable() {
			continue
		}
		usable = true
		if t.Usage == 3 && matches(t, chain[0]) {
			return nil
		}
		if t.Usage == 2 && verifyTA(t, chain, h.Names, now) == nil {
			return nil
		}
	}
	if !usable {
		return nil
	}
	return fmt.Errorf("%w (%s, TLSA at _25._tcp.%s)", ErrDANEMismatch, h.Host, h.Base)
}

// verifyTA verifies chain[0] up to a certificate of chain that matches t.
func verifyTA(t TLSA, chain []*x509.Certificate, names []string, now time.Time) error {
	for i, c := range chain {
		if !matches(t, c) {
			continue
		}
		roots := x509.NewCertPool()
		roots.AddCert(c)
		inter := x509.NewCertPool()
		for _, m := range chain[1:max(i, 1)] {
			inter.AddCert(m)
		}
		var err error
		for _, n := range names {
			_, err = chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
				DNSName: n, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
			if err == nil {
				return nil
			}
		}
		return err
	}
	return ErrDANEMismatch
}

// DANEConfig returns base (cloned) with a VerifyConnection callback that
// authenticates the server by h's TLSA records. InsecureSkipVerify is set
// because WebPKI verification must not run for DANE-EE (a self-signed
// certificate is fine there); the callback is the verification.
func DANEConfig(base *tls.Config, h HostDANE, now func() time.Time) *tls.Config {
	cfg := &tls.Config{}
	if base != nil {
		cfg = base.Clone()
	}
	cfg.InsecureSkipVerify = true
	// RFC 7672 §3.2.2: the SNI is the TLSA base domain (the CNAME-expanded
	// name when the records were found there).
	cfg.ServerName = h.Base
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		return VerifyDANE(h, cs.PeerCertificates, now())
	}
	return cfg
}

// VerifyWebPKI checks a server's chain as MTA-STS requires (RFC 8461
// §4.2): the leaf is valid for host and chains, through the certificates
// the server sent, to one of roots (the system's when nil) at now. Its
// errors are crypto/x509's, which tell a name mismatch
// (x509.HostnameError), an expired certificate and an unknown authority
// apart for TLS reports.
func VerifyWebPKI(roots *x509.CertPool, host string, chain []*x509.Certificate, now time.Time) error {
	if len(chain) == 0 {
		return errors.New("server sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: host, CurrentTime: now})
	return err
}
