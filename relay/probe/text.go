package probe

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/internal/safetext"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/mx"
)

// printer writes lines and keeps the first write error. Peer-controlled
// text (replies, TXT records, host and certificate names) reaches a
// terminal, so each line goes through safetext.Text: an escape sequence or
// a bidi override in a reply must not drive the operator's terminal or
// disguise what the report says.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, a ...any) {
	if p.err == nil {
		_, p.err = io.WriteString(p.w, safetext.Text(fmt.Sprintf(format, a...))+"\n")
	}
}

// WriteText writes the report for people: the five steps in order (a
// sixth, sender authentication, with Options.From), each failure with its
// classified reason and explanation, then the verdict.
func (r Report) WriteText(w io.Writer) error {
	p := &printer{w: w}
	sender := "<" + r.Sender + ">"
	p.f("greyrelay probe %s: recipient <%s>, sender %s, %s", r.Target, r.Recipient, sender, r.Time.UTC().Format(time.RFC3339))
	r.Routing.write(p, r.Domain)
	if r.Policy != nil {
		r.Policy.write(p)
	}
	r.Identity.write(p)
	writeReputation(p, r.Reputation)
	p.f("\n4. SMTP path")
	if len(r.Paths) == 0 {
		p.f("   no host to connect to (see routing)")
	}
	for _, pr := range r.Paths {
		pr.write(p)
	}
	writeKnowledge(p, r)
	if r.Auth != nil {
		r.Auth.write(p)
	}
	reason := ""
	if r.Reason != "" {
		reason = " (" + r.Reason + ")"
	}
	p.f("\nVerdict: %s%s, exit status %d", r.Verdict, reason, r.ExitCode)
	return p.err
}

func (r RoutingReport) write(p *printer, domain string) {
	what := map[string]string{
		mx.KindSmarthost:  "smarthost (delivery.smarthost.address): all mail goes there",
		mx.KindRoute:      "static route (delivery.routes) for " + domain,
		mx.KindMX:         "MX records of " + domain + ", in preference order",
		mx.KindImplicitMX: "no MX records: the domain itself is the implicit MX (RFC 5321 §5.1)",
		mx.KindLiteral:    "address literal: that address itself, no DNS (delivery.address_literals: deliver)",
	}[r.Kind]
	p.f("\n1. Routing (%s)", r.Elapsed)
	if what != "" {
		p.f("   %s", what)
	}
	for _, h := range r.Hops {
		pref := ""
		if r.Kind == mx.KindMX {
			pref = fmt.Sprintf("MX %d ", h.Pref)
		}
		addrs := strings.Join(h.Addrs, ", ")
		if addrs == "" {
			addrs = "no usable address"
		}
		p.f("   %s%s port %d: %s", pref, h.Host, h.Port, addrs)
		if h.Error != "" {
			p.f("      lookup failed: %s", h.Error)
		}
		if len(h.Refused) > 0 {
			p.f("      refused as private (delivery.allow_private_destinations is off): %s", strings.Join(h.Refused, ", "))
		}
	}
	if r.Error != "" {
		p.f("   ! %s", r.Error)
		writeExplanation(p, "     ", r.Reason, r.Explanation)
	}
}

func (id IdentityReport) write(p *printer) {
	p.f("\n2. Our identity (%s)", id.Elapsed)
	helo := strings.Join(id.HELOAddrs, ", ")
	if id.HELOError != "" {
		helo = "does not resolve: " + id.HELOError
	}
	p.f("   HELO name %s: %s", id.HELO, helo)
	for _, s := range id.Sources {
		how := "configured"
		if s.Origin == "kernel" {
			how = "chosen by the kernel: delivery.source_ipv4/ipv6 is empty"
		}
		ptr := "no reverse DNS"
		if len(s.PTR) > 0 {
			ptr = "reverse DNS " + strings.Join(s.PTR, ", ")
			ptr += map[bool]string{true: ", forward-confirmed", false: ", NOT forward-confirmed"}[s.ForwardConfirmed]
		} else if s.PTRError != "" {
			ptr += " (" + s.PTRError + ")"
		}
		p.f("   source %s (%s): %s; HELO name %s it", s.Address, how, ptr,
			map[bool]string{true: "resolves to", false: "does NOT resolve to"}[s.HELOMatches])
	}
	for _, pr := range id.Problems {
		p.f("   ! %s", pr)
	}
	if len(id.Problems) > 0 {
		p.f("     Such mismatches are a common cause of deferrals and rejections: fix the PTR record or the hostname setting.")
	}
}

func writeReputation(p *printer, res []DNSBLResult) {
	p.f("\n3. Reputation")
	if len(res) == 0 {
		p.f("   no blocklists checked (probe.dnsbl is empty, or the source address is unknown)")
	}
	for _, b := range res {
		switch {
		case b.Listed:
			reason := ""
			if b.Reason != "" {
				reason = ": " + b.Reason
			}
			p.f("   ! %s is LISTED in %s (%s, %s)%s", b.Address, b.List, strings.Join(b.Codes, ", "), b.Elapsed, reason)
		case b.Error != "":
			p.f("   ? %s in %s: %s (%s)", b.Address, b.List, b.Error, b.Elapsed)
		default:
			p.f("   %s is not listed in %s (%s)", b.Address, b.List, b.Elapsed)
		}
	}
}

