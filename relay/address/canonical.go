package address

import (
	"strings"

	"golang.org/x/net/idna"
)

// One domain has many spellings: "Bücher.test", "bücher.test.",
// "xn--bcher-kva.test", "XN--BCHER-KVA.TEST". Every place greyrelay compares
// domains (who owns a sender, which DKIM key signs, which route, TLS policy
// or destination record applies) compares them in the one form
// CanonicalDomain gives, so that no spelling can get past a rule written in
// another. The form is the A-label one (RFC 5890 §2.3.2.1), lower case,
// without the root's trailing dot: it is what DNS is asked for, and it is
// plain ASCII, so it compares byte for byte and is safe in logs and keys.

// CanonicalDomain returns domain in the form greyrelay compares and looks up
// domains in: every U-label converted to its A-label, lower case, no
// trailing dot; an address literal in canonical form. It refuses what
// ParseDomain refuses (with UTF-8 allowed), so a name that is not a valid
// IDNA2008 domain has no canonical form.
func CanonicalDomain(domain string) (string, error) {
	d, err := ParseDomain(strings.TrimSuffix(domain, "."), Options{SMTPUTF8: true})
	if err != nil || strings.HasPrefix(d, "[") || !needsIDNA(d) {
		return d, err
	}
	// ParseDomain checked the name against the registration profile.
	a, err := idna.Registration.ToASCII(d)
	if err != nil {
		return "", syntaxErr(Options{}, "Bad domain: not a valid internationalised domain name")
	}
	return a, nil
}

// DomainKey is CanonicalDomain for comparing a domain that may not be valid
// (one read from a message header, or stored by an older version): a valid
// name gets its canonical form, anything else is only lower-cased and
// stripped of a trailing dot, so it still equals its own spellings of
// case and nothing that is a valid domain.
func DomainKey(domain string) string {
	if d, err := CanonicalDomain(domain); err == nil {
		return d
	}
	return strings.ToLower(strings.TrimSuffix(domain, "."))
}

// needsIDNA reports whether d (lower case) has a non-ASCII character or an
// A-label.
func needsIDNA(d string) bool {
	return !isASCII(d) || strings.HasPrefix(d, "xn--") || strings.Contains(d, ".xn--")
}
