package tlspolicy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
)

// Policy labels, as recorded in the queue history and counted in metrics.
const (
	LabelNone       = "none"            // no policy: delivery.tls applies
	LabelDANE       = "dane"            // DANE-authenticated TLS
	LabelDANEOnly   = "dane-unusable"   // TLSA present but none usable: TLS required, not authenticated
	LabelSTS        = "mta-sts"         // MTA-STS enforce: verified TLS to a listed MX
	LabelSTSTesting = "mta-sts-testing" // MTA-STS testing: delivery.tls applies, failures reported
)

// TXTResolver finds TXT records (mx.Resolver fits).
type TXTResolver interface {
	LookupTXT(ctx context.Context, name string) ([]string, error)
}

// Cache stores MTA-STS policies per domain, as values this package alone
// reads. The queue's store of StoreName fits (*queue.Store), so policies
// survive a restart with the mail they protect.
type Cache interface {
	Get(domain string) ([]byte, error)
	Put(domain string, v []byte) error // a nil v deletes
	Keys() ([]string, error)
}

// StoreName is the name of the queue store that keeps the Cache: the
// bucket the queue kept policies in before it had stores, so that a
// relay's cache outlives an upgrade.
const StoreName = "tlspolicy"

// Options configure a Checker.
type Options struct {
	DNSSEC  *DNSSEC     // nil: DANE is off
	STS     bool        // look up MTA-STS policies
	TXT     TXTResolver // for "_mta-sts" records; required with STS
	Fetcher *Fetcher    // required with STS
	Cache   Cache       // required with STS
	Roots   *x509.CertPool
	Port    int // SMTP port whose TLSA records apply (25)
	Now     func() time.Time
}

// Checker decides the TLS policy of destinations.
type Checker struct{ opt Options }

// New returns a Checker.
func New(opt Options) (*Checker, error) {
	if opt.Now == nil || (opt.STS && (opt.TXT == nil || opt.Fetcher == nil || opt.Cache == nil)) {
		return nil, errors.New("tlspolicy: Now, and with STS TXT, Fetcher and Cache, are required")
	}
	if opt.Port == 0 {
		opt.Port = 25
	}
	return &Checker{opt: opt}, nil
}

// Rule is how one MX host must be reached.
type Rule struct {
	Label string
	// Mode overrides delivery.tls when not empty.
	Mode smtpclient.TLSPolicy
	// Config replaces the base TLS configuration when not nil.
	Config *tls.Config
	// Refuse, when set, forbids connecting to the host in this attempt; it
	// is a *smtpvocab.TLSError.
	Refuse error
	// Authenticated: the server will be authenticated by DANE or MTA-STS
	// (what REQUIRETLS needs, RFC 8689 §4.2.1).
	Authenticated bool
	// Check, set for a host under an MTA-STS policy in testing mode, tells
	// whether a session that was set up would have satisfied the policy
	// had it been enforced: cs is the session's TLS state, nil for a
	// session in plaintext. Its error is for the TLS report only (RFC 8461
	// §5: a testing policy reports failures and delivers anyway).
	Check func(cs *tls.ConnectionState) error
}

// Decision is the policy of one destination for one attempt.
type Decision struct {
	Domain string
	DANE   []HostDANE // per MX host, when DNSSEC is on and the MX RRset is secure
	MXSec  Security   // of the MX RRset (DNSSEC on only)
	STS    *STSPolicy // the MTA-STS policy in force, if any
	STSErr error      // why no MTA-STS policy could be had, if one was announced
	Hosts  map[string]Rule
}

// Rule returns the rule for host (LabelNone when the decision says nothing).
func (d Decision) Rule(host string) Rule {
	if r, ok := d.Hosts[strings.ToLower(host)]; ok {
		return r
	}
	return Rule{Label: LabelNone}
}

// refuse builds a Rule that forbids a host.
func refuse(label string, err error) Rule {
	return Rule{Label: label, Refuse: &smtpvocab.TLSError{Err: err}}
}

