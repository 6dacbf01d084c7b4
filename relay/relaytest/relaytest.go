// Package relaytest holds the helpers greyrelay's tests share, so that each
// exists once. It is imported by tests only, next to relay/mx/mxtest (a DNS
// server for tests):
//
//   - two fake SMTP servers. FakeMX is a real SMTP server (go-smtp) whose
//     answers to MAIL, RCPT and the final dot come from a Script, written
//     as transcript lines (Reply("450 4.2.1 mailbox busy")); it records the
//     transactions, AUTH attempts and the whole dialogue. It is the one
//     go-smtp test server: integration/peers' Sink is a FakeMX with the
//     integration tests' scripts and records on top. Peer plays a
//     transcript byte for byte (Step: expect this line, send these bytes),
//     for what a server library will not do: replies cut short, dripped or
//     flooded, a connection closed or silent mid-dialogue.
//   - Loopback hands out 127.0.0.x addresses, distinct among the running
//     tests of a process, so that fake hosts of parallel tests never
//     collide (Linux routes all of 127.0.0.0/8 to lo).
//   - self-signed certificates for TLS peers, and Eventually, a
//     poll-until-true wait for what a test cannot be told about directly
//     (a process or a peer outside the test's goroutines).
//
// Prefer waiting on an event or testing/synctest where the code under test
// can report one; Eventually is for the rest.
package relaytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Cert is a self-signed certificate for test servers, in memory and as PEM
// files (for a relay's tls_cert/tls_key and Postfix's smtpd_tls_*).
type Cert struct {
	CertFile, KeyFile string
	Pair              tls.Certificate // the certificate with its key and Leaf
	Config            *tls.Config     // a server config presenting Pair
	Pool              *x509.CertPool  // trusts exactly this certificate, for clients
}

// SelfSigned makes a P-256 certificate valid from an hour ago for a day,
// for the given host names and IP addresses (the first is also the common
// name), and a pool that trusts it. It is its own trust anchor (a CA).
func SelfSigned(hosts ...string) (tls.Certificate, *x509.CertPool, error) {
	if len(hosts) == 0 {
		return tls.Certificate{}, nil, fmt.Errorf("relaytest: no host for the certificate")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: hosts[0]},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool, nil
}

// NewCert is SelfSigned for hosts (default "localhost" and 127.0.0.1), with
// the certificate and key also written to t.TempDir() (the key readable by
// its owner only).
func NewCert(t testing.TB, hosts ...string) *Cert {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{"localhost", "127.0.0.1"}
	}
	pair, pool, err := SelfSigned(hosts...)
	if err != nil {
		t.Fatalf("relaytest: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(pair.PrivateKey)
	if err != nil {
		t.Fatalf("relaytest: %v", err)
	}
	dir := t.TempDir()
	c := &Cert{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"), Pair: pair, Pool: pool,
		Config: &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pair.Certificate[0]})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(c.CertFile, certPEM, 0o644); err != nil {
		t.Fatalf("relaytest: %v", err)
	}
	if err := os.WriteFile(c.KeyFile, keyPEM, 0o600); err != nil {
		t.Fatalf("relaytest: %v", err)
	}
	return c
}

// Eventually polls check until it returns nil, and fails the test with the
// last error once timeout has passed. The interval starts at 10 ms and
// grows to 250 ms, so a long wait does not spin.
func Eventually(t testing.TB, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := 10 * time.Millisecond
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting %v for %s: %v", timeout, what, err)
		}
		time.Sleep(interval)
		interval = min(interval*3/2, 250*time.Millisecond)
	}
}
