// Package mx decides where mail for a domain goes: a configured smarthost,
// a static per-domain route, or the domain's MX hosts, each resolved to the
// addresses we may connect to.
//
// Design notes:
//
//   - DNS is spoken directly with github.com/miekg/dns to one configured
//     recursive resolver (Postfix and mox do the same), not through the Go
//     resolver: we need the response code to tell NXDOMAIN (permanent) from
//     SERVFAIL or a timeout (temporary), and we need to see a null MX.
//   - Every DNS failure is a *classifier.DNSError, so the classifier decides
//     what is permanent; this package only reports what DNS said.
//   - Routing policy (order, shuffling, address filtering) lives in Router
//     and only depends on the small Resolver interface, so tests and
//     `greyrelay probe` can substitute their own resolver.
//   - Nothing here keeps state between calls: no cache. A recursive
//     resolver caches; the queue retries are minutes apart.
package mx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/miekg/dns"
)

// MX is one mail exchanger of a domain.
type MX struct {
	Host string // lower case, no trailing dot
	Pref uint16 // lower is preferred (RFC 5321 §5.1)
}

// Resolver is what routing needs from DNS; *DNS implements it, tests may
// fake it. Errors should be *classifier.DNSError.
type Resolver interface {
	// LookupMX returns the MX records of domain sorted by preference.
	// Equal preferences are left in answer order: the Router shuffles them.
	// No MX records (NOERROR/NODATA) is an empty slice and a nil error.
	LookupMX(ctx context.Context, domain string) ([]MX, error)
	// LookupAddrs returns the A (if v4) and AAAA (if v6) addresses of host.
	LookupAddrs(ctx context.Context, host string, v4, v6 bool) ([]netip.Addr, error)
	// LookupPTR returns the reverse names of ip.
	LookupPTR(ctx context.Context, ip netip.Addr) ([]string, error)
	// LookupTXT returns the TXT records of name, each record's strings joined.
	LookupTXT(ctx context.Context, name string) ([]string, error)
	// LookupA returns the A records of name (for DNSBL queries).
	LookupA(ctx context.Context, name string) ([]netip.Addr, error)
}

// DNS is a Resolver that queries one recursive name server over UDP,
// retrying over TCP when the answer is truncated or does not parse.
type DNS struct {
	Server  string        // host:port of a recursive resolver
	Timeout time.Duration // per query attempt
	Retries int           // extra UDP attempts after a timeout
}

// NewDNS returns a DNS resolver for server (host:port) with one retry.
func NewDNS(server string, timeout time.Duration) *DNS {
	return &DNS{Server: server, Timeout: timeout, Retries: 1}
}

// SystemServer returns the first nameserver of a resolv.conf file
// (usually /etc/resolv.conf) as host:port.
func SystemServer(resolvConf string) (string, error) {
	conf, err := dns.ClientConfigFromFile(resolvConf)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", resolvConf, err)
	}
	if len(conf.Servers) == 0 {
		return "", fmt.Errorf("%s: no nameserver", resolvConf)
	}
	return net.JoinHostPort(conf.Servers[0], conf.Port), nil
}

// ednsSize is the EDNS0 UDP payload size we advertise: the DNS flag day 2020
// recommendation, small enough to avoid IP fragmentation.
const ednsSize = 1232

// query asks qtype for name and returns the answer records of that type,
// following the CNAME chain the resolver included in the answer.
func (d *DNS) query(ctx context.Context, name string, qtype uint16) ([]dns.RR, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(ednsSize, false)
	resp, err := d.exchange(ctx, m)
	if err != nil {
		return nil, &classifier.DNSError{Domain: name, Kind: errKind(err), Err: err}
	}
	switch resp.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		return nil, &classifier.DNSError{Domain: name, Kind: classifier.DNSNXDomain, Err: errors.New("NXDOMAIN")}
	case dns.RcodeServerFailure, dns.RcodeRefused:
		return nil, &classifier.DNSError{Domain: name, Kind: classifier.DNSServFail, Err: errors.New(dns.RcodeToString[resp.Rcode])}
	default:
		return nil, &classifier.DNSError{Domain: name, Kind: classifier.DNSOther, Err: fmt.Errorf("rcode %s", dns.RcodeToString[resp.Rcode])}
	}
	return answers(resp.Answer, m.Question[0].Name, qtype), nil
}

// exchange sends m over UDP (with retries on timeout) and repeats it over
// TCP when the UDP answer is truncated (RFC 7766 §5, RFC 1035 §4.2.1) or
// does not parse. The latter is what an answer larger than our EDNS0
// buffer looks like when a server (or a middlebox) sends it without the TC
// bit: the datagram is cut at the buffer's size, so it would fail the same
// way at every retry, while TCP carries it whole.
func (d *DNS) exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	udp := &dns.Client{Net: "udp", Timeout: d.Timeout}
	var resp *dns.Msg
	var err error
	for attempt := 0; attempt <= max(d.Retries, 0); attempt++ {
		resp, err = Exchange(ctx, udp, m, d.Server)
		if err == nil || errKind(err) != classifier.DNSTimeout || ctx.Err() != nil {
			break
		}
	}
	var ne net.Error
	switch {
	case err != nil && (errors.As(err, &ne) || ctx.Err() != nil):
		return nil, err // the network's trouble, not the answer's
	case err == nil && !resp.Truncated:
		return resp, nil
	}
	tcp := &dns.Client{Net: "tcp", Timeout: d.Timeout}
	return Exchange(ctx, tcp, m, d.Server)
}