// Decide finds the policy of domain, whose MX hosts are hosts, before any of
// them is contacted.
func (c *Checker) Decide(ctx context.Context, domain string, hosts []string) Decision {
	domain = address.DomainKey(domain) // one policy for every spelling
	d := Decision{Domain: domain, Hosts: map[string]Rule{}}
	pending := c.dane(ctx, &d, hosts)
	if len(pending) == 0 || !c.opt.STS {
		return d
	}
	p, err := c.STSPolicy(ctx, domain)
	d.STSErr = err
	if p == nil || p.Mode == ModeNone {
		return d
	}
	d.STS = p
	for _, h := range pending {
		switch {
		case p.Mode == ModeTesting:
			d.Hosts[h] = Rule{Label: LabelSTSTesting, Check: c.stsCheck(p, h, domain)}
		case !p.Allows(h):
			// RFC 8461 §4.1: an MX not in an enforced policy is not used.
			d.Hosts[h] = refuse(LabelSTS, fmt.Errorf("MX %s is not listed in the MTA-STS policy of %s", h, domain))
		default:
			cfg := &tls.Config{RootCAs: c.opt.Roots}
			d.Hosts[h] = Rule{Label: LabelSTS, Mode: smtpclient.TLSVerify, Config: cfg, Authenticated: true}
		}
	}
	return d
}

// stsCheck is the verification an enforced policy p would make of a
// session with MX host h (RFC 8461 §4.1, §4.2): h listed in p, STARTTLS,
// and a certificate valid for h that chains to a trusted root. A policy in
// testing mode runs it after the fact, so that its failures can be
// reported (RFC 8460 §4.3.1 names them) while delivery goes on as
// delivery.tls allows.
func (c *Checker) stsCheck(p *STSPolicy, h, domain string) func(*tls.ConnectionState) error {
	return func(cs *tls.ConnectionState) error {
		switch {
		case !p.Allows(h):
			return fmt.Errorf("MX %s is not listed in the MTA-STS policy of %s", h, domain)
		case cs == nil:
			return fmt.Errorf("MX %s: %w", h, smtpclient.ErrNoSTARTTLS)
		}
		return VerifyWebPKI(c.opt.Roots, h, cs.PeerCertificates, c.opt.Now())
	}
}

// dane fills d's rules for hosts under DANE and returns the hosts DANE does
// not apply to.
func (c *Checker) dane(ctx context.Context, d *Decision, hosts []string) []string {
	var pending []string
	for _, h := range hosts {
		pending = append(pending, strings.TrimSuffix(strings.ToLower(h), "."))
	}
	if c.opt.DNSSEC == nil {
		return pending
	}
	sec, err := c.opt.DNSSEC.MXSecure(ctx, d.Domain)
	d.MXSec = sec
	if sec == Bogus {
		// RFC 7672 §2.2.1: a failed MX lookup defers; it never downgrades.
		for _, h := range pending {
			d.Hosts[h] = refuse(LabelDANE, fmt.Errorf("DNSSEC lookup of the MX records of %s failed: %w", d.Domain, err))
		}
		return nil
	}
	if sec != Secure {
		return pending
	}
	var rest []string
	for _, h := range pending {
		hd := c.opt.DNSSEC.Host(ctx, h, c.opt.Port)
		d.DANE = append(d.DANE, hd)
		switch {
		case hd.State == Bogus:
			d.Hosts[h] = refuse(LabelDANE, fmt.Errorf("DNSSEC lookup of the TLSA records of %s failed: %w", h, hd.Err))
		case hd.Applies():
			d.Hosts[h] = c.daneRule(hd)
		default:
			rest = append(rest, h)
		}
	}
	return rest
}

