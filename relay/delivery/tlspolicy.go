package delivery

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

// TLSPolicy decides the TLS a destination's MX hosts require (DANE,
// MTA-STS); *tlspolicy.Checker implements it. It is asked once per attempt,
// before any host is dialed.
type TLSPolicy interface {
	Decide(ctx context.Context, domain string, hosts []string) tlspolicy.Decision
}

// errRequireTLS: a REQUIRETLS message has no next hop whose TLS is
// authenticated (RFC 8689 §4.2.1: return it as undeliverable).
var errRequireTLS = errors.New("REQUIRETLS: no MX host of the destination is authenticated by DANE or MTA-STS, and the message requires it")

// labelTLSOptional marks an attempt whose policy was set aside because the
// message has "TLS-Required: No" (RFC 8689 §5).
const labelTLSOptional = "tls-required-no"

// tlsVerdict classifies what applyTLSPolicy refused: a REQUIRETLS message
// without an authenticated host bounces with 5.7.30 (RFC 8689 §6); a
// policy failure (a DANE or MTA-STS host refused) defers with reason tls.
func tlsVerdict(c *classifier.Classifier, err error) classifier.Verdict {
	if errors.Is(err, errRequireTLS) {
		return classifier.Verdict{Outcome: classifier.Failed, Reason: classifier.TLS,
			Stage: smtpvocab.StageSTARTTLS, Enhanced: "5.7.30", Text: err.Error()}
	}
	return c.Classify(smtpvocab.StageSTARTTLS, err)
}

// applyTLSPolicy sets each target's TLS mode and configuration from the
// destination's policy and drops the targets the policy forbids. Routes
// the operator configured (smarthost, per-domain route, address literal)
// keep their configured TLS: a policy published in DNS is about MX
// delivery. When every target is dropped, refused says why: a
// *smtpvocab.TLSError (reason "tls", 4.7.5, never a plaintext fallback),
// or errRequireTLS.
// The policy of a refused host is noted in a.tried, so the attempt's
// history names it.
func (e *Engine) applyTLSPolicy(ctx context.Context, rt mx.Route, ts []target, a *attempt) (out []target, refused error) {
	msg := a.msg
	if len(ts) == 0 {
		return ts, nil
	}
	if rt.Kind != mx.KindMX && rt.Kind != mx.KindImplicitMX || e.opt.TLSPolicy == nil {
		for _, t := range ts {
			if st, ok := shape(t, nil, msg); ok {
				out = append(out, st)
			}
		}
		if len(out) == 0 && msg.RequireTLS {
			return nil, errRequireTLS
		}
		return out, nil
	}
	var hosts []string
	for _, h := range rt.Hops {
		hosts = append(hosts, h.Host)
	}
	dec := e.opt.TLSPolicy.Decide(ctx, rt.Domain, hosts)
	e.reportSTSError(dec)
	var transient error
	for _, t := range ts {
		r := dec.Rule(t.host)
		st, ok := shape(t, &r, msg)
		switch {
		case ok:
			if st.policy != labelTLSOptional {
				st.report = reportPolicy(dec, t.host, r.Label)
			}
			out = append(out, st)
		case r.Refuse != nil:
			transient, a.tried.policy = r.Refuse, r.Label
			e.reportRefusal(reportPolicy(dec, t.host, r.Label), t, r)
			e.m.TLSPolicy.WithLabelValues(r.Label, "refused").Inc()
		}
	}
	switch {
	case len(out) > 0:
		return out, nil
	case transient != nil:
		return nil, transient // a DNSSEC failure or a policy refusal may pass later
	case msg.RequireTLS:
		return nil, errRequireTLS
	}
	return out, nil
}

// shape returns t as msg must reach it under r, the policy of t's host
// (nil when none was asked: a configured route, or no policy checker), and
// false when msg may not go to t at all: the policy refuses the host, or
// msg requires TLS (REQUIRETLS) and t's identity will not be
// authenticated. t comes as targets built it, with delivery.tls or the
// route's own mode. The rule is kept in the result, so that a later message
// on the same connection is held to its own policy (session.rides).
func shape(t target, r *tlspolicy.Rule, msg queue.Message) (target, bool) {
	t.rule = r
	if r == nil {
		// RFC 8689 §4.2.1 allows a relay to trust a configured next hop
		// whose certificate is verified; an MX without a policy is not
		// authenticated.
		t.authenticated = t.configured && t.tls == smtpclient.TLSVerify
		return t, t.authenticated || !msg.RequireTLS
	}
	t.policy = r.Label
	switch {
	case msg.TLSOptional && !msg.RequireTLS:
		// RFC 8689 §5: the sender asks that policies not hold the
		// message back: delivery.tls applies.
		t.policy = labelTLSOptional
		return t, true
	case r.Refuse != nil:
		return t, false
	case msg.RequireTLS && !r.Authenticated:
		return t, false
	}
	if r.Mode != "" {
		t.tls = r.Mode
	}
	t.tlsConfig, t.authenticated, t.check = r.Config, r.Authenticated, r.Check
	return t, true
}

