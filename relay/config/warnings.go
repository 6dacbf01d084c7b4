package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// Warnings lists settings that are valid but cannot do what they seem to:
// the relay starts, and `config check` and the start log say why.
func (c *Config) Warnings() []string {
	out := slices.Clone(c.warnings)
	for i, l := range c.Listeners {
		if w := c.unusableListener(l); w != "" {
			out = append(out, fmt.Sprintf("listeners[%d]: %s", i, w))
		}
		if w := c.clearAuthBehindProxy(l); w != "" {
			out = append(out, fmt.Sprintf("listeners[%d]: %s", i, w))
		}
	}
	if w := c.unnamedNode(); w != "" {
		out = append(out, w)
	}
	out = append(out, c.unsignedTrusted()...)
	if w := c.ehloName(); w != "" {
		out = append(out, w)
	}
	return out
}

// unsignedTrusted warns of trusted_networks whose clients get no DKIM
// signature although keys are configured: no dkim.trusted_clients entry
// covers the network. That is the safe default for a network the
// operator did not mean to sign for, but a relay upgraded from a version
// that signed for every trusted client would go quiet about it.
func (c *Config) unsignedTrusted() []string {
	if len(c.DKIM.Domains) == 0 {
		return nil
	}
	var out []string
	for _, s := range c.TrustedNetworks {
		n, err := netip.ParsePrefix(s)
		if err != nil {
			continue
		}
		if !c.grantCovers(n.Masked()) {
			out = append(out, fmt.Sprintf("trusted_networks: clients from %s relay without AUTH but no "+
				"dkim.trusted_clients entry covers them: their mail is not DKIM-signed (list the network and its "+
				"domains there to sign it)", s))
		}
	}
	return out
}

// grantCovers reports whether some dkim.trusted_clients network contains
// all of n.
func (c *Config) grantCovers(n netip.Prefix) bool {
	for _, g := range c.DKIM.TrustedClients {
		for _, s := range g.Networks {
			p, err := netip.ParsePrefix(s)
			if err == nil && p.Bits() <= n.Bits() && p.Contains(n.Addr()) {
				return true
			}
		}
	}
	return false
}

// ehloName warns when the name the relay gives itself in EHLO, Received
// and DSNs is not one receivers can check: not set (the system's host
// name, in a container its ID) or not a fully qualified domain name.
// Receivers compare the EHLO name with DNS (RFC 5321 §4.1.4 lets them
// record it, and many score or refuse a name that is not a domain).
// Whether it resolves needs DNS: Preflight checks that.
func (c *Config) ehloName() string {
	const fix = "set hostname to this host's fully qualified name (one that resolves to its address, which the address's PTR record names)"
	switch {
	case c.systemHostname:
		return fmt.Sprintf("hostname is not set: the relay names itself %q (the system's host name; in a container, "+
			"its ID) in EHLO, Received and DSNs: %s", c.Hostname, fix)
	case !isFQDN(c.Hostname):
		return fmt.Sprintf("hostname: %q is not a fully qualified domain name: receivers see it in EHLO: %s", c.Hostname, fix)
	}
	return ""
}

// isFQDN reports whether name looks like a fully qualified domain name:
// at least two labels, and not an IP address.
func isFQDN(name string) bool {
	name = strings.TrimSuffix(name, ".")
	return strings.Contains(name, ".") && !isIP(name) && hostNameRE.MatchString(name)
}

// unnamedNode warns of a cluster node without cluster.node_name: it
// registers under hostname, which every node started from one shared
// configuration file (or on one machine) has in common, and two running
// nodes with one name overwrite each other's registry entry, so that
// `greyrelay cluster status` and the queue hand-over of a dead node see
// only one of them.
func (c *Config) unnamedNode() string {
	if len(c.Cluster.Redis.Addresses) == 0 || c.Cluster.NodeName != "" {
		return ""
	}
	return fmt.Sprintf("cluster.node_name is empty: this node registers as %q (hostname); nodes that share "+
		"a configuration file or a host name overwrite each other's entry: give each node its own cluster.node_name "+
		"(or GREYRELAY_CLUSTER_NODE_NAME)", c.Hostname)
}

// dropLateWarnings removes delay warnings due at or after retry.lifetime:
// the message has bounced by then. A configuration that shortens the
// lifetime need not repeat the list of warnings (as Postfix's
// delay_warning_time simply never fires after the bounce).
func (c *Config) dropLateWarnings() {
	kept := c.Retry.DelayWarnings[:0:0]
	for _, w := range c.Retry.DelayWarnings {
		if c.Retry.Lifetime > 0 && w >= c.Retry.Lifetime {
			c.warnings = append(c.warnings, fmt.Sprintf(
				"retry.delay_warnings: %v is not before retry.lifetime (%v), when the message bounces: dropped", w, c.Retry.Lifetime))
			continue
		}
		kept = append(kept, w)
	}
	c.Retry.DelayWarnings = kept
}

// unusableListener explains why a listener other hosts can reach serves
// none of them: nobody may relay without AUTH (trusted_networks holds only
// loopback networks), and AUTH is impossible (no users_file, or a
// plaintext listener where AUTH is offered only after STARTTLS).
func (c *Config) unusableListener(l Listener) string {
	host, _, err := net.SplitHostPort(l.Address)
	if err != nil || isLoopbackHost(host) {
		return ""
	}
	for _, s := range c.TrustedNetworks {
		if p, err := netip.ParsePrefix(s); err == nil && !p.Addr().IsLoopback() {
			return ""
		}
	}
	tls := l.TLSCert != "" || l.AllowPlaintextAuth
	switch {
	case c.UsersFile == "":
		return fmt.Sprintf("%s accepts connections from other hosts, but none of them may send: trusted_networks "+
			"holds no network beyond loopback and there is no users_file for AUTH (add the clients' network to "+
			"trusted_networks, or set users_file and TLS)", l.Address)
	case !tls:
		return fmt.Sprintf("%s accepts connections from other hosts, but none of them may send: trusted_networks "+
			"holds no network beyond loopback, and AUTH is offered only after STARTTLS, which needs tls_cert and tls_key", l.Address)
	}
	return ""
}

// clearAuthBehindProxy warns of a PROXY listener that offers password
// AUTH without TLS: the balancer forwards clients from anywhere, so the
// listener's own address (often loopback, next to the balancer) says
// nothing about who reads the password on the way. Without
// allow_plaintext_auth the relay offers AUTH in clear only to clients the
// PROXY header names as loopback.
func (c *Config) clearAuthBehindProxy(l Listener) string {
	if !l.ProxyProtocol || !l.AllowPlaintextAuth || c.UsersFile == "" {
		return ""
	}
	return fmt.Sprintf("%s has proxy_protocol and allow_plaintext_auth: AUTH PLAIN/LOGIN is offered before STARTTLS "+
		"to every client the balancer forwards, so passwords cross the network in clear unless the balancer itself "+
		"terminates TLS (drop allow_plaintext_auth: AUTH is then offered after STARTTLS)", l.Address)
}

// isLoopbackHost reports whether a listener's host accepts only local
// connections.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
