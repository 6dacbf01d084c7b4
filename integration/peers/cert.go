package peers

import (
	"testing"

	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// Cert is relaytest.Cert: a self-signed certificate for test servers, in
// memory and as PEM files.
type Cert = relaytest.Cert

// NewCert is relaytest.NewCert (default hosts "localhost" and 127.0.0.1).
func NewCert(t testing.TB, hosts ...string) *Cert {
	t.Helper()
	return relaytest.NewCert(t, hosts...)
}
