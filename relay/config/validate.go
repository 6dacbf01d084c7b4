package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/dkim"
)

// Validate reports every problem in c at once, each naming its key, so an
// operator fixes a file in one pass. It reads the files the configuration
// names (to prove they are readable) but opens no sockets.
func (c *Config) Validate() error {
	var v validator
	v.check(c.Hostname != "", "hostname: empty and the system hostname is unknown")
	v.listeners(c.Listeners)
	v.trusted(c.TrustedNetworks)
	v.proxyProtocol(c.ProxyProtocol, c.Listeners)
	v.readable("users_file", c.UsersFile)
	v.oneOf("foreign_header_from", c.ForeignHeaderFrom, "refuse", "unsigned")
	v.limits(c.Limits)
	v.check(c.BareCR.Valid(), "bare_cr: %q is not one of %v", c.BareCR, []BareCRPolicy{BareCRNormalize, BareCRReject})
	if c.Postmaster != "" {
		_, err := address.Parse(c.Postmaster, address.Options{SMTPUTF8: true})
		v.check(err == nil, "postmaster: %q is not an address (user@domain): %v", c.Postmaster, err)
	}
	v.check(c.Queue.Path != "", "queue.path: empty")
	v.positive("queue.lock_timeout", int64(c.Queue.LockTimeout))
	v.check(c.Queue.ReservePercent >= 1 && c.Queue.ReservePercent <= 50,
		"queue.reserve_percent: %d, want 1 to 50", c.Queue.ReservePercent)
	v.check(c.Queue.CommitDelay >= 0 && c.Queue.CommitDelay <= 100*time.Millisecond,
		"queue.commit_delay: %v, want 0 (none) to 100ms", c.Queue.CommitDelay)
	v.check(c.History.Retention >= 0, "history.retention: %v, want 0 (keep none) or more", c.History.Retention)
	v.positive("history.max_messages", int64(c.History.MaxMessages))
	v.admin(c.Admin)
	v.api(c.API)
	v.oneOf("suppression.scope", c.Suppression.Scope, "global", "sender-domain")
	v.positive("suppression.ttl", int64(c.Suppression.TTL))
	v.oneOf("suppression.action", c.Suppression.Action, SuppressRefuse, SuppressBounce)
	for i, f := range c.Suppression.Imports {
		v.readable(fmt.Sprintf("suppression.imports[%d]", i), f)
	}
	v.userLimits("user_limits.", c.UserLimits.For("\x00")) // the defaults: no identity has a NUL
	for id, o := range c.UserLimits.Overrides {
		v.userLimits("user_limits.overrides."+id+".", o)
	}
	v.oneOf("log.format", c.Log.Format, "console", "json")
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.delivery(c.Delivery)
	v.retry(c.Retry)
	v.positive("dsn.max_returned_bytes", int64(c.DSN.MaxReturnedBytes))
	v.positive("dsn.max_per_sender_per_hour", int64(c.DSN.MaxPerSenderPerHour))
	v.dkim(c.DKIM)
	v.events(c.Events)
	v.tlsReporting(c.TLSReporting)
	v.cluster(c.Cluster)
	return c.located(v.errs)
}

// located joins errors, each prefixed with where its key was set (the
// file's line or the environment variable).
func (c *Config) located(errs []error) error {
	for i, err := range errs {
		errs[i] = c.origin.locate(err)
	}
	return errors.Join(errs...)
}

type validator struct{ errs []error }

func (v *validator) check(ok bool, format string, args ...any) {
	if !ok {
		v.errs = append(v.errs, fmt.Errorf(format, args...))
	}
}

func (v *validator) positive(key string, n int64) {
	v.check(n > 0, "%s: must be greater than 0 (0 would mean unlimited or never)", key)
}

func (v *validator) oneOf(key, val string, allowed ...string) {
	for _, a := range allowed {
		if val == a {
			return
		}
	}
	v.check(false, "%s: %q is not one of %v", key, val, allowed)
}

func (v *validator) readable(key, path string) {
	if path == "" {
		return
	}
	f, err := os.Open(path)
	if err != nil {
		v.check(false, "%s: %v", key, err)
		return
	}
	f.Close()
}

func (v *validator) hostPort(key, addr string) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.check(false, "%s: %v", key, err)
		return
	}
	n, err := strconv.Atoi(port)
	v.check(err == nil && n > 0 && n < 65536, "%s: bad port %q", key, port)
}

