package probe

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"blitiri.com.ar/go/spf"
	"github.com/emersion/go-msgauth/dmarc"
	"golang.org/x/net/publicsuffix"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/relay/dkim"
	"github.com/greyrelay/greyrelay/relay/mx"
)

// Sender authentication (step 6, `probe -from ADDRESS`): what a receiver's
// SPF, DKIM and DMARC checks will conclude about mail from the relay for
// the sender's domain, each with what to fix.
//
//   - SPF (RFC 7208) is evaluated with blitiri.com.ar/go/spf, chasquid's
//     evaluator: it implements the whole of RFC 7208 (macros, the 10-lookup
//     and 2-void-lookup limits, redirect, exp) and takes a resolver, so it
//     runs over the relay's own DNS client here; writing another
//     evaluator would add a second copy of those rules to get wrong. It is
//     evaluated for each source address the relay sends from (the pinned
//     one, or the kernel's choice seen on the probe's connections), with
//     the sender's domain as MAIL FROM identity.
//   - DKIM: each selector the relay signs with for the domain must publish
//     exactly the public half of its key (RFC 6376 §3.6.1); anything else
//     fails verification at every receiver.
//   - DMARC (RFC 7489 §6.6.3): the record of the From domain, else of its
//     organisational domain (the public suffix list decides it). The probe
//     sender is both the envelope sender and the From address, so SPF is
//     aligned whenever it passes, and a matching DKIM selector is aligned
//     because the relay signs with d= the From domain. DMARC passes when
//     either does.

// Verdicts of the authentication checks.
const (
	AuthPass = "pass" // as a receiver would see it: good
	AuthFail = "fail" // a receiver will hold it against the mail
	AuthWarn = "warn" // works, but weaker than it should be
	AuthNone = "none" // nothing published or configured
)

// AuthReport is step 6.
type AuthReport struct {
	Domain  string       `json:"domain"` // the sender's domain
	SPF     []SPFResult  `json:"spf"`    // one per source address
	DKIM    []DKIMResult `json:"dkim"`   // one per configured selector
	DMARC   DMARCResult  `json:"dmarc"`
	Verdict string       `json:"verdict"` // the worst of the three
	Elapsed Millis       `json:"elapsed_ms"`
}

// SPFResult is the SPF check of the sender's domain for one source address.
type SPFResult struct {
	Address string `json:"address"`
	Result  string `json:"result"` // RFC 7208 §2.6: pass, fail, softfail, neutral, none, permerror, temperror
	Record  string `json:"record,omitempty"`
	Error   string `json:"error,omitempty"`
	Verdict string `json:"verdict"`
	Fix     string `json:"fix,omitempty"`
}

// DKIMResult compares one configured selector with its DNS record.
type DKIMResult struct {
	Selector  string `json:"selector"`
	Name      string `json:"name"` // selector._domainkey.domain
	Algorithm string `json:"algorithm"`
	Record    string `json:"record,omitempty"`
	Error     string `json:"error,omitempty"`
	Verdict   string `json:"verdict"`
	Fix       string `json:"fix,omitempty"`
}

// DMARCResult is the domain's DMARC policy and whether mail from the relay
// passes it.
type DMARCResult struct {
	Name        string `json:"name,omitempty"` // where the record was found
	Record      string `json:"record,omitempty"`
	Policy      string `json:"policy,omitempty"` // p= (sp= for a subdomain)
	SPFAligned  bool   `json:"spf_aligned"`      // SPF passes, aligned with the From domain
	DKIMAligned bool   `json:"dkim_aligned"`     // a signing key matches DNS, aligned
	Error       string `json:"error,omitempty"`
	Verdict     string `json:"verdict"`
	Fix         string `json:"fix,omitempty"`
}

