package delivery

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

// rulePolicy holds every MX host of every destination to one rule, under
// the MTA-STS policy sts if set.
type rulePolicy struct {
	rule tlspolicy.Rule
	sts  *tlspolicy.STSPolicy
}

func (p rulePolicy) Decide(_ context.Context, domain string, hosts []string) tlspolicy.Decision {
	d := tlspolicy.Decision{Domain: domain, Hosts: map[string]tlspolicy.Rule{}, STS: p.sts}
	for _, h := range hosts {
		d.Hosts[strings.ToLower(h)] = p.rule
	}
	return d
}

// The rules of the seam tests, as tlspolicy.Checker makes them.
var (
	// MTA-STS enforce: verified TLS (against roots that trust nothing here).
	stsRule = tlspolicy.Rule{Label: tlspolicy.LabelSTS, Mode: smtpclient.TLSVerify,
		Config: &tls.Config{RootCAs: x509.NewCertPool()}, Authenticated: true}
	// DANE whose TLSA records the MX's certificate matches.
	daneRule = tlspolicy.Rule{Label: tlspolicy.LabelDANE, Mode: smtpclient.TLSEncrypt,
		Config: &tls.Config{InsecureSkipVerify: true}, Authenticated: true}
	// DANE whose TLSA records the MX's certificate does not match.
	daneMismatch = tlspolicy.Rule{Label: tlspolicy.LabelDANE, Mode: smtpclient.TLSEncrypt,
		Config: &tls.Config{InsecureSkipVerify: true, VerifyConnection: func(tls.ConnectionState) error {
			return tlspolicy.ErrDANEMismatch
		}}, Authenticated: true}
)

// TestSessionPolicy_NoDowngrade is the TLS downgrade through the
// connection cache: a "TLS-Required: No" message (RFC 8689 §5) opens a
// connection that its destination's policy would refuse (an MX without
// STARTTLS under MTA-STS enforce or DANE, or one whose certificate fails
// DANE), and messages held to that policy, queued with it and in flight
// together on one worker, must not ride that connection: each opens its
// own under its own policy, is deferred with reason tls and is recorded
// under the rule that applied to it. Only the TLS-Required: No message
// reaches the MX.
func TestSessionPolicy_NoDowngrade(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		rule       tlspolicy.Rule
		starttls   bool // the MX offers STARTTLS (and REQUIRETLS)
		requireTLS bool // the messages held to the policy are REQUIRETLS ones
	}{
		{"mta-sts enforce, no STARTTLS", stsRule, false, false},
		{"dane, no STARTTLS", daneRule, false, false},
		{"dane mismatch, REQUIRETLS", daneMismatch, true, true},
		{"dane mismatch", daneMismatch, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// One connection at a time, so every job goes to the worker
			// that holds the TLS-Required: No message's connection.
			h := newHarness(t, func(c *config.Config) { c.Delivery.MaxPerDestination = 1 })
			ip := relaytest.Loopback(t)
			h.dns.MX("pol.test", 10, "mx.pol.test").A("mx.pol.test", ip)
			o := relaytest.MXOptions{}
			if tc.starttls {
				o = relaytest.MXOptions{TLS: &tls.Config{Certificates: []tls.Certificate{testCert(t, "mx.pol.test")}}, RequireTLS: true}
			}
			mx := startMX(t, ip, h.port, o)
			optional := h.enqueueMsg(queue.NewMessage{From: "s@sender.test", TLSOptional: true,
				Body: []byte("TLS-Required: No\r\nSubject: optional\r\n\r\nbody\r\n")}, "opt@pol.test")
			held := []string{"a@pol.test", "b@pol.test", "c@pol.test"}
			for _, rc := range held {
				h.enqueueMsg(queue.NewMessage{From: "s@sender.test", RequireTLS: tc.requireTLS,
					Body: []byte("Subject: held\r\n\r\nbody\r\n")}, rc)
			}
			h.start(func(o *Options) { o.TLSPolicy = rulePolicy{rule: tc.rule} })
			eventually(t, wait, "the TLS-Required: No message delivered", func() bool { return h.gone(optional) })
			if outs := h.outcomes("opt@pol.test"); len(outs) != 1 || outs[0]["tls_policy"] != "tls-required-no" {
				t.Errorf("TLS-Required: No message: %v, want delivered under tls-required-no", outs)
			}
			eventually(t, wait, "an attempt for every held message", func() bool {
				for _, rc := range held {
					if len(h.outcomes(rc)) == 0 {
						return false
					}
				}
				return true
			})
			for _, rc := range held {
				o := h.outcomes(rc)[0]
				if o["outcome"] != "deferred" || o["reason"] != "tls" || o["tls_policy"] != tc.rule.Label {
					t.Errorf("%s: first attempt %v, want deferred with reason tls under %s", rc, o, tc.rule.Label)
				}
			}
			for _, tx := range mx.Transactions() {
				if len(tx.Tried) != 1 || tx.Tried[0] != "opt@pol.test" {
					t.Errorf("the MX saw a transaction for %v (TLS %v) against the destination's policy", tx.Tried, tx.TLS)
				}
			}
		})
	}
}

