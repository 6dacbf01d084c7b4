package peers

import (
	"testing"

	"github.com/miekg/dns"

	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestDNSSEC: the validating Unbound sets AD on answers from the signed
// zone, not on those from the unsigned one, and answers SERVFAIL for a
// record forged after signing. A name outside the zones is refused by
// Unbound itself, never sent to the root servers (test traffic stays on
// loopback).
func TestDNSSEC(t *testing.T) {
	t.Parallel()
	d := StartDNSSEC(t, relaytest.Loopback(t), relaytest.Loopback(t),
		Zone{Name: "signed.test", Signed: true, Records: []string{"a A 127.0.0.5", "b TXT \"hello\""}, Forge: []string{"b"}},
		Zone{Name: "plain.test", Records: []string{"a A 127.0.0.6"}})
	for _, c := range []struct {
		name  string
		qtype uint16
		rcode int
		ad    bool
	}{
		{"a.signed.test", dns.TypeA, dns.RcodeSuccess, true},
		{"nx.signed.test", dns.TypeA, dns.RcodeNameError, true},
		{"b.signed.test", dns.TypeTXT, dns.RcodeServerFailure, false},
		{"a.plain.test", dns.TypeA, dns.RcodeSuccess, false},
		{"src.test", dns.TypeMX, dns.RcodeRefused, false},
		{"example.com", dns.TypeA, dns.RcodeRefused, false},
	} {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(c.name), c.qtype)
		m.SetEdns0(1232, true)
		r, err := dns.Exchange(m, d.Resolver)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r.Rcode != c.rcode || r.AuthenticatedData != c.ad {
			t.Errorf("%s %s: rcode %s AD %v, want %s AD %v", c.name, dns.TypeToString[c.qtype],
				dns.RcodeToString[r.Rcode], r.AuthenticatedData, dns.RcodeToString[c.rcode], c.ad)
		}
	}
}
