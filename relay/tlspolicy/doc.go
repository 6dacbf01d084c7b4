// Package tlspolicy decides how much TLS an outbound delivery needs when the
// destination publishes a policy: DANE (RFC 7672, RFC 6698) or MTA-STS
// (RFC 8461). The delivery engine asks it once per attempt, before any MX
// is dialed, and applies the answer per MX host.
//
// Design notes:
//
//   - DANE needs DNSSEC. We do not validate signatures ourselves; we trust
//     the AD bit of a validating resolver the operator declares trustworthy
//     (delivery.dnssec: trust-ad, the resolver on loopback or listed), as
//     Postfix does with smtp_dns_support_level = dnssec. Queries carry the
//     DO bit; an answer without AD is "insecure" and DANE does not apply.
//   - RFC 7672 §2.2.1: DANE applies to an MX host only when the MX RRset
//     (or the implicit MX, the domain itself) and the host's address
//     records are secure: A, and AAAA when delivery dials IPv6, with every
//     CNAME on the way (the resolver's AD bit covers the whole answer, so
//     one insecure step makes DANE not apply). §2.2.3: when the host name
//     is such a CNAME chain, the TLSA base domain is the expanded name if
//     TLSA records exist there, else the original name; §3.2.2: that base
//     domain is the SNI, and DANE-TA checks it and the MX host name.
//   - A TLSA lookup that fails (SERVFAIL: bogus signatures or an unreachable
//     authority) makes that host unusable for this attempt: RFC 7672 §2.2
//     forbids falling back to plaintext or to another policy. When no host
//     is left, the attempt is deferred with reason "tls" (4.7.5).
//   - Only DANE-TA(2) and DANE-EE(3) records are used (RFC 7672 §3.1.3:
//     PKIX-TA(0) and PKIX-EE(1) are "unusable"). TLSA records that are all
//     unusable still make TLS mandatory, but unauthenticated (§2.2).
//     DANE-EE ignores names and dates (§3.1.1); DANE-TA builds the chain to
//     the matched trust anchor and checks the TLSA base domain or the MX
//     host name (§3.2.2).
//   - MTA-STS is used where DANE does not apply (RFC 8461 §2: DANE takes
//     precedence). The policy is fetched over HTTPS with WebPKI verification
//     (system roots plus an optional CA file), no redirects and no proxy
//     (§3.3), bounded in size and time, and kept in a Cache (a store in the queue
//     database, StoreName) until its max_age; a changed TXT id fetches it again (§5.1).
//     Refresh fetches, in the background, policies close to their end.
//   - A policy in "testing" mode holds nothing back (RFC 8461 §5: deliver
//     as without a policy), but each host's Rule carries the check the
//     enforced policy would make (listed MX, STARTTLS, a WebPKI-valid
//     certificate for the MX name), which delivery runs on the session it
//     got so that TLS reports (RFC 8460 §4.3.1) count its failures.
//   - The policy fetch happens before any MX is contacted, so a freshly
//     fetched "enforce" policy already governs this attempt: we never
//     deliver through an MX that the policy forbids (§5.1).
//
// Nothing here reads the clock directly (Options.Now) and nothing keeps
// mutable state outside the injected Cache.
package tlspolicy
