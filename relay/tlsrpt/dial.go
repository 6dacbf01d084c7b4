package tlsrpt

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/greyrelay/greyrelay/relay/mx"
)

// Where https: reports may go.
//
// An https: rua comes from the DNS of a domain we delivered to, not from
// the operator: whoever runs that domain chooses the URL the relay POSTs
// to. A record naming https://10.0.0.7/, or a name that resolves to
// 127.0.0.1, would otherwise make the relay send requests to services
// inside its own network that nobody outside can reach (server-side
// request forgery; certificate verification narrows it to services with a
// trusted certificate, it does not close it). So Dialer does not connect
// to the addresses delivery keeps away from (mx.Private: loopback,
// private, link-local, unspecified, multicast), unless the operator allows
// them (tls_reporting.allow_private_rua: report collectors inside the
// organization, tests on loopback). The check is made on the addresses
// about to be dialled, after resolution, so a name cannot pass it with one
// answer and be dialled with another.

// AddrResolver finds the addresses of a host (mx.Resolver fits).
type AddrResolver interface {
	LookupAddrs(ctx context.Context, host string, v4, v6 bool) ([]netip.Addr, error)
}

// Dialer connects to the host of an https: rua, through the relay's own
// resolver (the one delivery uses, so a configured DNS server applies to
// reports too). Its DialContext fits http.Transport.
type Dialer struct {
	Resolver AddrResolver
	// AllowPrivate lets reports go to private addresses (mx.Private).
	AllowPrivate bool
}

// PrivateAddrError is a rua host whose addresses are all private. No
// retry can change that, so the report is not tried again for that rua.
type PrivateAddrError struct {
	Host  string
	Addrs []netip.Addr
}

func (e *PrivateAddrError) Error() string {
	s := make([]string, len(e.Addrs))
	for i, a := range e.Addrs {
		s[i] = a.String()
	}
	return fmt.Sprintf("report host %s has only private addresses (%s) and tls_reporting.allow_private_rua is off",
		e.Host, strings.Join(s, ", "))
}

// Unwrap makes the error one of the rua's own, which Deliver does not retry.
func (e *PrivateAddrError) Unwrap() error { return errBadRUA }

// DialContext dials addr ("host:port") at the first of its host's
// addresses that is allowed and answers.
func (d *Dialer) DialContext(ctx context.Context, _, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	addrs, err := d.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	allowed := addrs
	if !d.AllowPrivate {
		allowed = nil
		for _, a := range addrs {
			if !mx.Private(a) {
				allowed = append(allowed, a)
			}
		}
		if len(allowed) == 0 {
			return nil, &PrivateAddrError{Host: host, Addrs: addrs}
		}
	}
	var nd net.Dialer
	err = fmt.Errorf("report host %s: no address", host)
	for _, a := range allowed {
		var c net.Conn
		if c, err = nd.DialContext(ctx, "tcp", net.JoinHostPort(a.String(), port)); err == nil {
			return c, nil
		}
	}
	return nil, err
}

// lookup returns the addresses of host, which may be an address itself
// (https://[2001:db8::1]/ is a valid rua).
func (d *Dialer) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	return d.Resolver.LookupAddrs(ctx, host, true, true)
}
