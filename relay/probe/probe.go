// Package probe diagnoses the delivery path to one destination, the way an
// operator would by hand with dig and telnet, using exactly the relay's own
// configuration: router, resolver, pinned source address, HELO name and TLS
// policy. It is `greyrelay probe ADDRESS|DOMAIN` and GET /api/probe.
//
// Design notes:
//
//   - A probe is a delivery attempt that stops before DATA. Each MX host is
//     walked in the order the relay would try it: connect, greeting, EHLO,
//     STARTTLS, MAIL FROM (probe.sender, default <>), RCPT, then RSET and
//     QUIT. DATA is never sent, so no message is ever delivered; the probe
//     sender <> keeps a receiver from ever bouncing anything to us.
//   - Nothing is decided here that the relay decides elsewhere: routing is
//     mx.Router, the dialogue is smtpclient (whose Trace gives every line
//     with its timing), and each failure goes through the relay's classifier
//     and its explanation catalogue, so the probe says what the relay would
//     do with the same reply.
//   - The verdict follows delivery: hosts are tried in order; an accepted or
//     permanently refused RCPT ends the walk, a deferral or an unreachable
//     host moves on to the next MX (as chasquid and mox do). The exit code
//     is 0 accepted, 1 deferred, 2 refused or unreachable.
//   - Our own identity (forward-confirmed reverse DNS, HELO name) and the
//     source address's blocklist entries are checked for the address the
//     connections actually came from: the pinned one, or the one the kernel
//     chose, which is only known after connecting.
//   - What the running relay learned about the destination comes through
//     Options.Known (the admin API); the queue file is the daemon's.
//   - With a sender (Options.From), SPF, DKIM and DMARC of its domain are
//     checked from the same source addresses (auth.go). They do not change
//     the exit code, which is about the path.
//
// Probe writes nothing and keeps no state; time comes from Options.Now.
package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/dkim"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
)

// Verdicts, from best to worst.
const (
	Accepted    = "accepted"    // the path accepts the recipient
	Deferred    = "deferred"    // a 4xx reply: the relay would retry
	Refused     = "refused"     // a 5xx reply or a permanent DNS answer: the relay would bounce
	Unreachable = "unreachable" // no host answered (DNS, connect or TLS trouble)
)

// Options are the relay's settings a probe runs with. Hostname, Router,
// Dialer4 and Classifier are required.
type Options struct {
	Hostname string   // HELO name (config hostname)
	Sender   string   // MAIL FROM address; "" or "<>" is the null reverse-path
	DNSBL    []string // blocklist zones to look the source address up in
	Router   *mx.Router
	// Resolver answers the identity and blocklist queries; nil means
	// Router.Resolver.
	Resolver mx.Resolver
	// Dialer4 and Dialer6 dial from the pinned source addresses, as the
	// relay does; a nil Dialer6 means no IPv6 egress.
	Dialer4, Dialer6 smtpclient.Dialer
	// SourceIPv4 and SourceIPv6 are the configured source addresses; ""
	// means the kernel chooses (reported after connecting).
	SourceIPv4, SourceIPv6 string
	TLS                    smtpclient.TLSPolicy // for MX and static routes
	SmarthostTLS           smtpclient.TLSPolicy // for the smarthost
	TLSConfig              *tls.Config          // base TLS settings (roots); also used to verify certificates
	// Username and Password authenticate to the smarthost (never to MX hosts).
	Username, Password string
	// Timeouts; zero means smtpclient's defaults.
	ConnectTimeout, GreetingTimeout, CommandTimeout time.Duration
	Classifier                                      *classifier.Classifier
	// Known returns what the running relay knows about a domain; nil skips
	// that section. Its error is reported, not returned.
	Known func(ctx context.Context, domain string) (*Knowledge, error)
	Now   func() time.Time // nil: time.Now
	// From, if set, is the sender whose domain's SPF, DKIM and DMARC are
	// checked (auth.go); DKIM holds the keys the relay signs with.
	From string
	DKIM *dkim.Keys
	// TLSPolicy, if set, looks up DANE and MTA-STS for MX destinations;
	// each MX is then probed under its policy, as the relay would send.
	TLSPolicy TLSPolicy
}

// Report is the result of one probe. Its JSON form is the -json output and
// the admin API's answer.
type Report struct {
	Target     string         `json:"target"`
	Domain     string         `json:"domain"`
	Recipient  string         `json:"recipient"`
	Sender     string         `json:"sender"` // "" is the null reverse-path <>
	Time       time.Time      `json:"time"`
	Routing    RoutingReport  `json:"routing"`
	Identity   IdentityReport `json:"identity"`
	Reputation []DNSBLResult  `json:"reputation"`
	Paths      []PathReport   `json:"paths"`
	Policy     *PolicyReport  `json:"tls_policy,omitempty"` // DANE and MTA-STS, when looked up
	Knowledge  *Knowledge     `json:"knowledge,omitempty"`
	// KnowledgeError says why Knowledge is missing, e.g. "relay not running".
	KnowledgeError string `json:"knowledge_error,omitempty"`
	Verdict        string `json:"verdict"`          // Accepted, Deferred, Refused or Unreachable
	Reason         string `json:"reason,omitempty"` // classified reason of the deciding step
	ExitCode       int    `json:"exit_code"`        // 0 accepted, 1 deferred, 2 refused or unreachable

	// Auth is the sender authentication check, with Options.From only.
	Auth *AuthReport `json:"auth,omitempty"`
}