func (v *validator) listeners(ls []Listener) {
	v.check(len(ls) > 0, "listeners: at least one is needed")
	for i, l := range ls {
		key := fmt.Sprintf("listeners[%d]", i)
		v.hostPort(key+".address", l.Address)
		v.check(l.Mode.Valid(), "%s: %q is not one of %v", key+".mode", l.Mode, []ListenerMode{ModeSMTP, ModeSubmission, ModeSubmissions})
		if l.Mode == ModeSubmission || l.Mode == ModeSubmissions {
			v.check(l.TLSCert != "" && l.TLSKey != "", "%s: mode %s needs tls_cert and tls_key", key, l.Mode)
		}
		v.check((l.TLSCert == "") == (l.TLSKey == ""), "%s: tls_cert and tls_key go together", key)
		v.readable(key+".tls_cert", l.TLSCert)
		v.readable(key+".tls_key", l.TLSKey)
	}
}

// trusted refuses networks that would make greyrelay an open relay. Behind
// Docker's NAT every client looks like the bridge gateway, so the container
// configuration trusts nothing at all: trusting the gateway's network there
// would trust every client on the Internet.
func (v *validator) trusted(nets []string) {
	for _, s := range nets {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			v.check(false, "trusted_networks: %q: %v", s, err)
			continue
		}
		v.check(p.Bits() > 0, "trusted_networks: %s would trust every address on the Internet (an open relay)", s)
	}
}

// proxyProtocol checks the load balancers whose PROXY headers are believed:
// a header sets the client address that relay policy trusts, so believing
// it from anywhere would let any client claim a trusted address.
func (v *validator) proxyProtocol(p ProxyProto, ls []Listener) {
	for _, s := range p.Trusted {
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			v.check(false, "proxy_protocol.trusted: %q: %v", s, err)
			continue
		}
		v.check(pr.Bits() > 0, "proxy_protocol.trusted: %s would let any client choose its own address", s)
	}
	v.positive("proxy_protocol.header_timeout", int64(p.HeaderTimeout))
	for i, l := range ls {
		v.check(!l.ProxyProtocol || len(p.Trusted) > 0,
			"listeners[%d]: proxy_protocol needs proxy_protocol.trusted (the load balancers' networks)", i)
	}
}

func (v *validator) cluster(c Cluster) {
	for i, a := range c.Redis.Addresses {
		v.hostPort(fmt.Sprintf("cluster.redis.addresses[%d]", i), a)
	}
	v.readable("cluster.redis.password_file", c.Redis.PasswordFile)
	v.readable("cluster.redis.tls_ca", c.Redis.TLSCA)
	v.positive("cluster.redis.timeout", int64(c.Redis.Timeout))
	v.oneOf("cluster.destination_limits", c.DestinationLimits, "shared", "local")
	v.check(c.LeaseTTL >= time.Second, "cluster.lease_ttl: %v, want 1s or more", c.LeaseTTL)
}

func (v *validator) limits(l Limits) {
	for _, p := range l.Problems() {
		v.check(false, "%s", p)
	}
}

func (v *validator) admin(a Admin) {
	v.positive("admin.probe_concurrency", int64(a.ProbeConcurrency))
	v.positive("admin.probe_per_minute", int64(a.ProbePerMinute))
	for _, h := range a.AllowedHosts {
		v.check(hostNameRE.MatchString(h) || isIP(h),
			"admin.allowed_hosts: %q is not a host name or IP address (no port, scheme or wildcard)", h)
	}
	if a.Address == "" {
		return
	}
	v.hostPort("admin.address", a.Address)
	host, _, _ := net.SplitHostPort(a.Address)
	ip, err := netip.ParseAddr(host)
	loopback := err == nil && ip.IsLoopback() || host == "localhost"
	v.check(loopback || a.Token != "", "admin.address: %s is not loopback, so admin.token (or admin.token_file) is required", a.Address)
	v.readable("admin.token_file", a.TokenFile)
}

