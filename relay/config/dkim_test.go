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

// Configured domains are kept in their canonical form, whatever spelling
// the file uses; two spellings of one domain as keys are an error.
func TestLoad_CanonicalDomains(t *testing.T) {
	good := writeEd25519Key(t)
	file := "dkim:\n  domains:\n    Bücher.Test.: {selectors: [{selector: s1, key_file: " + good + "}]}\n" +
		"  trusted_clients: [{networks: [10.0.0.0/8], domains: [\"*\", MÜNCHEN.test.]}]\n" +
		"delivery:\n  routes: {\"XN--MNCHEN-3YA.test.\": \"127.0.0.1:2526\", Example.COM: \"127.0.0.1:2527\"}\n"
	c, err := load(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.DKIM.Domains["xn--bcher-kva.test"]; !ok || len(c.DKIM.Domains) != 1 {
		t.Errorf("dkim.domains = %v", c.DKIM.Domains)
	}
	if got := c.DKIM.TrustedClients[0].Domains; strings.Join(got, ",") != "*,xn--mnchen-3ya.test" {
		t.Errorf("trusted_clients domains = %q", got)
	}
	if c.Delivery.Routes["xn--mnchen-3ya.test"] != "127.0.0.1:2526" || c.Delivery.Routes["example.com"] != "127.0.0.1:2527" {
		t.Errorf("routes = %v", c.Delivery.Routes)
	}

	_, err = load(t, "delivery:\n  routes: {bücher.test: \"127.0.0.1:1\", xn--bcher-kva.test: \"127.0.0.1:2\"}\n", nil)
	if err == nil || !strings.Contains(err.Error(), "are the same domain (xn--bcher-kva.test)") {
		t.Errorf("two spellings of one route: %v", err)
	}
}

// The defaults: foreign header senders are refused, and loopback clients
// may have every domain signed (OpenDKIM's default InternalHosts).
func TestValidate_IdentityKeys(t *testing.T) {
	c, err := load(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ForeignHeaderFrom != "refuse" || len(c.DKIM.TrustedClients) != 1 ||
		strings.Join(c.DKIM.TrustedClients[0].Networks, ",") != "127.0.0.0/8,::1/128" || strings.Join(c.DKIM.TrustedClients[0].Domains, ",") != "*" {
		t.Errorf("defaults: foreign_header_from %q, trusted_clients %+v", c.ForeignHeaderFrom, c.DKIM.TrustedClients)
	}
	for _, tc := range []struct{ name, file, want string }{
		{"unsigned", "foreign_header_from: unsigned\n", ""},
		{"bad policy", "foreign_header_from: accept\n", "foreign_header_from"},
		{"bad network", "dkim:\n  trusted_clients: [{networks: [10.0.0.300/8], domains: [\"*\"]}]\n", "dkim.trusted_clients[0].networks"},
		{"no networks", "dkim:\n  trusted_clients: [{networks: [], domains: [\"*\"]}]\n", "dkim.trusted_clients[0].networks: at least one"},
		{"no domains", "dkim:\n  trusted_clients: [{networks: [10.0.0.0/8]}]\n", "dkim.trusted_clients[0].domains: at least one"},
		{"bad domain", "dkim:\n  trusted_clients: [{networks: [10.0.0.0/8], domains: [\"*.example.com\"]}]\n", "is not a domain name"},
		{"none", "dkim:\n  trusted_clients: []\n", ""},
	} {
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

// A trusted network no dkim.trusted_clients entry covers is warned about
// when there are keys: its mail goes out unsigned.
func TestWarnings_UnsignedTrustedNetwork(t *testing.T) {
	good := writeEd25519Key(t)
	keys := "dkim:\n  domains:\n    example.com: {selectors: [{selector: s1, key_file: " + good + "}]}\n"
	for _, tc := range []struct{ file, want string }{
		{keys, ""},
		{keys + "trusted_networks: [127.0.0.0/8, 10.1.0.0/16]\n", "clients from 10.1.0.0/16 relay without AUTH"},
		{keys + "  trusted_clients: [{networks: [10.0.0.0/8], domains: [example.com]}]\ntrusted_networks: [10.1.0.0/16]\n", ""},
		{"trusted_networks: [10.1.0.0/16]\n", ""},
	} {
		c, err := load(t, tc.file, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(c.Warnings(), "\n")
		if tc.want == "" && strings.Contains(got, "dkim.trusted_clients") || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%q: warnings %q, want %q", tc.file, got, tc.want)
		}
	}
}