// auth fills step 6 when the probe has a sender.
func (p *prober) auth(ctx context.Context) {
	if p.opt.From == "" {
		return
	}
	start := p.opt.Now()
	domain := strings.ToLower(p.opt.From[strings.LastIndexByte(p.opt.From, '@')+1:])
	a := &AuthReport{Domain: domain, SPF: []SPFResult{}, DKIM: []DKIMResult{}}
	srcs := p.sources()
	for _, s := range srcs {
		a.SPF = append(a.SPF, p.spf(ctx, s.addr, domain))
	}
	if len(srcs) == 0 {
		a.SPF = append(a.SPF, p.spfNoSource(ctx, domain))
	}
	a.DKIM = p.dkimKeys(ctx, domain)
	a.DMARC = p.dmarc(ctx, domain, a)
	a.Verdict = worst(a)
	a.Elapsed = p.since(start)
	p.rep.Auth = a
}

// spf evaluates the SPF record of domain for addr.
func (p *prober) spf(ctx context.Context, addr netip.Addr, domain string) SPFResult {
	r := SPFResult{Address: addr.String()}
	res, err := spf.CheckHostWithSender(net.IP(addr.AsSlice()), p.opt.Hostname, p.opt.From,
		spf.WithContext(ctx), spf.WithResolver(spfResolver{p.res}))
	r.Result = string(res)
	if txts, err := p.res.LookupTXT(ctx, domain); err == nil {
		for _, t := range txts {
			if l := strings.ToLower(t); l == "v=spf1" || strings.HasPrefix(l, "v=spf1 ") {
				r.Record = t
			}
		}
	}
	if err != nil && (res == spf.PermError || res == spf.TempError) {
		r.Error = err.Error() // otherwise it says which term matched
	}
	ip := "ip4:" + addr.String()
	if addr.Is6() {
		ip = "ip6:" + addr.String()
	}
	switch res {
	case spf.Pass:
		r.Verdict = AuthPass
	case spf.None:
		r.Verdict = AuthFail
		r.Fix = fmt.Sprintf("publish an SPF record: %s TXT \"v=spf1 %s -all\" (plus your other senders)", domain, ip)
	case spf.Fail, spf.SoftFail, spf.Neutral:
		r.Verdict = AuthFail
		r.Fix = fmt.Sprintf("add %s to the SPF record of %s, before its final all", ip, domain)
	case spf.PermError:
		r.Verdict = AuthFail
		r.Fix = fmt.Sprintf("the SPF record of %s is invalid (%s); receivers treat it as a failure: correct it", domain, r.Error)
	default: // temperror
		r.Verdict = AuthFail
		r.Fix = "the DNS lookup of " + domain + " failed temporarily (" + r.Error + "): check the domain's name servers and delivery.resolver, then probe again"
	}
	return r
}

// spfNoSource is the SPF line when no source address is known (no
// connection was made): the record can still be read, and a failed lookup
// is the thing to fix, not the missing address.
func (p *prober) spfNoSource(ctx context.Context, domain string) SPFResult {
	r := SPFResult{Result: "unknown", Verdict: AuthFail,
		Fix: "the source address is unknown (no connection was made): set delivery.source_ipv4"}
	if _, err := p.res.LookupTXT(ctx, domain); err != nil && !isNXDomain(err) {
		r.Result, r.Error = string(spf.TempError), dnsWhat(err)
		r.Fix = "the DNS lookup of " + domain + " failed temporarily (" + r.Error + "): check the domain's name servers and delivery.resolver, then probe again"
	}
	return r
}

// isNXDomain reports whether err says the name does not exist: an answer,
// unlike a server failure or a timeout, which say nothing about the record.
func isNXDomain(err error) bool {
	var de *classifier.DNSError
	return errors.As(err, &de) && de.Kind == classifier.DNSNXDomain
}