func (pr PathReport) write(p *printer) {
	pref := ""
	if pr.Pref > 0 {
		pref = fmt.Sprintf(" (MX %d)", pr.Pref)
	}
	p.f("   %s %s%s", pr.Host, pr.Address, pref)
	for _, s := range pr.Steps {
		el := ""
		if s.Elapsed > 0 {
			el = s.Elapsed.String()
		}
		if s.Sent != "" {
			p.f("     %9s  -> %s", "", s.Sent)
		}
		switch {
		case s.Reply != "":
			p.f("     %9s  <- %s", el, strings.ReplaceAll(s.Reply, "\n", "\n"+strings.Repeat(" ", 19)))
		case s.Name == "connect" && s.Error == "":
			p.f("     %9s  connected %s", el, s.Note)
		}
		if s.Error != "" {
			p.f("     %9s  !! %s failed: %s", el, s.Name, s.Error)
		}
		if s.Reason != "" {
			writeExplanation(p, "                ", s.Reason, s.Explanation)
		}
		if s.Note != "" && s.Name != "connect" {
			p.f("                %s", s.Note)
		}
	}
	if t := pr.TLS; t != nil {
		if t.Version != "" {
			p.f("     %s, %s", t.Version, t.Cipher)
		}
		verify := "verifies for " + t.ServerName
		if !t.VerifiesFor {
			verify = "does NOT verify for " + t.ServerName + ": " + t.VerifyError
		}
		exp := "expires"
		if t.Expired {
			exp = "EXPIRED"
		}
		p.f("     certificate %q issued by %q, %s %s; %s", t.Subject, t.Issuer, exp, t.NotAfter.UTC().Format(time.DateOnly), verify)
	}
	if len(pr.Extensions) > 0 {
		p.f("     extensions: %s", strings.Join(pr.Extensions, ", "))
	}
	reason := ""
	if pr.Reason != "" {
		reason = " (" + pr.Reason + ")"
	}
	p.f("     => %s%s", pr.Outcome, reason)
}

func writeExplanation(p *printer, indent, reason string, x *Explanation) {
	if x == nil {
		p.f("%sreason: %s", indent, reason)
		return
	}
	p.f("%sreason: %s: %s", indent, reason, x.Meaning)
	p.f("%susually at fault: %s. %s", indent, x.Fault, x.Action)
}

func writeKnowledge(p *printer, r Report) {
	p.f("\n5. What greyrelay knows about %s", r.Domain)
	k := r.Knowledge
	switch {
	case r.KnowledgeError != "":
		p.f("   %s", r.KnowledgeError)
		return
	case k == nil:
		p.f("   not asked")
		return
	}
	if d := k.Destination; d == nil {
		p.f("   nothing learned yet")
	} else {
		writeDestination(p, d, r.Time)
	}
	p.f("   %d recipient(s) queued", k.QueuedTotal)
	for _, q := range k.Queued {
		next := ""
		if q.NextAttempt != nil {
			next = ", next attempt " + q.NextAttempt.UTC().Format(time.RFC3339)
		}
		reply := ""
		if q.LastReply != nil {
			reply = fmt.Sprintf(", last reply %d %s %s", q.LastReply.Code, q.LastReply.Enhanced, q.LastReply.Text)
		}
		p.f("     %s <%s>: %s %s, %d attempt(s)%s%s", q.ID, q.Recipient, q.Status, q.Reason, q.Attempts, next, reply)
	}
}

func writeDestination(p *printer, d *admin.Destination, now time.Time) {
	if d.Greylists {
		p.f("   greylists: seen %d time(s), passed %d, learned delay %s", d.GreylistSeen, d.GreylistPassed,
			time.Duration(d.LearnedDelaySeconds*float64(time.Second)).Round(time.Second))
	} else {
		p.f("   no greylisting seen")
	}
	if d.ThrottledUntil != nil && d.ThrottledUntil.After(now) {
		p.f("   throttled (level %d) until %s", d.ThrottleLevel, d.ThrottledUntil.UTC().Format(time.RFC3339))
	} else if d.ThrottleLevel > 0 {
		p.f("   throttle level %d", d.ThrottleLevel)
	}
	for _, h := range d.DeadHosts {
		p.f("   dead host %s until %s", h.Host, h.Until.UTC().Format(time.RFC3339))
	}
	if d.LastReply != nil {
		p.f("   last reply: %d %s %s", d.LastReply.Code, d.LastReply.Enhanced, d.LastReply.Text)
	}
}

func (r PolicyReport) write(p *printer) {
	p.f("\n   TLS policy (DANE, MTA-STS)")
	if r.MXSecure != "" {
		p.f("   MX records: DNSSEC %s", r.MXSecure)
	}
	for _, d := range r.DANE {
		p.f("   TLSA of %s (base domain %s): %s", d.Host, d.Base, d.State)
		for _, rec := range d.Records {
			p.f("     %s", rec)
		}
		if d.Error != "" {
			p.f("     %s", d.Error)
		}
	}
	switch {
	case r.STSMode != "":
		p.f("   MTA-STS: mode %s, mx %s", r.STSMode, strings.Join(r.STSMX, ", "))
	case r.STSError != "":
		p.f("   MTA-STS: no policy (%s)", r.STSError)
	}
	for _, h := range r.Hosts {
		if h.Refuse != "" {
			p.f("   %s: %s, not used: %s", h.Host, h.Policy, h.Refuse)
		} else {
			p.f("   %s: %s", h.Host, h.Policy)
		}
	}
}