// daneRule is the rule for a host with secure TLSA records.
func (c *Checker) daneRule(hd HostDANE) Rule {
	for _, t := range hd.Records {
		if t.Usable() {
			return Rule{Label: LabelDANE, Mode: smtpclient.TLSEncrypt, Config: DANEConfig(nil, hd, c.opt.Now), Authenticated: true}
		}
	}
	// RFC 7672 §2.2: TLSA records, none usable: TLS is mandatory, unauthenticated.
	return Rule{Label: LabelDANEOnly, Mode: smtpclient.TLSEncrypt}
}

// cached is the stored form of a policy.
type cached struct {
	ID      string    `json:"id"`
	Fetched time.Time `json:"fetched"`
	Policy  STSPolicy `json:"policy"`
}

func (c cached) valid(now time.Time) bool {
	return now.Before(c.Fetched.Add(time.Duration(c.Policy.MaxAge) * time.Second))
}

// STSPolicy returns the MTA-STS policy of domain (RFC 8461 §5.1): the
// cached one while the TXT id is unchanged and max_age has not passed, a
// fresh fetch otherwise, and the cached one again when the fetch fails. It
// returns nil without a policy; err tells why a policy announced by a TXT
// record could not be had.
func (c *Checker) STSPolicy(ctx context.Context, domain string) (*STSPolicy, error) {
	id, txtErr := c.stsID(ctx, domain)
	old, ok := c.load(domain)
	now := c.opt.Now()
	valid := ok && old.valid(now)
	switch {
	case id == "" && valid:
		return &old.Policy, nil // §5.1: no record (or DNS trouble): the cached policy holds
	case id == "":
		return nil, txtErr
	case valid && old.ID == id && now.Sub(old.Fetched) < refreshAge:
		return &old.Policy, nil
	}
	p, err := c.opt.Fetcher.Fetch(ctx, domain)
	if err != nil {
		if valid {
			return &old.Policy, nil
		}
		return nil, err
	}
	if b, jerr := json.Marshal(cached{ID: id, Fetched: now, Policy: p}); jerr == nil {
		_ = c.opt.Cache.Put(domain, b) // a policy we cannot store is used anyway
	}
	return &p, nil
}

// refreshAge is how old a cached policy may get before it is fetched again
// even with an unchanged id, so that its max_age keeps being extended
// (RFC 8461 §5.1 suggests refreshing daily).
const refreshAge = 24 * time.Hour

// stsID returns the id of domain's single "v=STSv1" TXT record, or "".
func (c *Checker) stsID(ctx context.Context, domain string) (string, error) {
	txts, err := c.opt.TXT.LookupTXT(ctx, "_mta-sts."+domain)
	if err != nil {
		return "", err
	}
	var recs []string
	for _, t := range txts {
		if strings.HasPrefix(t, "v=STSv1") {
			recs = append(recs, t)
		}
	}
	if len(recs) != 1 {
		return "", nil // §3.1: none, or several, means no policy
	}
	return ParseSTSRecord(recs[0])
}

// load reads the cached policy of domain.
func (c *Checker) load(domain string) (cached, bool) {
	b, err := c.opt.Cache.Get(domain)
	if err != nil || b == nil {
		return cached{}, false
	}
	var p cached
	if json.Unmarshal(b, &p) != nil {
		return cached{}, false
	}
	return p, true
}

// Refresh fetches again, in the background, the cached policies older than
// a day, and drops the expired ones (RFC 8461 §5.1: refresh periodically,
// so a policy does not lapse between deliveries).
func (c *Checker) Refresh(ctx context.Context) error {
	if !c.opt.STS {
		return nil
	}
	domains, err := c.opt.Cache.Keys()
	if err != nil {
		return err
	}
	now := c.opt.Now()
	for _, dom := range domains {
		p, ok := c.load(dom)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case !ok || !p.valid(now):
			_ = c.opt.Cache.Put(dom, nil)
		case now.Sub(p.Fetched) >= refreshAge/2:
			_, _ = c.STSPolicy(ctx, dom)
		}
	}
	return nil
}