// dkimKeys compares each selector the relay signs with for domain with its
// published key record.
func (p *prober) dkimKeys(ctx context.Context, domain string) []DKIMResult {
	sels := p.opt.DKIM.For(domain)
	if len(sels) == 0 {
		return []DKIMResult{{Verdict: AuthNone,
			Fix: fmt.Sprintf("greyrelay does not sign for %s: make a key with `greyrelay dkim keygen %s SELECTOR` and add it to dkim.domains", domain, domain)}}
	}
	out := make([]DKIMResult, 0, len(sels))
	for _, s := range sels {
		out = append(out, p.dkimKey(ctx, s))
	}
	return out
}

func (p *prober) dkimKey(ctx context.Context, s dkim.Selector) DKIMResult {
	r := DKIMResult{Selector: s.Name, Name: s.Name + "._domainkey." + s.Domain, Algorithm: s.Algorithm()}
	publish := fmt.Sprintf("publish %s TXT \"%s\"", r.Name, s.Record())
	txts, err := p.res.LookupTXT(ctx, r.Name)
	if err != nil && !isNXDomain(err) {
		// A server failure or timeout says nothing about the record:
		// advising to publish it would send the operator the wrong way.
		r.Verdict, r.Error = AuthFail, "lookup failed: "+dnsWhat(err)
		r.Fix = "the DNS lookup failed, so whether the key record is there is unknown: check the domain's name servers and delivery.resolver, then probe again"
		return r
	}
	if len(txts) == 0 {
		r.Verdict, r.Fix, r.Error = AuthFail, publish, "no key record"
		return r
	}
	if len(txts) > 1 {
		// RFC 6376 §3.6.2.2: verifiers' behaviour with several is undefined.
		r.Verdict, r.Error, r.Fix = AuthFail, "several TXT records", "keep only one: "+publish
		return r
	}
	r.Record = txts[0]
	tags := parseTags(r.Record)
	want := dkim.PublicKeyData(s.Key.Public())
	switch {
	case tags["p"] == "":
		r.Verdict, r.Error, r.Fix = AuthFail, "the key is revoked (empty p=) or missing", publish
	case strings.Join(strings.Fields(tags["p"]), "") != want:
		r.Verdict, r.Error = AuthFail, "the published key is not the key greyrelay signs with"
		r.Fix = "replace the record: " + publish
	case keyType(tags["k"]) != keyType(algoKey(s.Key.Public())):
		r.Verdict, r.Error, r.Fix = AuthFail, "k= does not match the key type", publish
	case tags["t"] != "" && strings.Contains(tags["t"], "y"):
		r.Verdict, r.Error = AuthWarn, "t=y: the domain is testing DKIM, verifiers may ignore failures"
		r.Fix = "remove t=y once signatures verify"
	default:
		r.Verdict = AuthPass
	}
	return r
}

func algoKey(pub crypto.PublicKey) string {
	if dkim.Algorithm(pub) == dkim.Ed25519SHA256 {
		return "ed25519"
	}
	return "rsa"
}

// keyType is the k= tag with its default (RFC 6376 §3.6.1: rsa).
func keyType(k string) string {
	k = strings.ToLower(strings.TrimSpace(k))
	if k == "" {
		return "rsa"
	}
	return k
}