// countTLSPolicy counts a dial's outcome under its target's policy. A
// session without a policy that stayed in plaintext is no TLS session and
// is not reported (RFC 8460 §4.4 counts TLS sessions). A host under an
// MTA-STS policy in testing mode is reported as the policy would have
// judged it (testingResult), whatever became of the delivery.
func (e *Engine) countTLSPolicy(t target, c *smtpclient.Client, err error) {
	if t.policy == "" {
		return
	}
	var te *smtpvocab.TLSError
	switch {
	case err == nil:
		e.m.TLSPolicy.WithLabelValues(t.policy, "ok").Inc()
		if e.opt.TLSReport == nil || c == nil {
			return
		}
		if t.check != nil && t.tls != smtpclient.TLSNone {
			if cerr := testingResult(t, c); cerr != nil {
				e.reportFailure(t, cerr)
				return
			}
			e.opt.TLSReport.Success(t.report, e.now())
		} else if isTLS(c) {
			e.opt.TLSReport.Success(t.report, e.now())
		}
	case errors.As(err, &te):
		e.m.TLSPolicy.WithLabelValues(t.policy, "failed").Inc()
		if e.opt.TLSReport != nil {
			e.reportFailure(t, err)
		}
	}
}

// reportFailure counts a failed session with t for its TLS report.
func (e *Engine) reportFailure(t target, err error) {
	e.opt.TLSReport.Failure(t.report, tlsrpt.Failure{ResultType: tlsrpt.ResultType(t.report.Type, err),
		MXHost: t.host, ReceivingIP: t.addrString()}, e.now())
}

// errSTARTTLSFailed: STARTTLS was offered but the handshake failed, and
// opportunistic TLS went on in plaintext (smtpclient.DialWithFallback).
var errSTARTTLSFailed = errors.New("the STARTTLS handshake failed; the session went on in plaintext")

// testingResult is what t's testing policy says of the session c (RFC 8461
// §5: verified and reported as if enforced, never acted on).
func testingResult(t target, c *smtpclient.Client) error {
	if cs, ok := c.TLS(); ok {
		return t.check(&cs)
	}
	err := t.check(nil)
	if offered, _ := c.Extension("STARTTLS"); offered && errors.Is(err, smtpclient.ErrNoSTARTTLS) {
		return errSTARTTLSFailed // RFC 8460 §4.3.1 has no better name: validation-failure
	}
	return err
}

// reportSTSError counts an MTA-STS policy that was announced but could not
// be had (RFC 8460 §4.3.2.2), once per attempt.
func (e *Engine) reportSTSError(dec tlspolicy.Decision) {
	var fe *tlspolicy.FetchError
	if e.opt.TLSReport == nil || dec.STS != nil || !errors.As(dec.STSErr, &fe) {
		return
	}
	e.opt.TLSReport.Failure(tlsrpt.Policy{Type: tlsrpt.TypeSTS, Domain: dec.Domain},
		tlsrpt.Failure{ResultType: tlsrpt.STSResultType(fe), AdditionalInfo: fe.Error()}, e.now())
}

// reportRefusal counts a host the policy refused before any connection: a
// failed DNSSEC lookup (RFC 8460 §4.3.2.1 dnssec-invalid) or an MX that
// an enforced MTA-STS policy does not list (§4.3.2.2 validation-failure).
func (e *Engine) reportRefusal(p tlsrpt.Policy, t target, r tlspolicy.Rule) {
	if e.opt.TLSReport == nil {
		return
	}
	rt := tlsrpt.ResultValidationFailure
	if r.Label == tlspolicy.LabelDANE {
		rt = tlsrpt.ResultDNSSECInvalid
	}
	e.opt.TLSReport.Failure(p, tlsrpt.Failure{ResultType: rt, MXHost: t.host, ReceivingIP: t.addrString()}, e.now())
}

// reportPolicy describes, for TLS reports, the policy host was held to
// (RFC 8460 §4.4: the TLSA records of the host, or the MTA-STS policy).
func reportPolicy(dec tlspolicy.Decision, host, label string) tlsrpt.Policy {
	p := tlsrpt.Policy{Type: tlsrpt.TypeNoPolicy, Domain: dec.Domain}
	switch label {
	case tlspolicy.LabelDANE, tlspolicy.LabelDANEOnly:
		p.Type, p.MXHosts = tlsrpt.TypeTLSA, []string{host}
		for _, hd := range dec.DANE {
			if strings.EqualFold(hd.Host, host) {
				for _, rec := range hd.Records {
					p.Strings = append(p.Strings, rec.String())
				}
			}
		}
	case tlspolicy.LabelSTS, tlspolicy.LabelSTSTesting:
		if dec.STS != nil {
			p.Type, p.MXHosts = tlsrpt.TypeSTS, dec.STS.MX
			p.Strings = append(p.Strings, "version: STSv1", "mode: "+dec.STS.Mode)
			for _, m := range dec.STS.MX {
				p.Strings = append(p.Strings, "mx: "+m)
			}
			p.Strings = append(p.Strings, fmt.Sprintf("max_age: %d", dec.STS.MaxAge))
		}
	}
	return p
}

// isTLS reports whether the session runs under TLS.
func isTLS(c *smtpclient.Client) bool {
	_, ok := c.TLS()
	return ok
}