// Explanation is classifier.Explanation in JSON form.
type Explanation struct {
	Meaning string `json:"meaning"`
	Fault   string `json:"fault"`
	Action  string `json:"action"`
}

// Millis is a duration that appears in JSON as fractional milliseconds.
type Millis time.Duration

// MarshalJSON writes the duration in milliseconds.
func (m Millis) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, "%.3f", float64(m)/float64(time.Millisecond)), nil
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (m *Millis) UnmarshalJSON(b []byte) error {
	var f float64
	if _, err := fmt.Sscan(string(b), &f); err != nil {
		return fmt.Errorf("probe: bad milliseconds %q: %w", b, err)
	}
	*m = Millis(f * float64(time.Millisecond))
	return nil
}

// String rounds the duration for people.
func (m Millis) String() string {
	d := time.Duration(m)
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

// prober carries one probe's options and its report under construction.
type prober struct {
	opt Options
	res mx.Resolver
	rep *Report
	dec *tlspolicy.Decision // the destination's TLS policy, when looked up
}

// Run probes target, an address (user@domain) or a domain; for a domain
// the recipient is postmaster@domain, which every server must accept
// (RFC 5321 §4.5.1). The error is only for a bad target or bad options:
// everything the probe finds, failures included, is in the Report.
func Run(ctx context.Context, target string, opt Options) (Report, error) {
	if opt.Hostname == "" || opt.Router == nil || opt.Dialer4 == nil || opt.Classifier == nil {
		return Report{}, errors.New("probe: Hostname, Router, Dialer4 and Classifier are required")
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.From != "" {
		a, err := address.Parse(strings.TrimSuffix(strings.TrimPrefix(opt.From, "<"), ">"), address.Options{Sender: true})
		if err != nil || a.Domain == "" || strings.HasPrefix(a.Domain, "[") {
			return Report{}, fmt.Errorf("probe: bad -from %q: want an address with a domain", opt.From)
		}
		opt.From = a.String()
	}
	p := &prober{opt: opt, res: opt.Resolver}
	if p.res == nil {
		p.res = opt.Router.Resolver
	}
	rep, err := newReport(target, opt.Sender)
	if err != nil {
		return Report{}, err
	}
	rep.Time, rep.Paths = opt.Now(), []PathReport{}
	p.rep = &rep
	route, ok := p.routing(ctx)
	if ok {
		p.tlsPolicy(ctx, route)
		p.paths(ctx, route)
	}
	p.identity(ctx)
	p.reputation(ctx)
	p.knowledge(ctx)
	p.auth(ctx)
	p.decide()
	return rep, nil
}

// newReport parses the target and the probe sender.
func newReport(target, sender string) (Report, error) {
	t := strings.TrimSpace(target)
	t = strings.TrimSuffix(strings.TrimPrefix(t, "<"), ">")
	var rep Report
	if strings.Contains(t, "@") {
		a, err := address.Parse(t, address.Options{})
		if err != nil {
			return rep, fmt.Errorf("probe: bad address %q: %w", target, err)
		}
		rep.Recipient, rep.Domain = a.String(), a.Domain
	} else {
		d, err := address.ParseDomain(strings.TrimSuffix(t, "."), address.Options{})
		if err != nil {
			return rep, fmt.Errorf("probe: bad domain %q: %w", target, err)
		}
		rep.Recipient, rep.Domain = "postmaster@"+d, d
	}
	if strings.HasPrefix(rep.Domain, "[") {
		return rep, fmt.Errorf("probe: %q: address literals are not routed by greyrelay", target)
	}
	rep.Target = t
	if s := strings.TrimSpace(sender); s != "" && s != "<>" {
		a, err := address.Parse(strings.TrimSuffix(strings.TrimPrefix(s, "<"), ">"), address.Options{Sender: true})
		if err != nil {
			return rep, fmt.Errorf("probe: bad probe.sender %q: %w", sender, err)
		}
		rep.Sender = a.String()
	}
	return rep, nil
}

// explain classifies err at stage and returns the reason, its explanation
// and whether the relay would give up (a permanent failure).
func (p *prober) explain(stage smtpvocab.Stage, err error) (string, *Explanation, bool) {
	v := p.opt.Classifier.Classify(stage, err)
	x := classifier.Explain(v.Reason, v.Status())
	return string(v.Reason), &Explanation{Meaning: x.Meaning, Fault: string(x.Fault), Action: x.Action}, v.Permanent()
}

// since measures from start with the injected clock.
func (p *prober) since(start time.Time) Millis { return Millis(p.opt.Now().Sub(start)) }

// decide sets the verdict as delivery would reach it: the first accepted or
// refused path decides; deferrals and unreachable hosts pass the turn to
// the next host.
func (p *prober) decide() {
	r := p.rep
	r.Verdict = Unreachable
	if r.Routing.Error != "" && len(r.Paths) == 0 {
		if r.Routing.Permanent {
			r.Verdict = Refused
		}
		r.Reason = r.Routing.Reason
	}
	for _, pr := range r.Paths {
		switch pr.Outcome {
		case Accepted, Refused:
			r.Verdict, r.Reason = pr.Outcome, pr.Reason
		case Deferred:
			if r.Verdict != Deferred {
				r.Verdict, r.Reason = Deferred, pr.Reason
			}
			continue
		case Unreachable:
			if r.Verdict == Unreachable && r.Reason == "" {
				r.Reason = pr.Reason
			}
			continue
		}
		break
	}
	r.ExitCode = map[string]int{Accepted: 0, Deferred: 1, Refused: 2, Unreachable: 2}[r.Verdict]
}
