package peers

import (
	"testing"

	"github.com/greyrelay/greyrelay/relay/mx/mxtest"
)

// DNS is the test DNS server of relay/mx/mxtest (UDP and TCP on one
// 127.0.0.1 port; MX, null MX, A, AAAA, CNAME, PTR, TXT, NXDOMAIN, SERVFAIL,
// truncation and dropped queries), reused here rather than duplicated. Point
// the relay at it with delivery.resolver: <DNS.Addr()>.
type DNS = mxtest.Server

// StartDNS starts an empty DNS server for the test; add records with its
// methods (s.MX("dest.test", 10, "mx.dest.test").A("mx.dest.test", "127.0.0.10")).
// Names without records answer NXDOMAIN.
func StartDNS(t testing.TB) *DNS {
	t.Helper()
	s := &mxtest.Server{}
	s.Start(t)
	return s
}