// Exchange sends m to server with c and returns the answer. Unlike
// c.ExchangeContext, which takes only ctx's deadline for its reads and
// writes, it stops as soon as ctx ends: a resolver that does not answer
// must not hold a delivery worker, and with it the relay's stop on
// SIGTERM, for the whole query timeout (10 s, at the edge of Docker's
// default stop grace).
func Exchange(ctx context.Context, c *dns.Client, m *dns.Msg, server string) (*dns.Msg, error) {
	conn, err := c.DialContext(ctx, server)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// Closing the connection ends a read in progress; a deadline set now
	// would not, as ExchangeWithConnContext sets its own.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, conn)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return resp, err
}

// errKind maps a transport error to a DNSKind.
func errKind(err error) classifier.DNSKind {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return classifier.DNSTimeout
	}
	return classifier.DNSOther
}

// answers returns the records of type qtype owned by qname or by a name the
// answer's CNAME chain leads to. We follow only what the resolver returned;
// a recursive resolver includes the whole chain (RFC 1034 §4.3.2).
func answers(rrs []dns.RR, qname string, qtype uint16) []dns.RR {
	names := map[string]bool{strings.ToLower(qname): true}
	for range 8 { // chains longer than 8 are not followed
		grew := false
		for _, rr := range rrs {
			if c, ok := rr.(*dns.CNAME); ok && names[strings.ToLower(c.Hdr.Name)] && !names[strings.ToLower(c.Target)] {
				names[strings.ToLower(c.Target)] = true
				grew = true
			}
		}
		if !grew {
			break
		}
	}
	var out []dns.RR
	for _, rr := range rrs {
		if rr.Header().Rrtype == qtype && names[strings.ToLower(rr.Header().Name)] {
			out = append(out, rr)
		}
	}
	return out
}

// normHost lower-cases a host name and strips the trailing dot.
func normHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// LookupMX implements Resolver. A null MX (RFC 7505 §3: a single MX whose
// exchange is ".") is a DNSNullMX error. In a mixed set, "." entries are
// dropped: we cannot deliver to the root.
func (d *DNS) LookupMX(ctx context.Context, domain string) ([]MX, error) {
	rrs, err := d.query(ctx, domain, dns.TypeMX)
	if err != nil {
		return nil, err
	}
	var out []MX
	for _, rr := range rrs {
		mx := rr.(*dns.MX)
		if mx.Mx == "." {
			continue
		}
		out = append(out, MX{Host: normHost(mx.Mx), Pref: mx.Preference})
	}
	if len(rrs) > 0 && len(out) == 0 {
		return nil, &classifier.DNSError{Domain: domain, Kind: classifier.DNSNullMX,
			Err: errors.New("domain does not accept mail (null MX, RFC 7505)")}
	}
	slices.SortStableFunc(out, func(a, b MX) int { return int(a.Pref) - int(b.Pref) })
	return out, nil
}

// LookupAddrs implements Resolver. IPv4 addresses come first, then IPv6, so
// the order (and with it our chance of reusing the address a greylister
// saw) is stable. If one family fails and the other answers, the answer
// wins; if both fail, the A error is returned.
func (d *DNS) LookupAddrs(ctx context.Context, host string, v4, v6 bool) ([]netip.Addr, error) {
	var out []netip.Addr
	var firstErr error
	for _, fam := range []struct {
		on    bool
		qtype uint16
	}{{v4, dns.TypeA}, {v6, dns.TypeAAAA}} {
		if !fam.on {
			continue
		}
		addrs, err := d.addrs(ctx, host, fam.qtype)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		out = append(out, addrs...)
	}
	if len(out) == 0 && firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

// addrs returns the A or AAAA records of host, unmapped.
func (d *DNS) addrs(ctx context.Context, host string, qtype uint16) ([]netip.Addr, error) {
	rrs, err := d.query(ctx, host, qtype)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, rr := range rrs {
		var ip net.IP
		switch rr := rr.(type) {
		case *dns.A:
			ip = rr.A
		case *dns.AAAA:
			ip = rr.AAAA
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, a.Unmap())
		}
	}
	return out, nil
}

// LookupA implements Resolver.
func (d *DNS) LookupA(ctx context.Context, name string) ([]netip.Addr, error) {
	return d.addrs(ctx, name, dns.TypeA)
}

// LookupPTR implements Resolver.
func (d *DNS) LookupPTR(ctx context.Context, ip netip.Addr) ([]string, error) {
	arpa, err := dns.ReverseAddr(ip.Unmap().String())
	if err != nil {
		return nil, &classifier.DNSError{Domain: ip.String(), Kind: classifier.DNSOther, Err: err}
	}
	rrs, err := d.query(ctx, arpa, dns.TypePTR)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(rrs))
	for _, rr := range rrs {
		out = append(out, normHost(rr.(*dns.PTR).Ptr))
	}
	return out, nil
}

// LookupTXT implements Resolver. The character-strings of one record are
// concatenated, as SPF requires (RFC 7208 §3.3).
func (d *DNS) LookupTXT(ctx context.Context, name string) ([]string, error) {
	rrs, err := d.query(ctx, name, dns.TypeTXT)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(rrs))
	for _, rr := range rrs {
		out = append(out, strings.Join(rr.(*dns.TXT).Txt, ""))
	}
	return out, nil
}
