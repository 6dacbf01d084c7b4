package tlspolicy

import (
	"context"
	"errors"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// adServer is a loopback DNS server that answers from zone files and sets
// the AD bit on an answer when every owner name in it is under a "secure"
// zone, as a validating resolver does; names under "bogus" get SERVFAIL.
type adServer struct {
	rrs    []dns.RR
	secure []string // zone suffixes that are signed
	bogus  []string // owner names whose lookup fails validation
	// insecure lists "owner TYPE" RRsets left unsigned in a signed zone
	// (as under an opt-out delegation).
	insecure []string
}

func (s *adServer) under(name string, zones []string) bool {
	for _, z := range zones {
		if dns.IsSubDomain(dns.Fqdn(z), name) {
			return true
		}
	}
	return false
}

func (s *adServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	m.AuthenticatedData = true
	for range 8 { // follow CNAMEs, as a recursive resolver does
		if s.under(name, s.bogus) {
			m.Rcode, m.Answer = dns.RcodeServerFailure, nil
			_ = w.WriteMsg(m)
			return
		}
		m.AuthenticatedData = m.AuthenticatedData && s.under(name, s.secure)
		next := ""
		for _, rr := range s.rrs {
			h := rr.Header()
			if !strings.EqualFold(h.Name, name) {
				continue
			}
			if h.Rrtype == q.Qtype {
				m.Answer = append(m.Answer, rr)
				if slices.Contains(s.insecure, name+" "+dns.TypeToString[h.Rrtype]) {
					m.AuthenticatedData = false
				}
			} else if c, ok := rr.(*dns.CNAME); ok {
				m.Answer = append(m.Answer, rr)
				next = strings.ToLower(c.Target)
			}
		}
		if next == "" {
			break
		}
		name = next
	}
	_ = w.WriteMsg(m)
}

func startAD(t *testing.T, s *adServer, zone string) string {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(zone), "\n") {
		rr, err := dns.NewRR(strings.TrimSpace(line))
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		s.rrs = append(s.rrs, rr)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: s}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}

// Host follows RFC 7672 §2.2.2 and §2.2.3: the TLSA base domain of a
// secure CNAME chain is its target when TLSA records are there, else the
// original name; DANE-TA then matches both names, the base first. An
// insecure step anywhere (the chain or the AAAA records delivery uses)
// makes DANE not apply.
func TestHostCNAME(t *testing.T) {
	t.Parallel()
	const zone = `
alias.s.test. 300 IN CNAME target.s.test.
target.s.test. 300 IN A 127.0.0.1
_25._tcp.target.s.test. 300 IN TLSA 3 1 1 aabb
alias2.s.test. 300 IN CNAME target2.s.test.
target2.s.test. 300 IN A 127.0.0.1
_25._tcp.alias2.s.test. 300 IN TLSA 2 0 1 ccdd
plain.s.test. 300 IN A 127.0.0.1
_25._tcp.plain.s.test. 300 IN TLSA 3 1 1 eeff
out.s.test. 300 IN CNAME mx.u.test.
mx.u.test. 300 IN A 127.0.0.1
_25._tcp.out.s.test. 300 IN TLSA 3 1 1 eeff
in.u.test. 300 IN CNAME mx.s.test.
mx.s.test. 300 IN A 127.0.0.1
_25._tcp.mx.s.test. 300 IN TLSA 3 1 1 eeff
six.s.test. 300 IN A 127.0.0.1
six.s.test. 300 IN AAAA ::1
_25._tcp.six.s.test. 300 IN TLSA 3 1 1 eeff
bad.s.test. 300 IN CNAME gone.b.test.
`
	addr := startAD(t, &adServer{secure: []string{"s.test"}, bogus: []string{"b.test"},
		insecure: []string{"six.s.test. AAAA"}}, zone)
	d := &DNSSEC{Server: addr, Timeout: 2 * time.Second}
	d6 := &DNSSEC{Server: addr, Timeout: 2 * time.Second, IPv6: true}
	tests := []struct {
		name  string
		d     *DNSSEC
		host  string
		state Security
		base  string
		names []string
		recs  int
	}{
		{"TLSA at the target", d, "alias.s.test", Secure, "target.s.test", []string{"target.s.test", "alias.s.test"}, 1},
		{"TLSA at the original name only", d, "alias2.s.test", Secure, "alias2.s.test", []string{"alias2.s.test"}, 1},
		{"no CNAME", d, "plain.s.test", Secure, "plain.s.test", []string{"plain.s.test"}, 1},
		{"CNAME into an insecure zone", d, "out.s.test", Insecure, "out.s.test", []string{"out.s.test"}, 0},
		{"CNAME from an insecure zone", d, "in.u.test", Insecure, "in.u.test", []string{"in.u.test"}, 0},
		{"insecure AAAA, IPv4 only", d, "six.s.test", Secure, "six.s.test", []string{"six.s.test"}, 1},
		{"insecure AAAA, IPv6 used", d6, "six.s.test", Insecure, "six.s.test", []string{"six.s.test"}, 0},
		{"bogus chain", d, "bad.s.test", Bogus, "bad.s.test", []string{"bad.s.test"}, 0},
	}
	for _, tc := range tests {
		h := tc.d.Host(context.Background(), tc.host, 25)
		if h.State != tc.state || h.Base != tc.base || !reflect.DeepEqual(h.Names, tc.names) || len(h.Records) != tc.recs {
			t.Errorf("%s: Host(%s) = state %s, base %s, names %v, %d records; want %s, %s, %v, %d",
				tc.name, tc.host, h.State, h.Base, h.Names, len(h.Records), tc.state, tc.base, tc.names, tc.recs)
		}
	}
}

// The DANE TLS configuration names the TLSA base domain in SNI (RFC 7672
// §3.2.2).
func TestDANEConfigServerName(t *testing.T) {
	t.Parallel()
	cfg := DANEConfig(nil, HostDANE{Host: "alias.s.test", Base: "target.s.test"}, time.Now)
	if cfg.ServerName != "target.s.test" || cfg.VerifyConnection == nil {
		t.Errorf("DANEConfig: ServerName %q (want target.s.test), VerifyConnection set %v", cfg.ServerName, cfg.VerifyConnection != nil)
	}
}

// TestDNSSECCancelEndsQuery: a cancelled context ends a DNSSEC query to a
// resolver that does not answer at once, not at the query's timeout.
func TestDNSSECCancelEndsQuery(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0") // a resolver that never answers
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	d := &DNSSEC{Server: pc.LocalAddr().String(), Timeout: 30 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	done := make(chan error, 1)
	go func() {
		_, err := d.lookup(ctx, "mx.example.test", dns.TypeTLSA)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want the cancellation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the query went on 10 s after its context was cancelled")
	}
}
