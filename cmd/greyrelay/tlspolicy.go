package main

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
)

// stsFetchTimeout bounds one MTA-STS policy fetch (RFC 8461 §3.3 asks for
// a bound; Postfix's mta-sts resolvers use about a minute, mox 30 s).
const stsFetchTimeout = 30 * time.Second

// stsRefreshEvery is how often cached MTA-STS policies are looked at in
// the background (tlspolicy.Checker.Refresh decides which to fetch).
const stsRefreshEvery = time.Hour

// newTLSPolicy builds the DANE and MTA-STS checker of cfg, or nil when
// both are off. DNSSEC queries go to the resolver routing uses.
func newTLSPolicy(cfg *config.Config, router *mx.Router, cache tlspolicy.Cache) (*tlspolicy.Checker, error) {
	d := cfg.Delivery
	dns, ok := router.Resolver.(*mx.DNS)
	if (d.DNSSEC != config.DNSSECTrustAD && !d.MTASTS) || !ok {
		return nil, nil
	}
	server := dns.Server
	opt := tlspolicy.Options{STS: d.MTASTS, TXT: router.Resolver, Cache: cache, Port: d.Port, Now: time.Now}
	if d.DNSSEC == config.DNSSECTrustAD {
		// RFC 6698 §4.1, RFC 4035 §4.9.3: the AD bit means something only
		// when the path to the validating resolver is trusted.
		if !tlspolicy.TrustedResolver(server, d.DNSSECTrustedResolvers) {
			return nil, fmt.Errorf("delivery.dnssec: trust-ad, but the resolver %s is neither on loopback nor in delivery.dnssec_trusted_resolvers", server)
		}
		opt.DNSSEC = &tlspolicy.DNSSEC{Server: server, Timeout: 10 * time.Second, IPv6: router.IPv6}
	}
	roots, err := tlspolicy.Roots(d.TLSCAFile)
	if err != nil {
		return nil, fmt.Errorf("delivery.%w", err)
	}
	opt.Roots = roots
	opt.Fetcher = tlspolicy.NewFetcher(router.Resolver, roots, 443, stsFetchTimeout)
	return tlspolicy.New(opt)
}

// refreshPolicies refreshes cached MTA-STS policies until ctx ends.
func refreshPolicies(ctx context.Context, c *tlspolicy.Checker, log *zap.Logger) {
	t := time.NewTicker(stsRefreshEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := c.Refresh(ctx); err != nil && ctx.Err() == nil {
				log.Warn("MTA-STS policy refresh", zap.Error(err))
			}
		}
	}
}