// TestSessionPolicy_Reuse: a connection goes on carrying every message its
// TLS satisfies. Under DANE, ordinary, TLS-Required: No and REQUIRETLS
// messages all ride the one authenticated connection, and each attempt
// names the rule that applied to that message.
func TestSessionPolicy_Reuse(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) { c.Delivery.MaxPerDestination = 1 })
	ip := relaytest.Loopback(t)
	h.dns.MX("ok.test", 10, "mx.ok.test").A("mx.ok.test", ip)
	mx := startMX(t, ip, h.port, relaytest.MXOptions{
		TLS: &tls.Config{Certificates: []tls.Certificate{testCert(t, "mx.ok.test")}}, RequireTLS: true})
	msgs := []struct {
		rcpt           string
		optional, rtls bool
		want           string
	}{
		{"a@ok.test", false, false, "dane"},
		{"b@ok.test", true, false, "tls-required-no"},
		{"c@ok.test", false, true, "dane"},
		{"d@ok.test", false, false, "dane"},
	}
	var ids []queue.ID
	for _, m := range msgs {
		ids = append(ids, h.enqueueMsg(queue.NewMessage{From: "s@sender.test", TLSOptional: m.optional, RequireTLS: m.rtls,
			Body: []byte("Subject: m\r\n\r\nbody\r\n")}, m.rcpt))
	}
	h.start(func(o *Options) { o.TLSPolicy = rulePolicy{rule: daneRule} })
	eventually(t, wait, "all delivered", func() bool {
		for _, id := range ids {
			if !h.gone(id) {
				return false
			}
		}
		return true
	})
	for _, m := range msgs {
		if outs := h.outcomes(m.rcpt); len(outs) != 1 || outs[0]["tls_policy"] != m.want {
			t.Errorf("%s: %v, want one attempt under %s", m.rcpt, outs, m.want)
		}
	}
	if n := len(mx.Connections()); n != 1 {
		t.Errorf("%d connections, want 1 for all four messages", n)
	}
	for _, tx := range mx.Delivered() {
		if !tx.TLS {
			t.Errorf("%v delivered without TLS", tx.Tried)
		}
	}
}

// TestSessionRides is the rule a message's policy holds an open connection
// to, case by case.
func TestSessionRides(t *testing.T) {
	t.Parallel()
	verify := smtpclient.TLSVerify
	sts, dane := stsRule, daneRule
	unusable := tlspolicy.Rule{Label: tlspolicy.LabelDANEOnly, Mode: smtpclient.TLSEncrypt}
	stsTesting := tlspolicy.Rule{Label: tlspolicy.LabelSTSTesting, Check: func(*tls.ConnectionState) error { return errors.New("x") }}
	plain, optional, rtls := queue.Message{}, queue.Message{TLSOptional: true}, queue.Message{RequireTLS: true}
	tests := []struct {
		name string
		open queue.Message   // the message that opened the connection
		rule *tlspolicy.Rule // the destination's policy; nil: none asked
		cfg  bool            // a configured route (smarthost, route)
		base smtpclient.TLSPolicy
		tls  bool // the connection runs TLS
		msg  queue.Message
		want bool
		pol  string // the rule recorded for msg
	}{
		{"sts: ordinary after optional plaintext", optional, &sts, false, "may", false, plain, false, ""},
		{"sts: ordinary after optional over TLS", optional, &sts, false, "may", true, plain, false, ""},
		{"sts: ordinary after ordinary", plain, &sts, false, "may", true, plain, true, "mta-sts"},
		{"sts: optional after ordinary", plain, &sts, false, "may", true, optional, true, "tls-required-no"},
		{"sts: requiretls after ordinary", plain, &sts, false, "may", true, rtls, true, "mta-sts"},
		{"dane: ordinary after optional", optional, &dane, false, "may", true, plain, false, ""},
		{"dane: requiretls after optional", optional, &dane, false, "may", true, rtls, false, ""},
		{"dane-unusable: ordinary after optional plaintext", optional, &unusable, false, "may", false, plain, false, ""},
		{"dane-unusable: ordinary after optional over TLS", optional, &unusable, false, "may", true, plain, true, "dane-unusable"},
		{"testing: ordinary after optional plaintext", optional, &stsTesting, false, "may", false, plain, true, "mta-sts-testing"},
		{"no policy: requiretls", plain, nil, false, "may", true, rtls, false, ""},
		{"delivery.tls encrypt: plaintext", plain, nil, false, "encrypt", false, plain, false, ""},
		{"route verify: requiretls", plain, nil, true, verify, true, rtls, true, ""},
		{"route encrypt: requiretls", plain, nil, true, "encrypt", true, rtls, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := target{host: "mx.test", base: tc.base, tls: tc.base, configured: tc.cfg}
			opened, ok := shape(raw, tc.rule, tc.open)
			if !ok {
				t.Fatalf("the opening message may not go to the host")
			}
			mx := startMX(t, relaytest.Loopback(t), freePort(t), relaytest.MXOptions{RequireTLS: true,
				TLS: &tls.Config{Certificates: []tls.Certificate{testCert(t, "mx.test")}}})
			c, err := smtpclient.Dial(context.Background(), nil, mx.Addr(), "mx.test",
				smtpclient.Options{Hostname: "relay.test", TLS: map[bool]smtpclient.TLSPolicy{true: "encrypt", false: "none"}[tc.tls]})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s := &session{c: c, t: opened, tls: tc.tls}
			m, got := s.rides(tc.msg)
			if got != tc.want || (got && m.policy != tc.pol) {
				t.Errorf("rides = %v under %q, want %v under %q", got, m.policy, tc.want, tc.pol)
			}
		})
	}
}

