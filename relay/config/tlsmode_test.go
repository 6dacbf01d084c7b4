package config

import (
	"testing"

	"github.com/greyrelay/greyrelay/relay/smtpclient"
)

// TestTLSModesAreClientPolicies ties the configuration's TLS modes to the
// outbound client's policies: the delivery engine converts one into the
// other, so a mode the client does not know would pass validation and then
// mean something else on the wire.
func TestTLSModesAreClientPolicies(t *testing.T) {
	client := map[smtpclient.TLSPolicy]bool{smtpclient.TLSNone: true, smtpclient.TLSMay: true,
		smtpclient.TLSEncrypt: true, smtpclient.TLSVerify: true}
	for _, m := range TLSModes {
		if !m.Valid() {
			t.Errorf("%q is listed but not valid", m)
		}
		if !client[smtpclient.TLSPolicy(m)] {
			t.Errorf("TLS mode %q is not a smtpclient.TLSPolicy", m)
		}
	}
	if len(TLSModes) != len(client) {
		t.Errorf("%d TLS modes, %d client policies", len(TLSModes), len(client))
	}
	for _, m := range []TLSMode{"", "maybe", "VERIFY"} {
		if m.Valid() {
			t.Errorf("%q is valid", m)
		}
	}
}
