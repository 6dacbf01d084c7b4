package probe

import (
	"strings"
	"testing"
)

func TestParseTags(t *testing.T) {
	got := parseTags(" v=DMARC1;P=reject ; sp = quarantine;;novalue; rua=mailto:a@b.example ")
	want := map[string]string{"v": "DMARC1", "p": "reject", "sp": "quarantine", "rua": "mailto:a@b.example"}
	if len(got) != len(want) {
		t.Errorf("parseTags = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("tag %s = %q, want %q", k, got[k], v)
		}
	}
}

// Key records and DMARC records come from anyone's DNS.
func FuzzParseTags(f *testing.F) {
	f.Add("v=DKIM1; k=ed25519; p=AAAA")
	f.Add("v=DMARC1; p=reject; sp=none; adkim=s")
	f.Fuzz(func(t *testing.T, s string) {
		for k := range parseTags(s) {
			if k != strings.ToLower(k) || strings.TrimSpace(k) != k {
				t.Fatalf("tag name %q not normalised", k)
			}
		}
	})
}
