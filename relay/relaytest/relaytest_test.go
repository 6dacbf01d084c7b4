package relaytest

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"testing"
	"time"
)

func TestNewCert(t *testing.T) {
	c := NewCert(t, "mx.test", "127.0.0.2")
	for _, name := range []string{"mx.test", "127.0.0.2"} {
		if _, err := c.Pair.Leaf.Verify(x509.VerifyOptions{Roots: c.Pool, DNSName: name}); err != nil {
			t.Errorf("verify %s: %v", name, err)
		}
	}
	if _, err := c.Pair.Leaf.Verify(x509.VerifyOptions{Roots: c.Pool, DNSName: "other.test"}); err == nil {
		t.Error("verified for a name it does not carry")
	}
	if _, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile); err != nil {
		t.Error(err)
	}
	if fi, err := os.Stat(c.KeyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", fi, err)
	}
	if _, _, err := SelfSigned(); err == nil {
		t.Error("SelfSigned without a host succeeded")
	}
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, time.Minute, "three calls", func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if n != 3 {
		t.Errorf("check called %d times, want 3", n)
	}
}
