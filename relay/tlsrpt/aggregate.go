// Package tlsrpt counts the outcome of outbound TLS sessions per policy
// domain and sends the daily aggregate reports of SMTP TLS Reporting
// (RFC 8460) to the addresses a domain publishes in its "_smtp._tls" TXT
// record.
//
// Design notes:
//
//   - The Aggregator is pure bookkeeping: the delivery engine hands it each
//     session's policy and outcome together with the time, so tests need no
//     clock. Counts are kept per UTC day (RFC 8460 §4.1: a report covers a
//     24-hour UTC period by default), per policy domain (the recipient
//     domain, §4.4 "policy-domain") and per policy (§4.4 "policy-type":
//     sts, tlsa or no-policy-found).
//   - Counts are kept in memory and saved to a Store (the queue database)
//     periodically and at shutdown, not at each session, so the hot
//     delivery path has no extra writes; a restart keeps the day so far,
//     a crash loses at most the counts since the last save. The number of
//     distinct policies counted per day is bounded (maxKeys) so a flood of
//     destinations cannot grow it without end.
//   - A report whose sending fails (an https: POST refused or timed out, a
//     report the queue could not take, a DNS failure looking up the rua)
//     is kept, in the Store too, and tried again with growing waits until
//     a day after its period ended (Owed, Sender.Deliver).
//   - The Sender looks the rua up only when a report is due, so no DNS
//     query is made per delivery; a domain without a valid record gets no
//     report (§3). mailto: reports go through the relay's own queue as a
//     multipart/report message (§5.3); https: reports are POSTed (§5.2)
//     with the relay's CA settings and a time bound.
//   - The Reporter runs all of this: one loop that sends what is due and
//     saves the counts every minute, and the operator's "send now"; the
//     command only builds it from the configuration and starts it.
package tlsrpt

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// Policy types of RFC 8460 §4.4 ("policy-type").
const (
	TypeSTS      = "sts"
	TypeTLSA     = "tlsa"
	TypeNoPolicy = "no-policy-found"
)

// Result types of RFC 8460 §4.3 ("result-type").
const (
	ResultSTARTTLSNotSupported = "starttls-not-supported"
	ResultHostMismatch         = "certificate-host-mismatch"
	ResultExpired              = "certificate-expired"
	ResultNotTrusted           = "certificate-not-trusted"
	ResultValidationFailure    = "validation-failure"
	ResultTLSAInvalid          = "tlsa-invalid"
	ResultDNSSECInvalid        = "dnssec-invalid"
	ResultDANERequired         = "dane-required"
	ResultSTSPolicyFetch       = "sts-policy-fetch-error"
	ResultSTSPolicyInvalid     = "sts-policy-invalid"
	ResultSTSWebPKIInvalid     = "sts-webpki-invalid"
)

// maxKeys bounds the policies counted per day.
const maxKeys = 10000

// Policy is the policy one session was held to (RFC 8460 §4.4 "policy").
type Policy struct {
	Type    string   // TypeSTS, TypeTLSA or TypeNoPolicy
	Domain  string   // the policy domain: the recipient domain, lower case
	Strings []string // the policy text: MTA-STS policy lines, or TLSA records
	MXHosts []string // MTA-STS mx patterns, or the MX host of the TLSA records
}

// key identifies a Policy in a map.
func (p Policy) key() string {
	return p.Domain + "\x00" + p.Type + "\x00" + strings.Join(p.Strings, "\x01") + "\x00" + strings.Join(p.MXHosts, "\x01")
}

// Failure describes one failed session (RFC 8460 §4.4 "failure-details").
type Failure struct {
	ResultType     string
	SendingIP      string // our source address, if known
	MXHost         string // receiving-mx-hostname
	ReceivingIP    string
	AdditionalInfo string // a short diagnostic, as failure-reason-code
}

// Counts are the sessions of one policy on one day.
type Counts struct {
	Policy   Policy
	Success  int64
	Failures map[Failure]int64
}

