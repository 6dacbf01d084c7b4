package tlspolicy

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/greyrelay/greyrelay/relay/mx"
)

// Security is the DNSSEC state of an answer.
type Security int

// DNSSEC states (RFC 4035 §4.3). Bogus answers come back from a validating
// resolver as SERVFAIL, which we cannot tell from an unreachable authority;
// both are Bogus here, since both forbid using the answer.
const (
	Insecure Security = iota // no AD bit: DANE does not apply
	Secure                   // AD bit set by the trusted resolver
	Bogus                    // SERVFAIL or no answer: the host is unusable now
)

func (s Security) String() string {
	return [...]string{"insecure", "secure", "bogus"}[s]
}

// DNSSEC asks one trusted validating resolver and reports the AD bit.
type DNSSEC struct {
	Server  string        // host:port of the validating resolver
	Timeout time.Duration // per query
	// IPv6: delivery also dials IPv6 addresses, so a host's AAAA records
	// must be secure too for DANE to apply (RFC 7672 §2.2.2).
	IPv6 bool
}

// answer is a DNSSEC-aware lookup result.
type answer struct {
	sec    Security
	rrs    []dns.RR // records of the asked type, CNAME chain followed
	target string   // the name the CNAME chain ends at (the asked name without one)
	nx     bool     // NXDOMAIN
}

// lookup asks qtype for name with the DO bit set (RFC 3225).
func (d *DNSSEC) lookup(ctx context.Context, name string, qtype uint16) (answer, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, true)
	m.AuthenticatedData = true // RFC 6840 §5.7: ask for the AD bit
	c := &dns.Client{Net: "udp", Timeout: d.Timeout}
	resp, err := mx.Exchange(ctx, c, m, d.Server) // ends with ctx, not only at its deadline
	if err == nil && resp.Truncated {
		c.Net = "tcp"
		resp, err = mx.Exchange(ctx, c, m, d.Server)
	}
	if err != nil {
		return answer{sec: Bogus}, fmt.Errorf("%s %s: %w", dns.TypeToString[qtype], name, err)
	}
	a := answer{sec: Insecure, target: strings.ToLower(dns.Fqdn(name))}
	if resp.AuthenticatedData {
		a.sec = Secure
	}
	switch resp.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		a.nx = true
		return a, nil
	default:
		return answer{sec: Bogus}, fmt.Errorf("%s %s: %s", dns.TypeToString[qtype], name, dns.RcodeToString[resp.Rcode])
	}
	a.rrs, a.target = follow(resp.Answer, a.target, qtype)
	return a, nil
}

// follow returns the records of qtype at the end of name's CNAME chain in
// rrs, and the name the chain ends at.
func follow(rrs []dns.RR, name string, qtype uint16) ([]dns.RR, string) {
	for range 8 {
		next := ""
		for _, rr := range rrs {
			if c, ok := rr.(*dns.CNAME); ok && strings.EqualFold(c.Hdr.Name, name) {
				next = strings.ToLower(c.Target)
			}
		}
		if next == "" || qtype == dns.TypeCNAME {
			break
		}
		name = next
	}
	var out []dns.RR
	for _, rr := range rrs {
		if rr.Header().Rrtype == qtype && strings.EqualFold(rr.Header().Name, name) {
			out = append(out, rr)
		}
	}
	return out, name
}

// TLSA is one usable-or-not TLSA record (RFC 6698 §2.1).
type TLSA struct {
	Usage, Selector, MatchingType uint8
	Data                          []byte
}

func (t TLSA) String() string {
	return fmt.Sprintf("%d %d %d %x", t.Usage, t.Selector, t.MatchingType, t.Data)
}

// Usable reports whether RFC 7672 lets SMTP use the record: DANE-TA(2) or
// DANE-EE(3), selector 0 or 1, matching type 0, 1 or 2 (§3.1.3, RFC 6698
// §2.1).
func (t TLSA) Usable() bool {
	return (t.Usage == 2 || t.Usage == 3) && t.Selector <= 1 && t.MatchingType <= 2
}

// HostDANE is what DANE says about one MX host.
type HostDANE struct {
	Host string // the MX host name, lower case, no trailing dot
	// Base is the TLSA base domain (RFC 7672 §2.2.3): the CNAME-expanded
	// name when the host is a secure CNAME chain and TLSA records exist
	// there, else Host. It is the SNI of the TLS handshake (§3.2.2).
	Base    string
	Names   []string // reference identifiers for DANE-TA: Base, then Host (§3.2.2)
	State   Security // of the TLSA RRset (Insecure: DANE does not apply)
	Records []TLSA   // all records found; see TLSA.Usable
	Err     error    // why State is Bogus
}

