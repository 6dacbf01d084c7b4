package probe

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/greyrelay/greyrelay/classifier"
)

// IdentityReport is step 2: how receivers see us. Receivers commonly defer
// or refuse mail from an address without forward-confirmed reverse DNS, or
// whose HELO name does not resolve to it; such mismatches are Problems.
type IdentityReport struct {
	HELO      string   `json:"helo"`
	HELOAddrs []string `json:"helo_addrs"` // what the HELO name resolves to
	HELOError string   `json:"helo_error,omitempty"`
	// Sources are the addresses our connections come from: the configured
	// delivery.source_ipv4/ipv6, or the ones the kernel chose.
	Sources  []SourceReport `json:"sources"`
	Problems []string       `json:"problems"`
	Elapsed  Millis         `json:"elapsed_ms"`
}

// SourceReport checks one source address.
type SourceReport struct {
	Address string `json:"address"`
	// Origin is "configured" (delivery.source_ipv4/ipv6) or "kernel" (the
	// local address of a probe connection, when none is configured).
	Origin   string   `json:"origin"`
	PTR      []string `json:"ptr"`                 // reverse DNS names
	PTRError string   `json:"ptr_error,omitempty"` // e.g. "NXDOMAIN"
	// ForwardConfirmed: some PTR name resolves back to Address (FCrDNS).
	ForwardConfirmed bool `json:"forward_confirmed"`
	// HELOMatches: the HELO name resolves to Address.
	HELOMatches bool `json:"helo_matches"`
	// HELOIsPTR: the HELO name is one of the PTR names (recommended, not
	// required by most receivers).
	HELOIsPTR bool `json:"helo_is_ptr"`
}

// source is an address connections come from and how we know it.
type source struct {
	addr   netip.Addr
	origin string
}

// sources lists the configured source addresses, then those the kernel
// chose for the probe's connections when none is configured.
func (p *prober) sources() []source {
	var out []source
	seen := map[netip.Addr]bool{}
	add := func(a netip.Addr, origin string) {
		if a.IsValid() && !seen[a] {
			seen[a] = true
			out = append(out, source{a, origin})
		}
	}
	for _, s := range []string{p.opt.SourceIPv4, p.opt.SourceIPv6} {
		if a, err := netip.ParseAddr(s); err == nil {
			add(a.Unmap(), "configured")
		}
	}
	for _, pr := range p.rep.Paths {
		if ap, err := netip.ParseAddrPort(pr.Source); err == nil {
			a := ap.Addr().Unmap()
			if (a.Is4() && p.opt.SourceIPv4 == "") || (a.Is6() && p.opt.SourceIPv6 == "") {
				add(a, "kernel")
			}
		}
	}
	return out
}

// identity fills step 2.
func (p *prober) identity(ctx context.Context) {
	start := p.opt.Now()
	id := IdentityReport{HELO: p.opt.Hostname, HELOAddrs: []string{}, Sources: []SourceReport{}, Problems: []string{}}
	helo, err := p.res.LookupAddrs(ctx, p.opt.Hostname, true, true)
	if err != nil {
		id.HELOError = err.Error()
		id.Problems = append(id.Problems, fmt.Sprintf("HELO name %s does not resolve (%s)", p.opt.Hostname, dnsWhat(err)))
	}
	id.HELOAddrs = addrStrings(helo)
	if !strings.Contains(strings.Trim(p.opt.Hostname, "."), ".") {
		id.Problems = append(id.Problems, fmt.Sprintf("HELO name %s is not a fully-qualified domain name (RFC 5321 §4.1.1.1)", p.opt.Hostname))
	}
	srcs := p.sources()
	if len(srcs) == 0 {
		id.Problems = append(id.Problems, "source address unknown: no connection was made and delivery.source_ipv4 is empty")
	}
	for _, s := range srcs {
		sr := p.checkSource(ctx, s, helo)
		id.Sources = append(id.Sources, sr)
		id.Problems = append(id.Problems, sourceProblems(sr, p.opt.Hostname, err == nil)...)
	}
	id.Elapsed = p.since(start)
	p.rep.Identity = id
}

// checkSource looks up the reverse DNS of one source address and confirms
// it forward.
func (p *prober) checkSource(ctx context.Context, s source, helo []netip.Addr) SourceReport {
	sr := SourceReport{Address: s.addr.String(), Origin: s.origin, PTR: []string{},
		HELOMatches: slices.Contains(helo, s.addr)}
	names, err := p.res.LookupPTR(ctx, s.addr)
	if err != nil {
		sr.PTRError = dnsWhat(err)
		return sr
	}
	sr.PTR = names
	for _, n := range names {
		if strings.EqualFold(n, strings.TrimSuffix(p.opt.Hostname, ".")) {
			sr.HELOIsPTR = true
		}
		addrs, err := p.res.LookupAddrs(ctx, n, s.addr.Is4(), s.addr.Is6())
		if err == nil && slices.Contains(addrs, s.addr) {
			sr.ForwardConfirmed = true
		}
	}
	return sr
}

// sourceProblems names what receivers hold against a source address.
func sourceProblems(sr SourceReport, helo string, heloResolves bool) []string {
	var out []string
	switch {
	case len(sr.PTR) == 0:
		what := "no PTR record"
		if sr.PTRError != "" {
			what = sr.PTRError
		}
		out = append(out, fmt.Sprintf("source address %s has no reverse DNS (%s): many receivers defer or refuse such senders", sr.Address, what))
	case !sr.ForwardConfirmed:
		out = append(out, fmt.Sprintf("reverse DNS of %s (%s) does not resolve back to it: not forward-confirmed (FCrDNS)", sr.Address, strings.Join(sr.PTR, ", ")))
	}
	if heloResolves && !sr.HELOMatches {
		out = append(out, fmt.Sprintf("HELO name %s does not resolve to the source address %s", helo, sr.Address))
	}
	return out
}

// dnsWhat shortens a lookup error for a sentence.
func dnsWhat(err error) string {
	var de *classifier.DNSError
	if errors.As(err, &de) {
		switch de.Kind {
		case classifier.DNSNXDomain:
			return "NXDOMAIN"
		case classifier.DNSServFail:
			return "SERVFAIL"
		case classifier.DNSTimeout:
			return "timeout"
		}
	}
	return err.Error()
}
