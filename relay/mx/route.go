package mx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/relay/address"
)

// Route kinds.
const (
	KindRoute      = "route"       // a static per-domain route
	KindSmarthost  = "smarthost"   // everything goes to one relay host
	KindMX         = "mx"          // the domain's MX records
	KindImplicitMX = "implicit-mx" // no MX: the domain itself (RFC 5321 §5.1)
	KindLiteral    = "literal"     // an address literal: that address, no DNS
)

// Hop is one host to try, in order, with the addresses we may connect to.
type Hop struct {
	Host    string       // lower case, no trailing dot; an IP literal for literal routes
	Pref    uint16       // MX preference (0 for routes and smarthosts)
	Addrs   []netip.Addr // usable addresses, in the order to try
	Port    int          // TCP port to connect to
	Refused []netip.Addr // addresses dropped as private/loopback (see Router.AllowPrivate)
	Err     error        // why Addrs is empty when the host did not resolve; nil otherwise
}

// Route is the outcome of routing one destination domain.
type Route struct {
	Kind   string // KindRoute, KindSmarthost, KindMX, KindImplicitMX or KindLiteral
	Domain string // the destination domain, normalised
	Hops   []Hop  // in the order to try; hops without Addrs are to be skipped
}

// Router chooses the hops for a destination domain. Precedence:
// Smarthost, then Routes[domain], then the address of an address literal
// (never looked up in DNS), then DNS MX records.
type Router struct {
	Resolver     Resolver
	Routes       map[string]string // domain → host:port (Postfix transport-map style); keys canonical (address.CanonicalDomain)
	Smarthost    string            // host:port; if set, everything goes there
	Port         int               // port for MX delivery and for routes without a port; 0 = 25
	AllowPrivate bool              // keep loopback/private/link-local/ULA/unspecified MX addresses
	IPv4, IPv6   bool              // which address families we can send from
	// Literals delivers to an address literal's own address ("[192.0.2.1]",
	// "[IPv6:2001:db8::1]"), under the AllowPrivate rule of MX targets.
	// false refuses such domains with a permanent error.
	Literals bool
	// MaxAddrs bounds the MX addresses of one route, as Postfix's
	// smtp_mx_address_limit does: MX hosts are looked up in preference
	// order only until this many addresses are found, and at most twice
	// this many hosts are looked up, so a domain with hundreds of MX
	// records costs a bounded number of lookups. 0: no limit.
	MaxAddrs int
	// Shuffle randomises MX hosts of equal preference (RFC 5321 §5.1);
	// rand.Shuffle fits. nil leaves them in DNS answer order.
	Shuffle func(n int, swap func(i, j int))
}

// Route returns the hops for domain. DNS failures are *classifier.DNSError.
// When no hop has a usable address, Route returns an error together with
// the Route it found, so callers such as `greyrelay probe` can show why.
func (r *Router) Route(ctx context.Context, domain string) (Route, error) {
	// Routes' keys are canonical (relay/config), and so is the name looked
	// up: any spelling of a routed domain takes its route, and DNS is
	// asked for A-labels.
	domain = address.DomainKey(domain)
	if r.Smarthost != "" {
		return r.fixed(ctx, KindSmarthost, domain, r.Smarthost)
	}
	if hp, ok := r.Routes[domain]; ok {
		return r.fixed(ctx, KindRoute, domain, hp)
	}
	if strings.HasPrefix(domain, "[") {
		return r.literal(domain)
	}
	return r.viaMX(ctx, domain)
}

// literal routes an address literal (RFC 5321 §4.1.3) to its address. It
// is never a name: looking "[192.0.2.1]" up in DNS can only fail, or
// worse, find something. The address must pass the rule MX targets pass,
// or a client could have us deliver into our own network.
func (r *Router) literal(domain string) (Route, error) {
	rt := Route{Kind: KindLiteral, Domain: domain}
	if !r.Literals {
		// Permanent: RFC 3463 X.1.2, the destination system in the address
		// is not one we deliver to.
		return rt, &classifier.DNSError{Domain: domain, Kind: classifier.DNSNXDomain,
			Err: errors.New("address literals are not delivered (delivery.address_literals: refuse)")}
	}
	inner := strings.TrimSuffix(strings.TrimPrefix(domain, "["), "]")
	if len(inner) > 5 && strings.EqualFold(inner[:5], "IPv6:") {
		inner = inner[5:]
	}
	ip, err := netip.ParseAddr(inner)
	if err != nil || ip.Zone() != "" {
		return rt, &classifier.DNSError{Domain: domain, Kind: classifier.DNSNXDomain,
			Err: fmt.Errorf("bad address literal %q", domain)}
	}
	hop := Hop{Host: ip.Unmap().String(), Port: r.port()}
	for _, a := range r.families([]netip.Addr{ip}) {
		if !r.AllowPrivate && Private(a) {
			hop.Refused = append(hop.Refused, a)
		} else {
			hop.Addrs = append(hop.Addrs, a)
		}
	}
	rt.Hops = []Hop{hop}
	if len(hop.Addrs) == 0 {
		return rt, noAddrs(rt)
	}
	return rt, nil
}