// Applies reports whether the host must be reached with DANE.
func (h HostDANE) Applies() bool { return h.State == Secure && len(h.Records) > 0 }

// MXSecure looks up domain's MX RRset and reports whether it is secure
// (RFC 7672 §2.2.1). A domain without MX records is its own implicit MX, and
// its NODATA answer carries the AD bit when the zone is signed.
func (d *DNSSEC) MXSecure(ctx context.Context, domain string) (Security, error) {
	a, err := d.lookup(ctx, domain, dns.TypeMX)
	if err != nil {
		return Bogus, err
	}
	return a.sec, nil
}

// Host finds the TLSA records of an MX host (RFC 7672 §2.2.2, §2.2.3).
func (d *DNSSEC) Host(ctx context.Context, host string, port int) HostDANE {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	h := HostDANE{Host: host, Base: host, Names: []string{host}}
	sec, target, err := d.addresses(ctx, host)
	if err != nil {
		h.State, h.Err = Bogus, err
		return h
	}
	if sec != Secure {
		return h // §2.2.2: insecure address records (or CNAME chain), no TLSA lookup
	}
	bases := []string{host}
	if target != host {
		bases = []string{target, host} // §2.2.3: the expanded name first
	}
	for _, base := range bases {
		t, err := d.lookup(ctx, fmt.Sprintf("_%d._tcp.%s", port, base), dns.TypeTLSA)
		if err != nil {
			h.State, h.Err = Bogus, err
			return h
		}
		h.State = t.sec
		if t.sec != Secure {
			return h
		}
		h.Records = tlsaRecords(t.rrs)
		if len(h.Records) > 0 {
			h.Base = base
			if base != host {
				// §3.2.2: SNI and the primary reference identifier are
				// the expanded base domain; the MX host name is matched too.
				h.Names = []string{base, host}
			}
			return h
		}
	}
	return h
}

// addresses looks up the address records of host that delivery may use (A,
// and AAAA when d.IPv6) and returns their DNSSEC state and the name the
// CNAME chain of host ends at (host itself without one). A validating
// resolver sets AD only when every RRset of the answer, each CNAME of the
// chain included, is secure, so one insecure step makes the whole answer
// insecure (RFC 7672 §2.2.2: DANE does not apply). A failed lookup of
// either family is Bogus: the host cannot be judged now. A family without
// records is not used to reach the host and does not count.
func (d *DNSSEC) addresses(ctx context.Context, host string) (Security, string, error) {
	qtypes := []uint16{dns.TypeA}
	if d.IPv6 {
		qtypes = append(qtypes, dns.TypeAAAA)
	}
	sec, target, used := Secure, host, false
	for _, qt := range qtypes {
		a, err := d.lookup(ctx, host, qt)
		if err != nil {
			return Bogus, host, err
		}
		if len(a.rrs) == 0 {
			continue
		}
		used = true
		target = strings.TrimSuffix(a.target, ".")
		if a.sec != Secure {
			sec = Insecure
		}
	}
	if !used {
		return Insecure, host, nil // no address: nothing to authenticate
	}
	return sec, target, nil
}

// tlsaRecords converts TLSA answers; a record whose data is not hex
// matches nothing and is left out.
func tlsaRecords(rrs []dns.RR) []TLSA {
	var out []TLSA
	for _, rr := range rrs {
		r, ok := rr.(*dns.TLSA)
		if !ok {
			continue
		}
		data, err := hex.DecodeString(r.Certificate)
		if err != nil {
			continue
		}
		out = append(out, TLSA{Usage: r.Usage, Selector: r.Selector, MatchingType: r.MatchingType, Data: data})
	}
	return out
}

// TrustedResolver reports whether the AD bit of server (host:port) may be
// believed: it is on loopback or listed in trusted (RFC 6698 §4.1, RFC 4035
// §4.9.3: the path to the resolver must be secure).
func TrustedResolver(server string, trusted []string) bool {
	host, _, err := net.SplitHostPort(server)
	if err != nil {
		host = server
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, t := range trusted {
		if t == host || t == server {
			return true
		}
	}
	return false
}