// TestTLSReport_Testing: under an MTA-STS policy in testing mode the
// message is delivered whatever the session was like, and the TLS report
// counts what the enforced policy would have found (RFC 8461 §5, RFC 8460
// §4.3.1): a self-signed certificate is certificate-not-trusted, an MX
// without STARTTLS starttls-not-supported, an unlisted MX
// validation-failure, a valid session a success.
func TestTLSReport_Testing(t *testing.T) {
	t.Parallel()
	sts := &tlspolicy.STSPolicy{Mode: tlspolicy.ModeTesting, MX: []string{"mx.t.test"}, MaxAge: 600}
	webPKI := func(cs *tls.ConnectionState) error {
		if cs == nil {
			return smtpclient.ErrNoSTARTTLS
		}
		return tlspolicy.VerifyWebPKI(x509.NewCertPool(), "mx.t.test", cs.PeerCertificates, time.Now())
	}
	for _, tc := range []struct {
		name     string
		starttls bool
		check    func(*tls.ConnectionState) error
		want     string // the failure reported; "" for a success
	}{
		{"self-signed", true, webPKI, "certificate-not-trusted"},
		{"no STARTTLS", false, webPKI, "starttls-not-supported"},
		{"unlisted", true, func(*tls.ConnectionState) error { return errors.New("MX not listed") }, "validation-failure"},
		{"valid", true, func(*tls.ConnectionState) error { return nil }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ip := relaytest.Loopback(t)
			h.dns.MX("t.test", 10, "mx.t.test").A("mx.t.test", ip)
			o := relaytest.MXOptions{}
			if tc.starttls {
				o.TLS = &tls.Config{Certificates: []tls.Certificate{testCert(t, "mx.t.test")}}
			}
			mx := startMX(t, ip, h.port, o)
			agg := tlsrpt.NewAggregator()
			id := h.enqueue("s@sender.test", "u@t.test")
			rule := tlspolicy.Rule{Label: tlspolicy.LabelSTSTesting, Check: tc.check}
			h.start(func(o *Options) { o.TLSPolicy, o.TLSReport = rulePolicy{rule: rule, sts: sts}, agg })
			eventually(t, wait, "delivered", func() bool { return h.gone(id) })
			if got := mx.Delivered(); len(got) != 1 || got[0].TLS != tc.starttls {
				t.Errorf("delivered %+v, want one transaction, TLS %v", got, tc.starttls)
			}
			days := agg.Take(time.Now(), true)
			if len(days) != 1 || len(days[0].Counts) != 1 {
				t.Fatalf("report: %+v, want one policy", days)
			}
			c := days[0].Counts[0]
			var failures []string
			for f, n := range c.Failures {
				failures = append(failures, fmt.Sprintf("%s@%s x%d", f.ResultType, f.MXHost, n))
			}
			want := "1/0 []"
			if tc.want != "" {
				want = "0/1 [" + tc.want + "@mx.t.test x1]"
			}
			if got := fmt.Sprintf("%d/%d %v", c.Success, c.Failed(), failures); c.Policy.Type != "sts" || got != want {
				t.Errorf("report of %s policy: %s, want sts %s", c.Policy.Type, got, want)
			}
		})
	}
}
