package probe

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/greyrelay/greyrelay/classifier"
)

// DNSBLResult is one source address looked up in one blocklist (step 3).
type DNSBLResult struct {
	List    string   `json:"list"`
	Address string   `json:"address"`
	Query   string   `json:"query"`  // the DNS name asked, RFC 5782 §2.1
	Listed  bool     `json:"listed"` // the list has an entry for Address
	Codes   []string `json:"codes"`  // the A records returned, e.g. 127.0.0.2
	Reason  string   `json:"reason,omitempty"`
	// Error is set when the answer could not be read as listed or not:
	// a lookup failure, or a code meaning the list refused the query.
	Error   string `json:"error,omitempty"`
	Elapsed Millis `json:"elapsed_ms"`
}

// reputation fills step 3 for every source address and every list.
func (p *prober) reputation(ctx context.Context) {
	p.rep.Reputation = []DNSBLResult{}
	for _, s := range p.sources() {
		for _, list := range p.opt.DNSBL {
			list = strings.Trim(strings.ToLower(strings.TrimSpace(list)), ".")
			if list != "" {
				p.rep.Reputation = append(p.rep.Reputation, p.dnsbl(ctx, s.addr, list))
			}
		}
	}
}

// dnsbl looks addr up in list. RFC 5782 §2.1 and §2.3: an A record in
// 127.0.0.0/8 means listed, NXDOMAIN means not listed, and the TXT record
// of the same name, if any, says why.
func (p *prober) dnsbl(ctx context.Context, addr netip.Addr, list string) (r DNSBLResult) {
	start := p.opt.Now()
	r = DNSBLResult{List: list, Address: addr.String(), Query: dnsblName(addr, list), Codes: []string{}}
	defer func() { r.Elapsed = p.since(start) }()
	codes, err := p.res.LookupA(ctx, r.Query)
	var de *classifier.DNSError
	switch {
	case errors.As(err, &de) && de.Kind == classifier.DNSNXDomain:
		return r
	case err != nil:
		r.Error = err.Error()
		return r
	}
	r.Codes = addrStrings(codes)
	for _, c := range codes {
		b := c.As4()
		switch {
		case !c.Is4() || b[0] != 127:
			r.Error = fmt.Sprintf("answer %s is outside 127.0.0.0/8: the list may be defunct and answering everything", c)
		case b[1] == 255 && b[2] == 255:
			// Spamhaus and others answer 127.255.255.x for queries they
			// will not serve: through a public resolver, over the free
			// quota, or a malformed query. That is no listing.
			r.Error = fmt.Sprintf("the list refused the query (answer %s): it may not serve queries from your resolver", c)
		default:
			r.Listed = true
		}
	}
	if r.Listed {
		r.Error = ""
		if txt, err := p.res.LookupTXT(ctx, r.Query); err == nil {
			r.Reason = strings.Join(txt, "; ")
		}
	}
	return r
}

// dnsblName is the query name for addr in list: the IPv4 octets or the
// IPv6 nibbles in reverse order, then the list's zone (RFC 5782 §2.1, §2.4).
func dnsblName(addr netip.Addr, list string) string {
	addr = addr.Unmap()
	var parts []string
	if addr.Is4() {
		b := addr.As4()
		for i := len(b) - 1; i >= 0; i-- {
			parts = append(parts, fmt.Sprint(b[i]))
		}
	} else {
		b := addr.As16()
		const hex = "0123456789abcdef"
		for i := len(b) - 1; i >= 0; i-- {
			parts = append(parts, string(hex[b[i]&0xf]), string(hex[b[i]>>4]))
		}
	}
	return strings.Join(parts, ".") + "." + list
}
