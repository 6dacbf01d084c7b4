// Package mxtest is a small authoritative-style DNS server for tests: it
// listens on 127.0.0.1 (the same random port for UDP and TCP) and answers
// from records the test adds. It lets any package's tests exercise real DNS
// traffic through mx.DNS without touching the network.
//
// Names without any record answer NXDOMAIN, names with records of other
// types answer NODATA, as a real zone would. Failure modes are opt-in per
// name: NXDomain, ServFail, Truncate (TC bit over UDP, full answer over TCP)
// and Drop (never answer, to provoke timeouts).
package mxtest

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// Server is a test DNS server. The zero value is ready: add records, then
// Start it. Records may be added before or after Start; it is safe for
// concurrent use.
type Server struct {
	mu       sync.Mutex
	rrs      map[string][]dns.RR // by lower-case FQDN
	nx       map[string]bool
	servfail map[string]bool
	trunc    map[string]bool
	drop     map[string]bool
	addr     string
}

// Start listens on 127.0.0.1 (UDP and TCP on one port) and stops the server
// when the test ends.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	pc, ln := listen(t)
	s.mu.Lock()
	s.addr = pc.LocalAddr().String()
	s.mu.Unlock()
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: s}, {Listener: ln, Handler: s}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
}

// listen binds UDP on a random port, then TCP on the same port, retrying
// when another process holds that TCP port.
func listen(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	var lastErr error
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("mxtest: %v", err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		lastErr = err
		pc.Close()
	}
	t.Fatalf("mxtest: no UDP+TCP port pair: %v", lastErr)
	return nil, nil
}

// Addr returns the server's host:port (valid after Start).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

func key(name string) string { return strings.ToLower(dns.Fqdn(name)) }

func hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: dns.Fqdn(name), Rrtype: t, Class: dns.ClassINET, Ttl: 300}
}

func (s *Server) add(rr dns.RR) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rrs == nil {
		s.rrs = map[string][]dns.RR{}
	}
	k := key(rr.Header().Name)
	s.rrs[k] = append(s.rrs[k], rr)
	return s
}

func (s *Server) flag(m *map[string]bool, name string) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *m == nil {
		*m = map[string]bool{}
	}
	(*m)[key(name)] = true
	return s
}

// MX adds an MX record for domain.
func (s *Server) MX(domain string, pref uint16, host string) *Server {
	return s.add(&dns.MX{Hdr: hdr(domain, dns.TypeMX), Preference: pref, Mx: dns.Fqdn(host)})
}

// NullMX adds a null MX for domain (RFC 7505: MX 0 ".").
func (s *Server) NullMX(domain string) *Server {
	return s.add(&dns.MX{Hdr: hdr(domain, dns.TypeMX), Preference: 0, Mx: "."})
}

// A adds an A record; ip must be an IPv4 literal.
func (s *Server) A(host, ip string) *Server {
	return s.add(&dns.A{Hdr: hdr(host, dns.TypeA), A: netip.MustParseAddr(ip).AsSlice()})
}

// AAAA adds an AAAA record; ip must be an IPv6 literal.
func (s *Server) AAAA(host, ip string) *Server {
	return s.add(&dns.AAAA{Hdr: hdr(host, dns.TypeAAAA), AAAA: netip.MustParseAddr(ip).AsSlice()})
}

// CNAME adds a CNAME from name to target; answers include the chain.
func (s *Server) CNAME(name, target string) *Server {
	return s.add(&dns.CNAME{Hdr: hdr(name, dns.TypeCNAME), Target: dns.Fqdn(target)})
}

// PTR adds a reverse record for ip (an IPv4 or IPv6 literal).
func (s *Server) PTR(ip, name string) *Server {
	arpa, err := dns.ReverseAddr(ip)
	if err != nil {
		panic(fmt.Sprintf("mxtest: PTR %q: %v", ip, err))
	}
	return s.add(&dns.PTR{Hdr: hdr(arpa, dns.TypePTR), Ptr: dns.Fqdn(name)})
}

// TXT adds a TXT record; text longer than 255 octets is split into several
// character-strings, as zone files do.
func (s *Server) TXT(name, text string) *Server {
	var parts []string
	for len(text) > 255 {
		parts, text = append(parts, text[:255]), text[255:]
	}
	return s.add(&dns.TXT{Hdr: hdr(name, dns.TypeTXT), Txt: append(parts, text)})
}

// NXDomain makes every query for name answer NXDOMAIN.
func (s *Server) NXDomain(name string) *Server { return s.flag(&s.nx, name) }

// ServFail makes every query for name answer SERVFAIL.
func (s *Server) ServFail(name string) *Server { return s.flag(&s.servfail, name) }

// Truncate makes UDP answers for name empty with the TC bit set; over TCP
// the full answer is served.
func (s *Server) Truncate(name string) *Server { return s.flag(&s.trunc, name) }

// Drop makes the server never answer queries for name.
func (s *Server) Drop(name string) *Server { return s.flag(&s.drop, name) }

// ServeDNS implements dns.Handler.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	if len(req.Question) != 1 {
		return
	}
	q := req.Question[0]
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative, m.RecursionAvailable = true, true
	_, udp := w.LocalAddr().(*net.UDPAddr)
	if s.answer(m, key(q.Name), q.Qtype, udp) {
		_ = w.WriteMsg(m)
	}
}

// answer fills m for (name, qtype); false means "do not reply".
func (s *Server) answer(m *dns.Msg, name string, qtype uint16, udp bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.drop[name]:
		return false
	case s.servfail[name]:
		m.Rcode = dns.RcodeServerFailure
		return true
	case s.nx[name]:
		m.Rcode = dns.RcodeNameError
		return true
	case s.trunc[name] && udp:
		m.Truncated = true
		return true
	}
	if len(s.rrs[name]) == 0 {
		m.Rcode = dns.RcodeNameError
		return true
	}
	for range 8 { // follow our own CNAME chain, as a recursive resolver would
		next := ""
		for _, rr := range s.rrs[name] {
			if rr.Header().Rrtype == qtype {
				m.Answer = append(m.Answer, dns.Copy(rr))
			} else if c, ok := rr.(*dns.CNAME); ok && qtype != dns.TypeCNAME {
				m.Answer = append(m.Answer, dns.Copy(rr))
				next = key(c.Target)
			}
		}
		if next == "" {
			break
		}
		name = next
	}
	return true
}