// dmarc finds and evaluates the DMARC record of domain.
func (p *prober) dmarc(ctx context.Context, domain string, a *AuthReport) DMARCResult {
	r := DMARCResult{}
	for _, s := range a.SPF {
		r.SPFAligned = r.SPFAligned || s.Result == string(spf.Pass)
	}
	for _, d := range a.DKIM {
		r.DKIMAligned = r.DKIMAligned || d.Verdict == AuthPass || d.Verdict == AuthWarn
	}
	org, err := publicsuffix.EffectiveTLDPlusOne(domain)
	if err != nil {
		org = domain
	}
	names := []string{"_dmarc." + domain}
	if org != domain {
		names = append(names, "_dmarc."+org)
	}
	var rec string
	fromOrg := false
	for i, name := range names {
		recs, err := p.dmarcRecords(ctx, name)
		if err != nil {
			r.Name, r.Error, r.Verdict = name, dnsWhat(err), AuthFail
			r.Fix = "the DMARC lookup failed: check the domain's name servers"
			return r
		}
		if len(recs) > 1 {
			// RFC 7489 §6.6.3: several records mean no policy.
			r.Name, r.Error, r.Verdict = name, "several DMARC records", AuthFail
			r.Fix = "keep exactly one v=DMARC1 record at " + name
			return r
		}
		if len(recs) == 1 {
			r.Name, rec, fromOrg = name, recs[0], i > 0
			break
		}
	}
	if rec == "" {
		r.Verdict = AuthNone
		r.Fix = fmt.Sprintf("publish a DMARC record, e.g. _dmarc.%s TXT \"v=DMARC1; p=none; rua=mailto:dmarc@%s\", and tighten p= once reports show only your mail", org, org)
		return r
	}
	r.Record = rec
	parsed, err := dmarc.Parse(rec)
	if err != nil {
		r.Verdict = AuthFail
		r.Error = err.Error()
		r.Fix = "correct the record at " + r.Name + " (receivers ignore an invalid one)"
		return r
	}
	r.Policy = string(parsed.Policy)
	if parsed.SubdomainPolicy != "" && fromOrg {
		r.Policy = string(parsed.SubdomainPolicy) // RFC 7489 §6.3: sp= applies to subdomains of the organisational domain
	}
	if r.SPFAligned || r.DKIMAligned {
		r.Verdict = AuthPass
		if !r.DKIMAligned {
			r.Verdict = AuthWarn
			r.Fix = "only SPF passes, and SPF breaks when mail is forwarded: sign with DKIM too (dkim.domains)"
		}
		return r
	}
	r.Verdict = AuthFail
	r.Fix = fmt.Sprintf("neither SPF nor DKIM passes aligned with %s: receivers apply p=%s to mail from the relay; fix SPF or DKIM above", domain, r.Policy)
	return r
}

// dmarcRecords returns the TXT records at name that start with v=DMARC1
// (RFC 7489 §6.6.3 step 3: other records are discarded). NXDOMAIN is none.
func (p *prober) dmarcRecords(ctx context.Context, name string) ([]string, error) {
	txts, err := p.res.LookupTXT(ctx, name)
	if isNXDomain(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range txts {
		if v, _, _ := strings.Cut(t, ";"); strings.EqualFold(strings.ReplaceAll(v, " ", ""), "v=DMARC1") {
			out = append(out, t)
		}
	}
	return out, nil
}

// parseTags reads a tag=value list (RFC 6376 §3.2, RFC 7489 §6.4); tag
// names are lower-cased.
func parseTags(s string) map[string]string {
	m := map[string]string{}
	for _, part := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(part, "=")
		if ok {
			m[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
	}
	return m
}

// worst is the report's overall verdict.
func worst(a *AuthReport) string {
	rank := map[string]int{AuthPass: 0, AuthWarn: 1, AuthNone: 2, AuthFail: 3}
	v := AuthPass
	check := func(x string) {
		if rank[x] > rank[v] {
			v = x
		}
	}
	for _, s := range a.SPF {
		check(s.Verdict)
	}
	for _, d := range a.DKIM {
		check(d.Verdict)
	}
	check(a.DMARC.Verdict)
	return v
}

// spfResolver is the relay's resolver in the shape the SPF library takes,
// with its errors as net.DNSError: NXDOMAIN is "not found" (RFC 7208
// §4.3: result none; and a void lookup), a timeout or SERVFAIL is
// temporary (temperror).
type spfResolver struct{ r mx.Resolver }

func (s spfResolver) err(err error, name string) error {
	var de *classifier.DNSError
	if !errors.As(err, &de) {
		return &net.DNSError{Err: err.Error(), Name: name, IsTemporary: true}
	}
	if de.Kind == classifier.DNSNXDomain {
		return &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	// Anything else (a server failure, a timeout, a resolver that cannot be
	// reached) says nothing about the record: temporary, so SPF answers
	// temperror (RFC 7208 §2.6.6) rather than blaming the record.
	return &net.DNSError{Err: err.Error(), Name: name, IsTemporary: true, IsTimeout: de.Kind == classifier.DNSTimeout}
}

func (s spfResolver) LookupTXT(ctx context.Context, name string) ([]string, error) {
	txts, err := s.r.LookupTXT(ctx, name)
	if err != nil {
		return nil, s.err(err, name)
	}
	return txts, nil
}

func (s spfResolver) LookupMX(ctx context.Context, name string) ([]*net.MX, error) {
	mxs, err := s.r.LookupMX(ctx, name)
	var de *classifier.DNSError
	if errors.As(err, &de) && de.Kind == classifier.DNSNullMX {
		return nil, nil // RFC 7505 §4.2: a null MX gives no addresses
	}
	if err != nil {
		return nil, s.err(err, name)
	}
	out := make([]*net.MX, 0, len(mxs))
	for _, m := range mxs {
		out = append(out, &net.MX{Host: m.Host + ".", Pref: m.Pref})
	}
	return out, nil
}

func (s spfResolver) LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error) {
	addrs, err := s.r.LookupAddrs(ctx, host, true, true)
	if err != nil {
		return nil, s.err(err, host)
	}
	out := make([]net.IPAddr, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, net.IPAddr{IP: net.IP(a.AsSlice())})
	}
	return out, nil
}

func (s spfResolver) LookupAddr(ctx context.Context, addr string) ([]string, error) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return nil, &net.DNSError{Err: err.Error(), Name: addr}
	}
	names, err := s.r.LookupPTR(ctx, ip)
	if err != nil {
		return nil, s.err(err, addr)
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, n+".")
	}
	return out, nil
}