func (v *validator) api(a API) {
	if a.Address == "" {
		return
	}
	v.hostPort("api.address", a.Address)
	host, _, _ := net.SplitHostPort(a.Address)
	ip, err := netip.ParseAddr(host)
	loopback := err == nil && ip.IsLoopback() || host == "localhost"
	// Tokens travel in every request: never in clear off the machine, as
	// SMTP AUTH is only offered under TLS off loopback.
	v.check(loopback || a.TLSCert != "", "api.address: %s is not loopback, so api.tls_cert and api.tls_key are required", a.Address)
	v.check((a.TLSCert == "") == (a.TLSKey == ""), "api.tls_cert and api.tls_key: set both or neither")
	v.readable("api.tls_cert", a.TLSCert)
	v.readable("api.tls_key", a.TLSKey)
	v.check(a.TokensFile != "", "api.tokens_file: required when api.address is set (greyrelay token add writes it)")
	v.readable("api.tokens_file", a.TokensFile)
	v.positive("api.idempotency_ttl", int64(a.IdempotencyTTL))
}

// hostNameRE matches a DNS name as it appears in an HTTP Host header
// (letters, digits, '-' and '_' in dot-separated labels).
var hostNameRE = regexp.MustCompile(`^(?i)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*\.?$`)

// isIP reports whether s is an IP address, IPv6 with or without brackets.
func isIP(s string) bool {
	_, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	return err == nil
}

func (v *validator) delivery(d Delivery) {
	v.sourceIP("delivery.source_ipv4", d.SourceIPv4, true)
	v.sourceIP("delivery.source_ipv6", d.SourceIPv6, false)
	v.check(d.Port > 0 && d.Port < 65536, "delivery.port: %d is not a port", d.Port)
	if d.Resolver != "" {
		v.hostPort("delivery.resolver", d.Resolver)
	}
	v.check(d.TLS.Valid(), "delivery.tls: %q is not one of %v", d.TLS, TLSModes)
	v.check(d.DNSSEC.Valid(), "delivery.dnssec: %q is not one of %v", d.DNSSEC, []DNSSECMode{DNSSECOff, DNSSECTrustAD})
	for _, r := range d.DNSSECTrustedResolvers {
		v.check(isIP(r), "delivery.dnssec_trusted_resolvers: %q is not an IP address", r)
	}
	v.readable("delivery.tls_ca_file", d.TLSCAFile)
	v.positive("delivery.max_connections", int64(d.MaxConnections))
	v.positive("delivery.max_per_destination", int64(d.MaxPerDestination))
	v.positive("delivery.initial_per_destination", int64(d.InitialPerDestination))
	v.check(d.MaxPerDestinationLocal >= 0, "delivery.max_per_destination_local: %d, want 0 (no cap) or more", d.MaxPerDestinationLocal)
	v.positive("delivery.max_messages_per_connection", int64(d.MaxMessagesPerConnection))
	v.positive("delivery.max_recipients_per_transaction", int64(d.MaxRecipientsPerTransaction))
	v.check(d.ConnectionCacheTime >= 0, "delivery.connection_cache_time: %s is negative", d.ConnectionCacheTime)
	v.positive("delivery.connect_timeout", int64(d.ConnectTimeout))
	v.positive("delivery.greeting_timeout", int64(d.GreetingTimeout))
	v.positive("delivery.command_timeout", int64(d.CommandTimeout))
	v.positive("delivery.data_timeout", int64(d.DataTimeout))
	v.oneOf("delivery.address_literals", d.AddressLiterals, "refuse", "deliver")
	v.check(d.LineLengthLimit == 0 || d.LineLengthLimit >= 78, "delivery.line_length_limit: %d, want 0 (send unchanged) or at least 78", d.LineLengthLimit)
	v.positive("delivery.mx_address_limit", int64(d.MXAddressLimit))
	v.positive("delivery.mx_session_limit", int64(d.MXSessionLimit))
	s := d.Smarthost
	if s.Address != "" {
		v.hostPort("delivery.smarthost.address", s.Address)
	}
	v.check(s.TLS.Valid(), "delivery.smarthost.tls: %q is not one of %v", s.TLS, TLSModes)
	v.check(s.Username == "" || s.Password != "", "delivery.smarthost: username without password")
	v.readable("delivery.smarthost.password_file", s.PasswordFile)
	for dom, hop := range d.Routes {
		v.hostPort("delivery.routes."+dom, hop)
	}
}

func (v *validator) sourceIP(key, s string, want4 bool) {
	if s == "" {
		return
	}
	ip, err := netip.ParseAddr(s)
	v.check(err == nil && ip.Is4() == want4, "%s: %q is not an IPv%s address", key, s, map[bool]string{true: "4", false: "6"}[want4])
}