// fixed routes to a configured host:port. The operator chose it, so private
// addresses are allowed (that is how tests and internal relays work).
func (r *Router) fixed(ctx context.Context, kind, domain, hostport string) (Route, error) {
	host, port, err := r.splitHostPort(hostport)
	rt := Route{Kind: kind, Domain: domain}
	if err != nil {
		return rt, &classifier.DNSError{Domain: domain, Kind: classifier.DNSOther, Err: err}
	}
	hop := Hop{Host: host, Port: port}
	if ip, err := netip.ParseAddr(host); err == nil {
		hop.Addrs = r.families([]netip.Addr{ip.Unmap()})
	} else {
		addrs, err := r.Resolver.LookupAddrs(ctx, host, r.IPv4, r.IPv6)
		hop.Addrs, hop.Err = r.families(addrs), err
	}
	rt.Hops = []Hop{hop}
	if len(hop.Addrs) == 0 {
		return rt, noAddrs(rt)
	}
	return rt, nil
}

// viaMX routes by the domain's MX records, or the implicit MX.
func (r *Router) viaMX(ctx context.Context, domain string) (Route, error) {
	rt := Route{Kind: KindMX, Domain: domain}
	mxs, err := r.Resolver.LookupMX(ctx, domain)
	if err != nil {
		return rt, err
	}
	if len(mxs) == 0 {
		// RFC 5321 §5.1: no MX records means the domain itself is the
		// single, implicit MX with preference 0.
		rt.Kind = KindImplicitMX
		mxs = []MX{{Host: domain}}
	}
	r.shuffleEqual(mxs)
	port, found := r.port(), 0
	for i, m := range mxs {
		if r.MaxAddrs > 0 && (found >= r.MaxAddrs || i >= 2*r.MaxAddrs) {
			break
		}
		hop := Hop{Host: normHost(m.Host), Pref: m.Pref, Port: port}
		addrs, err := r.Resolver.LookupAddrs(ctx, hop.Host, r.IPv4, r.IPv6)
		hop.Err = err
		for _, a := range r.families(addrs) {
			switch {
			case !r.AllowPrivate && Private(a):
				hop.Refused = append(hop.Refused, a)
			case r.MaxAddrs == 0 || found < r.MaxAddrs:
				hop.Addrs = append(hop.Addrs, a)
				found++
			}
		}
		rt.Hops = append(rt.Hops, hop)
	}
	for _, h := range rt.Hops {
		if len(h.Addrs) > 0 {
			return rt, nil
		}
	}
	return rt, noAddrs(rt)
}

// noAddrs explains why no hop of rt has an address: private addresses
// only, else a lookup error of a hop (a temporary one rather than NXDOMAIN,
// so one vanished MX host among flaky ones does not bounce mail), else a
// DNSOther error.
func noAddrs(rt Route) error {
	var refused []netip.Addr
	for _, h := range rt.Hops {
		refused = append(refused, h.Refused...)
	}
	if len(refused) > 0 {
		// Someone points their MX at 127.0.0.1 or an RFC 1918 address;
		// connecting would deliver to ourselves or into our own network.
		return &classifier.DNSError{Domain: rt.Domain, Kind: classifier.DNSOther,
			Err: fmt.Errorf("MX of %s resolves only to private addresses %v", rt.Domain, refused)}
	}
	var found *classifier.DNSError
	for _, h := range rt.Hops {
		var de *classifier.DNSError
		if errors.As(h.Err, &de) && (found == nil || (found.Kind == classifier.DNSNXDomain && de.Kind != classifier.DNSNXDomain)) {
			found = de
		}
	}
	if found != nil {
		return found
	}
	return &classifier.DNSError{Domain: rt.Domain, Kind: classifier.DNSOther,
		Err: fmt.Errorf("no usable address for %s (%s)", rt.Domain, rt.Kind)}
}

// shuffleEqual shuffles each run of equal preference in the sorted mxs.
func (r *Router) shuffleEqual(mxs []MX) {
	if r.Shuffle == nil {
		return
	}
	for i := 0; i < len(mxs); {
		j := i + 1
		for j < len(mxs) && mxs[j].Pref == mxs[i].Pref {
			j++
		}
		if run := mxs[i:j]; len(run) > 1 {
			r.Shuffle(len(run), func(a, b int) { run[a], run[b] = run[b], run[a] })
		}
		i = j
	}
}

// families keeps the addresses of the families we can send from.
func (r *Router) families(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if (a.Is4() && r.IPv4) || (a.Is6() && r.IPv6) {
			out = append(out, a)
		}
	}
	return out
}

// Private reports the addresses greyrelay sends nothing to unless the
// operator allows it (delivery.allow_private_destinations for MX targets,
// tls_reporting.allow_private_rua for TLS reports): loopback, private (RFC
// 1918, RFC 4193), link-local, unspecified and multicast. A name in a
// stranger's DNS must not aim the relay at its own network.
func Private(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() ||
		a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast()
}

func (r *Router) port() int {
	if r.Port == 0 {
		return 25
	}
	return r.Port
}

// splitHostPort parses "host:port", "[host]:port", "[v6]:port" or a bare
// host (port defaults to r.Port). Postfix's brackets (no MX lookup) are
// accepted; routes never look up MX anyway.
func (r *Router) splitHostPort(hp string) (string, int, error) {
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		host, ps = strings.Trim(hp, "[]"), ""
	}
	port := r.port()
	if ps != "" {
		p, err := strconv.Atoi(ps)
		if err != nil || p <= 0 || p > 65535 {
			return "", 0, fmt.Errorf("bad port in %q", hp)
		}
		port = p
	}
	if host == "" {
		return "", 0, fmt.Errorf("empty host in %q", hp)
	}
	return normHost(host), port, nil
}
