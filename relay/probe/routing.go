package probe

import (
	"context"
	"net/netip"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/mx"
)

// RoutingReport is step 1: where mail for the domain goes.
type RoutingReport struct {
	// Kind is mx.KindSmarthost, mx.KindRoute, mx.KindMX, mx.KindImplicitMX
	// (no MX records: the domain itself, RFC 5321 §5.1) or mx.KindLiteral.
	Kind    string      `json:"kind"`
	Elapsed Millis      `json:"elapsed_ms"`
	Hops    []HopReport `json:"hops"`
	// Error is set when no host can be tried: NXDOMAIN, a null MX
	// (RFC 7505), SERVFAIL, a timeout, or hosts that resolve to nothing
	// usable. Reason and Explanation classify it; Permanent means the relay
	// would bounce rather than retry.
	Error       string       `json:"error,omitempty"`
	Reason      string       `json:"reason,omitempty"`
	Explanation *Explanation `json:"explanation,omitempty"`
	Permanent   bool         `json:"permanent,omitempty"`
}

// HopReport is one host to try, in the relay's order.
type HopReport struct {
	Host  string   `json:"host"`
	Pref  uint16   `json:"pref"` // MX preference; 0 for routes and smarthosts
	Port  int      `json:"port"`
	Addrs []string `json:"addrs"` // addresses the relay would connect to, in order
	// Refused are addresses the relay will not connect to: loopback and
	// private ranges, unless delivery.allow_private_destinations is set.
	Refused []string `json:"refused,omitempty"`
	Error   string   `json:"error,omitempty"` // why the host did not resolve
}

// routing runs the relay's router and reports its answer; ok says whether
// there is any host to connect to.
func (p *prober) routing(ctx context.Context) (mx.Route, bool) {
	start := p.opt.Now()
	rt, err := p.opt.Router.Route(ctx, p.rep.Domain)
	r := RoutingReport{Kind: rt.Kind, Elapsed: p.since(start), Hops: []HopReport{}}
	for _, h := range rt.Hops {
		hr := HopReport{Host: h.Host, Pref: h.Pref, Port: h.Port, Addrs: addrStrings(h.Addrs), Refused: addrStrings(h.Refused)}
		if h.Err != nil {
			hr.Error = h.Err.Error()
		}
		r.Hops = append(r.Hops, hr)
	}
	if err != nil {
		r.Error = err.Error()
		r.Reason, r.Explanation, r.Permanent = p.explain(smtpvocab.StageDNS, err)
	}
	p.rep.Routing = r
	return rt, err == nil
}

func addrStrings(addrs []netip.Addr) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}
