package delivery

import (
	"reflect"
	"testing"

	"github.com/greyrelay/greyrelay/relay/tlspolicy"
	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

// reportPolicy names each policy as RFC 8460 §4.4 does, with the TLSA
// records of the host or the MTA-STS policy text.
func TestReportPolicy(t *testing.T) {
	dec := tlspolicy.Decision{Domain: "d.test",
		DANE: []tlspolicy.HostDANE{
			{Host: "mx1.d.test", Records: []tlspolicy.TLSA{{Usage: 3, Selector: 1, MatchingType: 1, Data: []byte{0xab}}}},
			{Host: "mx2.d.test", Records: []tlspolicy.TLSA{{Usage: 2, Selector: 0, MatchingType: 1, Data: []byte{0xcd}}}},
		},
		STS: &tlspolicy.STSPolicy{Mode: "enforce", MX: []string{"*.d.test"}, MaxAge: 600}}
	tests := []struct {
		host, label string
		want        tlsrpt.Policy
	}{
		{"mx2.d.test", tlspolicy.LabelDANE, tlsrpt.Policy{Type: "tlsa", Domain: "d.test", Strings: []string{"2 0 1 cd"}, MXHosts: []string{"mx2.d.test"}}},
		{"mx1.d.test", tlspolicy.LabelDANEOnly, tlsrpt.Policy{Type: "tlsa", Domain: "d.test", Strings: []string{"3 1 1 ab"}, MXHosts: []string{"mx1.d.test"}}},
		{"mx1.d.test", tlspolicy.LabelSTS, tlsrpt.Policy{Type: "sts", Domain: "d.test",
			Strings: []string{"version: STSv1", "mode: enforce", "mx: *.d.test", "max_age: 600"}, MXHosts: []string{"*.d.test"}}},
		{"mx1.d.test", tlspolicy.LabelNone, tlsrpt.Policy{Type: "no-policy-found", Domain: "d.test"}},
	}
	for _, tc := range tests {
		if got := reportPolicy(dec, tc.host, tc.label); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("reportPolicy(%s, %s) = %+v, want %+v", tc.host, tc.label, got, tc.want)
		}
	}
}
