package config

import (
	"fmt"
	"slices"

	"github.com/greyrelay/greyrelay/relay/address"
)

// canonicalDomains rewrites every domain the configuration names as a key
// (dkim.domains, delivery.routes) or in a list (dkim.trusted_clients) in
// its canonical form (address.CanonicalDomain: A-labels, lower case, no
// final dot), the form every comparison at run time uses, so "bücher.test"
// in the file matches mail for "xn--bcher-kva.test" and the reverse. A
// name without a canonical form is left as written for Validate to
// report; two spellings of one domain as keys are an error, since only
// one of their values could apply.
func (c *Config) canonicalDomains() []error {
	var errs []error
	var err error
	if c.DKIM.Domains, err = canonicalKeys("dkim.domains", c.DKIM.Domains); err != nil {
		errs = append(errs, err)
	}
	if c.Delivery.Routes, err = canonicalKeys("delivery.routes", c.Delivery.Routes); err != nil {
		errs = append(errs, err)
	}
	for i := range c.DKIM.TrustedClients {
		g := &c.DKIM.TrustedClients[i]
		for j, d := range g.Domains {
			if d == "*" {
				continue
			}
			if cd, err := address.CanonicalDomain(d); err == nil {
				g.Domains[j] = cd
			}
		}
	}
	return errs
}

// canonicalKeys returns m with its keys canonical (see canonicalDomains).
func canonicalKeys[V any](key string, m map[string]V) (map[string]V, error) {
	if len(m) == 0 {
		return m, nil
	}
	out := make(map[string]V, len(m))
	from := map[string]string{}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names) // the same error every time
	var err error
	for _, k := range names {
		ck, cerr := address.CanonicalDomain(k)
		if cerr != nil || ck == "" {
			ck = k
		}
		if prev, dup := from[ck]; dup && err == nil {
			err = fmt.Errorf("%s: %q and %q are the same domain (%s); list it once", key, prev, k, ck)
		}
		from[ck] = k
		out[ck] = m[k]
	}
	return out, err
}
