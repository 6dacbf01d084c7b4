package config

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeEd25519Key(t *testing.T) string {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ed.key")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every DKIM key is read by Validate: a missing or malformed one, or one
// of another algorithm than configured, is an error naming its key.
func TestValidate_DKIM(t *testing.T) {
	good := writeEd25519Key(t)
	junk := filepath.Join(t.TempDir(), "junk.key")
	if err := os.WriteFile(junk, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	sel := func(s string) string { return "dkim:\n  domains:\n    example.com:\n      selectors: [" + s + "]\n" }
	cases := []struct{ name, file, want string }{
		{"valid", sel("{selector: s1, key_file: " + good + ", algorithm: ed25519-sha256}"), ""},
		{"missing key", sel("{selector: s1, key_file: /nonexistent.key}"), "dkim.domains.example.com.selectors[0].key_file"},
		{"malformed key", sel("{selector: s1, key_file: " + junk + "}"), "no PEM private key"},
		{"wrong algorithm", sel("{selector: s1, key_file: " + good + ", algorithm: rsa-sha256}"), "not rsa-sha256"},
		{"bad algorithm", sel("{selector: s1, key_file: " + good + ", algorithm: rsa-sha1}"), "selectors[0].algorithm"},
		{"no key file", sel("{selector: s1}"), "key_file: empty"},
		{"duplicate selector", sel("{selector: s1, key_file: " + good + "}, {selector: S1, key_file: " + good + "}"), "listed twice"},
		{"no selectors", "dkim:\n  domains:\n    example.com: {selectors: []}\n", "at least one"},
		{"refuse without keys", "dkim:\n  without_key: refuse\n", "would refuse every message"},
		{"bad policy", "dkim:\n  without_key: drop\n", "dkim.without_key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.file, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = c.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want mention of %q", err, tc.want)
			}
		})
	}
}

// dkim.domains is a map of structures: the environment cannot set it, and
// says so instead of panicking.
func TestLoad_DKIMDomainsNotFromEnvironment(t *testing.T) {
	_, err := load(t, "", map[string]string{"GREYRELAY_DKIM_DOMAINS": "example.com=x"})
	if err == nil || !strings.Contains(err.Error(), "GREYRELAY_DKIM_DOMAINS") {
		t.Errorf("err = %v", err)
	}
	c, err := load(t, "", map[string]string{"GREYRELAY_DKIM_WITHOUT_KEY": "refuse"})
	if err != nil || c.DKIM.WithoutKey != "refuse" {
		t.Errorf("GREYRELAY_DKIM_WITHOUT_KEY: %v %q", err, c.DKIM.WithoutKey)
	}
}
