package delivery

import (
	"context"
	"errors"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
)

// TLSPolicy decides the TLS a destination's MX hosts require (DANE,
// MTA-STS); *tlspolicy.Checker implements it. It is asked once per attempt,
// before any host is dialed.
type TLSPolicy interface {
	Decide(ctx context.Context, domain string, hosts []string) tlspolicy.Decision
}

// applyTLSPolicy sets each target's TLS mode and configuration from the
// destination's policy and drops the targets the policy forbids. Routes
// the operator configured (smarthost, per-domain route, address literal)
// keep their configured TLS: a policy published in DNS is about MX
// delivery. When every target is forbidden, refused says why (a
// *classifier.TLSError: reason "tls", 4.7.5, never a plaintext fallback).
func (e *Engine) applyTLSPolicy(ctx context.Context, rt mx.Route, ts []target) (out []target, refused error) {
	if e.opt.TLSPolicy == nil || (rt.Kind != mx.KindMX && rt.Kind != mx.KindImplicitMX) || len(ts) == 0 {
		return ts, nil
	}
	var hosts []string
	for _, h := range rt.Hops {
		hosts = append(hosts, h.Host)
	}
	dec := e.opt.TLSPolicy.Decide(ctx, rt.Domain, hosts)
	for _, t := range ts {
		r := dec.Rule(t.host)
		t.policy = r.Label
		if r.Refuse != nil {
			refused = r.Refuse
			e.m.TLSPolicy.WithLabelValues(r.Label, "refused").Inc()
			continue
		}
		if r.Mode != "" {
			t.tls = r.Mode
		}
		t.tlsConfig, t.authenticated = r.Config, r.Authenticated
		out = append(out, t)
	}
	if len(out) > 0 {
		refused = nil
	}
	return out, refused
}

// countTLSPolicy counts a dial's outcome under its target's policy.
func (e *Engine) countTLSPolicy(t target, err error) {
	if t.policy == "" {
		return
	}
	var te *classifier.TLSError
	switch {
	case err == nil:
		e.m.TLSPolicy.WithLabelValues(t.policy, "ok").Inc()
	case errors.As(err, &te):
		e.m.TLSPolicy.WithLabelValues(t.policy, "failed").Inc()
	}
}