// write prints step 6: one line per check with its verdict, and what to
// fix under each one that is not a pass.
func (a *AuthReport) write(p *printer) {
	p.f("\n6. Sender authentication for %s (%s): %s", a.Domain, a.Elapsed, strings.ToUpper(a.Verdict))
	fix := func(s string) {
		if s != "" {
			p.f("        fix: %s", s)
		}
	}
	for _, s := range a.SPF {
		detail := ""
		if s.Record != "" {
			detail = ", record \"" + s.Record + "\""
		}
		if s.Error != "" {
			detail += " (" + s.Error + ")"
		}
		src := s.Address
		if src == "" {
			src = "an unknown source address"
		}
		p.f("   %-4s SPF of %s for %s: %s%s", mark(s.Verdict), a.Domain, src, s.Result, detail)
		fix(s.Fix)
	}
	for _, d := range a.DKIM {
		if d.Selector == "" {
			p.f("   %-4s DKIM: no signing key for %s", mark(d.Verdict), a.Domain)
		} else {
			what := "published key matches"
			if d.Error != "" {
				what = d.Error
			}
			p.f("   %-4s DKIM selector %s (%s, %s): %s", mark(d.Verdict), d.Selector, d.Name, d.Algorithm, what)
		}
		fix(d.Fix)
	}
	m := a.DMARC
	switch {
	case m.Record == "" && m.Error == "":
		p.f("   %-4s DMARC: no record", mark(m.Verdict))
	case m.Error != "":
		p.f("   %-4s DMARC at %s: %s", mark(m.Verdict), m.Name, m.Error)
	default:
		p.f("   %-4s DMARC at %s: p=%s, SPF aligned %s, DKIM aligned %s (\"%s\")", mark(m.Verdict), m.Name, m.Policy,
			yesNo(m.SPFAligned), yesNo(m.DKIMAligned), m.Record)
	}
	fix(m.Fix)
}

func mark(verdict string) string {
	return map[string]string{AuthPass: "ok", AuthWarn: "warn", AuthNone: "!", AuthFail: "FAIL"}[verdict]
}

func yesNo(b bool) string { return map[bool]string{true: "yes", false: "no"}[b] }