// Failed is the number of failed sessions.
func (c Counts) Failed() int64 {
	var n int64
	for _, v := range c.Failures {
		n += v
	}
	return n
}

// Day is what was counted for one policy domain on one UTC day.
type Day struct {
	Domain string
	Start  time.Time // 00:00 UTC
	End    time.Time // the next 00:00 UTC, or the time of a report sent early
	Counts []Counts  // sorted by policy type
}

// Aggregator counts sessions; it is safe for concurrent use.
type Aggregator struct {
	mu      sync.Mutex
	days    map[time.Time]map[string]*Counts // UTC day -> policy key -> counts
	changed bool                             // since the last Save
}

// NewAggregator returns an empty Aggregator.
func NewAggregator() *Aggregator {
	return &Aggregator{days: map[time.Time]map[string]*Counts{}}
}

// dayOf returns the start of the UTC day of t.
func dayOf(t time.Time) time.Time {
	return t.UTC().Truncate(24 * time.Hour)
}

// Success counts a session that met policy p at time now.
func (a *Aggregator) Success(p Policy, now time.Time) {
	a.add(p, nil, now)
}

// Failure counts a session that failed policy p at time now.
func (a *Aggregator) Failure(p Policy, f Failure, now time.Time) {
	a.add(p, &f, now)
}

func (a *Aggregator) add(p Policy, f *Failure, now time.Time) {
	if p.Domain == "" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.counts(dayOf(now), p)
	switch {
	case c == nil:
	case f == nil:
		c.Success++
	default:
		c.Failures[*f]++
	}
}

// counts returns the counts of p on day, created if need be; nil when the
// day holds maxKeys policies already. a.mu is held.
func (a *Aggregator) counts(day time.Time, p Policy) *Counts {
	m := a.days[day]
	if m == nil {
		m = map[string]*Counts{}
		a.days[day] = m
	}
	k := p.key()
	c := m[k]
	if c == nil {
		if len(m) >= maxKeys {
			return nil
		}
		c = &Counts{Policy: p, Failures: map[Failure]int64{}}
		m[k] = c
	}
	a.changed = true
	return c
}

// list returns copies of every day's counts, one Day per day and policy
// domain. a.mu is held.
func (a *Aggregator) list() []Day {
	var out []Day
	for day, m := range a.days {
		for _, c := range m {
			cc := *c
			cc.Failures = maps.Clone(c.Failures)
			out = append(out, Day{Domain: c.Policy.Domain, Start: day, End: day.Add(24 * time.Hour), Counts: []Counts{cc}})
		}
	}
	return out
}

// Take removes and returns the counts of the days before now's UTC day,
// and of now's day too when all is set (a report asked for by the
// operator: its date range ends at now). Days are grouped per domain.
func (a *Aggregator) Take(now time.Time, all bool) []Day {
	a.mu.Lock()
	defer a.mu.Unlock()
	today := dayOf(now)
	var out []Day
	for day, m := range a.days {
		if day.Equal(today) && !all || day.After(today) {
			continue
		}
		end := day.Add(24 * time.Hour)
		if day.Equal(today) {
			end = now.UTC()
		}
		per := map[string]*Day{}
		for _, c := range m {
			d := per[c.Policy.Domain]
			if d == nil {
				d = &Day{Domain: c.Policy.Domain, Start: day, End: end}
				per[c.Policy.Domain] = d
			}
			d.Counts = append(d.Counts, *c)
		}
		for _, d := range per {
			slices.SortFunc(d.Counts, func(x, y Counts) int { return strings.Compare(x.Policy.key(), y.Policy.key()) })
			out = append(out, *d)
		}
		delete(a.days, day)
		a.changed = true
	}
	slices.SortFunc(out, func(x, y Day) int {
		if c := x.Start.Compare(y.Start); c != 0 {
			return c
		}
		return strings.Compare(x.Domain, y.Domain)
	})
	return out
}
