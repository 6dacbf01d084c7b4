package main

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/dkim"
)

// dkimKeys reads the signing keys the configuration names. Validate has
// read them already; reading again here keeps a file replaced in between
// from being half-used.
func dkimKeys(c config.DKIM) (*dkim.Keys, error) {
	var sels []dkim.Selector
	for dom, d := range c.Domains {
		for i, s := range d.Selectors {
			k, err := dkim.ReadKey(s.KeyFile, s.Algorithm)
			if err != nil {
				return nil, fmt.Errorf("dkim.domains.%s.selectors[%d].key_file: %w", dom, i, err)
			}
			sels = append(sels, dkim.Selector{Domain: dom, Name: s.Selector, Key: k})
		}
	}
	var grants []dkim.Grant
	for i, g := range c.TrustedClients {
		gr := dkim.Grant{Domains: g.Domains}
		for _, n := range g.Networks {
			p, err := netip.ParsePrefix(n)
			if err != nil {
				return nil, fmt.Errorf("dkim.trusted_clients[%d].networks: %w", i, err)
			}
			gr.Networks = append(gr.Networks, p.Masked())
		}
		grants = append(grants, gr)
	}
	return dkim.NewKeys(sels, c.WithoutKey == "refuse").WithGrants(grants), nil
}

// reloadDKIM re-reads the configuration file and swaps in its dkim section
// on every signal from hup until ctx ends. Only the dkim section is taken: the rest
// of a changed file needs a restart, and the log says so. A file or key
// that does not load keeps the keys in use.
func reloadDKIM(ctx context.Context, hup <-chan os.Signal, path string, signer *dkim.Signer, log *zap.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		cfg, err := readConfig(path)
		if err != nil {
			log.Error("SIGHUP: configuration not reloaded, DKIM keys unchanged", zap.Error(err))
			continue
		}
		keys, err := dkimKeys(cfg.DKIM)
		if err != nil {
			log.Error("SIGHUP: DKIM keys unchanged", zap.Error(err))
			continue
		}
		signer.Store(keys)
		log.Info("SIGHUP: DKIM keys reloaded (users_file and api.tokens_file are reloaded too; other settings need a restart)",
			zap.Int("domains", keys.Domains()))
	}
}

// dkimCmd runs `greyrelay dkim keygen [-algorithm A] [-out FILE] DOMAIN SELECTOR`.
func dkimCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: greyrelay dkim keygen [-algorithm rsa2048|ed25519] [-out FILE] DOMAIN SELECTOR"
	if len(args) == 0 || args[0] != "keygen" {
		return &exitError{2, errors.New(use)}
	}
	fs := flag.NewFlagSet("dkim keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	alg := fs.String("algorithm", "rsa2048", "rsa2048 | ed25519")
	out := fs.String("out", "", "private key file to write (default: DOMAIN.SELECTOR.key in the current directory)")
	var pos []string
	for rest := args[1:]; ; {
		if err := fs.Parse(rest); err != nil {
			return &exitError{2, err}
		}
		if fs.NArg() == 0 {
			break
		}
		// Flags may also follow the arguments.
		pos, rest = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(pos) != 2 {
		return &exitError{2, errors.New(use)}
	}
	// The canonical (A-label) form: the name the TXT record is published
	// under and the key file is named by, whichever spelling was typed.
	domain, err := address.CanonicalDomain(pos[0])
	if err != nil || strings.HasPrefix(domain, "[") {
		return &exitError{2, fmt.Errorf("dkim keygen: %q is not a domain", pos[0])}
	}
	selector := pos[1]
	if _, err := address.ParseDomain(selector, address.Options{}); err != nil {
		return &exitError{2, fmt.Errorf("dkim keygen: %q is not a selector (DNS labels)", selector)}
	}
	key, err := newKey(*alg)
	if err != nil {
		return &exitError{2, err}
	}
	path := *out
	if path == "" {
		path = domain + "." + selector + ".key"
	}
	if err := writeKey(path, key); err != nil {
		return err
	}
	return printRecord(stdout, path, domain, selector, key)
}

func newKey(alg string) (crypto.Signer, error) {
	switch alg {
	case "rsa2048":
		return rsa.GenerateKey(rand.Reader, 2048)
	case "ed25519":
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	}
	return nil, fmt.Errorf("dkim keygen: -algorithm %q is not rsa2048 or ed25519", alg)
}

// writeKey writes key as PKCS #8 PEM, readable by its owner only, and never
// over an existing file: overwriting a key in use would break every
// signature until DNS is updated.
func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("dkim keygen: %w", err)
	}
	if err := pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der}); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// printRecord prints the TXT record in zone-file syntax, split into
// character-strings of at most 255 octets (RFC 1035 §3.3; an RSA 2048 key
// is longer than one), then its value as one line, which is what a DNS
// provider's web form takes (it splits the string itself; quotes and
// parentheses pasted there become part of the record), and the
// configuration lines that use the key.
func printRecord(w io.Writer, path, domain, selector string, key crypto.Signer) error {
	rec := dkim.Record(key.Public())
	whole := rec
	var parts []string
	for len(rec) > 0 {
		n := min(len(rec), 250)
		parts = append(parts, `"`+rec[:n]+`"`)
		rec = rec[n:]
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	_, err = fmt.Fprintf(w, `; private key written to %s (mode 0600)
; publish this TXT record in the DNS zone of %s:
%s._domainkey.%s. IN TXT ( %s )
; or, in a DNS provider's web form: name %s._domainkey, type TXT, and as
; value this one line (no quotes):
%s
; then add to the configuration:
; dkim:
;   domains:
;     %s:
;       selectors:
;         - {selector: %s, key_file: %s, algorithm: %s}
`, abs, domain, selector, domain, strings.Join(parts, " "), selector, whole, domain, selector, abs, dkim.Algorithm(key.Public()))
	return err
}
