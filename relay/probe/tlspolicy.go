package probe

import (
	"context"
	"crypto/tls"
	"errors"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
)

// TLSPolicy decides a destination's DANE and MTA-STS policy, as the
// delivery engine does (*tlspolicy.Checker).
type TLSPolicy interface {
	Decide(ctx context.Context, domain string, hosts []string) tlspolicy.Decision
}

// PolicyReport is the TLS policy that applies to an MX destination.
type PolicyReport struct {
	MXSecure string       `json:"mx_dnssec,omitempty"` // secure, insecure or bogus (DNSSEC on only)
	DANE     []DANEReport `json:"dane,omitempty"`
	STSMode  string       `json:"mta_sts_mode,omitempty"` // enforce, testing; "" without a policy
	STSMX    []string     `json:"mta_sts_mx,omitempty"`   // the policy's MX patterns
	STSError string       `json:"mta_sts_error,omitempty"`
	Hosts    []HostPolicy `json:"hosts"`
}

// DANEReport is what DNSSEC said about one MX host's TLSA records.
type DANEReport struct {
	Host    string   `json:"host"`
	Base    string   `json:"tlsa_base"`
	State   string   `json:"state"`   // secure, insecure or bogus
	Records []string `json:"records"` // "usage selector matching data", "(unusable)" appended where RFC 7672 ignores it
	Error   string   `json:"error,omitempty"`
}

// HostPolicy is the policy one MX host is reached under.
type HostPolicy struct {
	Host   string `json:"host"`
	Policy string `json:"policy"`
	Refuse string `json:"refused,omitempty"` // why the host is not used, if it is not
}

// tlsPolicy looks up the policy of an MX route and keeps the decision for
// paths.
func (p *prober) tlsPolicy(ctx context.Context, rt mx.Route) {
	if p.opt.TLSPolicy == nil || (rt.Kind != mx.KindMX && rt.Kind != mx.KindImplicitMX) {
		return
	}
	var hosts []string
	for _, h := range rt.Hops {
		hosts = append(hosts, h.Host)
	}
	dec := p.opt.TLSPolicy.Decide(ctx, rt.Domain, hosts)
	p.dec = &dec
	pr := &PolicyReport{}
	if len(dec.DANE) > 0 || dec.MXSec != tlspolicy.Insecure {
		pr.MXSecure = dec.MXSec.String()
	}
	for _, h := range dec.DANE {
		dr := DANEReport{Host: h.Host, Base: h.Base, State: h.State.String(), Records: []string{}}
		for _, r := range h.Records {
			s := r.String()
			if !r.Usable() {
				s += " (unusable)"
			}
			dr.Records = append(dr.Records, s)
		}
		if h.Err != nil {
			dr.Error = h.Err.Error()
		}
		pr.DANE = append(pr.DANE, dr)
	}
	if dec.STS != nil {
		pr.STSMode, pr.STSMX = dec.STS.Mode, dec.STS.MX
	}
	if dec.STSErr != nil {
		pr.STSError = dec.STSErr.Error()
	}
	for _, h := range hosts {
		r := dec.Rule(h)
		hp := HostPolicy{Host: h, Policy: r.Label}
		if r.Refuse != nil {
			hp.Refuse = r.Refuse.Error()
		}
		pr.Hosts = append(pr.Hosts, hp)
	}
	p.rep.Policy = pr
}

// applyRule sets s's TLS mode and configuration for host under the
// decision; it returns the refusal when the policy forbids the host.
func (p *prober) applyRule(s *session) error {
	s.config = nil
	if p.dec == nil {
		return nil
	}
	r := p.dec.Rule(s.host)
	if r.Refuse != nil {
		return r.Refuse
	}
	if r.Mode != "" {
		s.policy = r.Mode
	}
	s.config = r.Config
	return nil
}

// refusedPath reports a host the policy forbids: not dialed, deferred.
func (p *prober) refusedPath(host string, err error) PathReport {
	pr := PathReport{Host: host, Steps: []Step{{Name: "tls policy", Error: err.Error()}}, Extensions: []string{},
		Outcome: Deferred, Reason: string(classifier.TLS)}
	var te *smtpvocab.TLSError
	if errors.As(err, &te) {
		pr.Steps[0].Reason = string(classifier.TLS)
	}
	return pr
}

// sessionConfig is the TLS configuration a session dials with.
func (p *prober) sessionConfig(s session) *tls.Config {
	if s.config != nil {
		return s.config
	}
	return p.opt.TLSConfig
}