func (v *validator) retry(r Retry) {
	if err := r.Policy().Validate(); err != nil {
		v.check(false, "retry: %v", err)
	}
	// Above retry.lifetime it is capped (as Postfix caps
	// bounce_queue_lifetime), not refused: a configuration that shortens
	// retry.lifetime need not repeat the change here.
	v.positive("retry.dsn_lifetime", int64(r.DSNLifetime))
	for _, w := range r.DelayWarnings {
		// One at or past retry.lifetime was dropped by Load, with a warning.
		v.check(w > 0, "retry.delay_warnings: %v must be greater than 0", w)
	}
	if _, err := classifier.New(r.Rules); err != nil {
		v.check(false, "retry.rules: %v", err)
	}
}

// Policy converts the retry keys into the backoff package's policy.
func (r Retry) Policy() backoff.Policy {
	return backoff.Policy{
		Initial: r.InitialInterval, Factor: r.Factor, Max: r.MaxInterval, Jitter: r.Jitter,
		GreylistFirst: r.GreylistFirstRetry, GreylistSecond: r.GreylistSecondRetry,
		HintMin: r.HintMin, HintMax: r.HintMax, Lifetime: r.Lifetime,
	}
}

// dkim reads every key file, so that a missing or malformed key stops the
// relay at start (or a reload) instead of leaving a domain unsigned.
func (v *validator) dkim(d DKIM) {
	v.oneOf("dkim.without_key", d.WithoutKey, "relay", "refuse")
	v.check(d.WithoutKey != "refuse" || len(d.Domains) > 0,
		"dkim.without_key: refuse with no dkim.domains would refuse every message")
	v.dkimGrants(d.TrustedClients)
	for dom, dd := range d.Domains {
		key := "dkim.domains." + dom
		_, err := address.CanonicalDomain(dom)
		v.check(err == nil && !strings.HasPrefix(dom, "["), "%s: not a domain name", key)
		v.check(len(dd.Selectors) > 0, "%s.selectors: at least one is needed", key)
		seen := map[string]bool{}
		for i, s := range dd.Selectors {
			sk := fmt.Sprintf("%s.selectors[%d]", key, i)
			v.check(hostNameRE.MatchString(s.Selector), "%s.selector: %q is not a DNS label sequence", sk, s.Selector)
			v.check(!seen[strings.ToLower(s.Selector)], "%s.selector: %q is listed twice", sk, s.Selector)
			seen[strings.ToLower(s.Selector)] = true
			if s.Algorithm != "" {
				v.oneOf(sk+".algorithm", s.Algorithm, dkim.RSASHA256, dkim.Ed25519SHA256)
			}
			if s.KeyFile == "" {
				v.check(false, "%s.key_file: empty", sk)
				continue
			}
			if _, err := dkim.ReadKey(s.KeyFile, s.Algorithm); err != nil {
				v.check(false, "%s.key_file: %v", sk, err)
			}
		}
	}
}

// dkimGrants checks dkim.trusted_clients: networks that parse, and
// domains that are "*" or domain names.
func (v *validator) dkimGrants(gs []DKIMGrant) {
	for i, g := range gs {
		key := fmt.Sprintf("dkim.trusted_clients[%d]", i)
		v.check(len(g.Networks) > 0, "%s.networks: at least one is needed", key)
		for _, n := range g.Networks {
			_, err := netip.ParsePrefix(n)
			v.check(err == nil, "%s.networks: %q: %v", key, n, err)
		}
		v.check(len(g.Domains) > 0, "%s.domains: at least one is needed (\"*\": every domain with a key)", key)
		for _, d := range g.Domains {
			if d == "*" {
				continue
			}
			_, err := address.CanonicalDomain(d)
			v.check(err == nil && !strings.HasPrefix(d, "["), "%s.domains: %q is not a domain name or \"*\"", key, d)
		}
	}
}

func (v *validator) tlsReporting(t TLSReporting) {
	v.positive("tls_reporting.timeout", int64(t.Timeout))
	if t.From != "" {
		_, err := address.Parse(t.From, address.Options{})
		v.check(err == nil, "tls_reporting.from: %q is not an address (user@domain): %v", t.From, err)
	}
}

func (v *validator) userLimits(prefix string, l UserLimitSet) {
	for key, n := range map[string]int{"messages_per_hour": l.MessagesPerHour, "messages_per_day": l.MessagesPerDay,
		"recipients_per_hour": l.RecipientsPerHour, "recipients_per_day": l.RecipientsPerDay} {
		v.check(n >= 0, "%s%s: %d, want 0 (no limit) or more", prefix, key, n)
	}
}
