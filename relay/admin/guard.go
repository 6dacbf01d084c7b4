package admin

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"go.uber.org/zap"
)

// A browser on the relay's host can reach a loopback admin server, so web
// pages are treated as hostile callers. Two defences wrap every route,
// before the token check:
//
//   - Cross-site request forgery: a page can make the browser POST a form
//     to http://127.0.0.1:8025/api/queue/delete?all=1 without reading the
//     answer. http.CrossOriginProtection refuses every state-changing
//     request (anything but GET, HEAD, OPTIONS) that the browser marks as
//     cross-origin: Sec-Fetch-Site other than same-origin or none, or,
//     from browsers that do not send Sec-Fetch-Site, an Origin whose host
//     is not the request's Host. The CLI, curl and Prometheus send neither
//     header and pass.
//   - DNS rebinding: a page at http://evil.example:8025/ whose name is
//     re-pointed at 127.0.0.1 becomes same-origin with the admin server and
//     could read the queue. Its requests carry "Host: evil.example:8025",
//     so only Host names the operator chose are served: admin.address's
//     host, loopback names and addresses, and admin.allowed_hosts.
//     Rebinding needs a name the attacker controls, so when admin.address
//     is a wildcard (0.0.0.0, [::]) any IP literal is accepted as being
//     one of the host's addresses; names still have to be listed.

// hostPolicy decides which HTTP Host values the admin server answers.
type hostPolicy struct {
	names map[string]bool // normalised host names and IP addresses
	anyIP bool            // admin.address is a wildcard address
}

// newHostPolicy builds the policy for a listen address and the operator's
// admin.allowed_hosts.
func newHostPolicy(listen string, allowed []string) hostPolicy {
	p := hostPolicy{names: make(map[string]bool)}
	if host, _, err := net.SplitHostPort(listen); err == nil {
		if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
			p.anyIP = true
		} else {
			p.names[normalHost(host)] = true
		}
	}
	for _, h := range allowed {
		p.names[normalHost(h)] = true
	}
	return p
}

// normalHost lowercases a host (without port), drops a final dot and
// IPv6 brackets, and writes IP addresses in their canonical form.
func normalHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if ip, err := netip.ParseAddr(h); err == nil {
		return ip.Unmap().String()
	}
	return h
}

// allows reports whether a request's Host (RFC 9110 §7.2: host and an
// optional port) is one the server answers to. The port is not compared:
// a rebinding page uses the listener's real port anyway. An empty Host
// (HTTP/1.0) is accepted, because browsers always send one.
func (p hostPolicy) allows(hostport string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = normalHost(host)
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.IsLoopback() || p.anyIP || p.names[host]
	}
	// RFC 6761 §6.3: localhost and every name under .localhost are
	// loopback, and browsers resolve them so without asking DNS.
	return host == "localhost" || strings.HasSuffix(host, ".localhost") || p.names[host]
}

// guard wraps next with the Host check and cross-origin protection.
func (s *Server) guard(next http.Handler) http.Handler {
	hosts := newHostPolicy(s.opt.Config.Admin.Address, s.opt.Config.Admin.AllowedHosts)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.log.Info("admin request refused: cross-origin", zap.String("method", r.Method),
			zap.String("path", r.URL.Path), zap.String("origin", r.Header.Get("Origin")),
			zap.String("sec_fetch_site", r.Header.Get("Sec-Fetch-Site")), zap.String("remote", r.RemoteAddr))
		writeError(w, http.StatusForbidden, errors.New("cross-origin request refused: the admin API does not act for web pages"))
	}))
	checked := cop.Handler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hosts.allows(r.Host) {
			s.log.Info("admin request refused: unknown Host", zap.String("host", r.Host),
				zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr))
			writeError(w, http.StatusForbidden, fmt.Errorf(
				"host %q is not the admin address, a loopback name or listed in admin.allowed_hosts", r.Host))
			return
		}
		checked.ServeHTTP(w, r)
	})
}
