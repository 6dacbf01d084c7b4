package integration

// `greyrelay probe -from SENDER`: SPF of the sender's domain for the
// pinned source address, the relay's DKIM keys against their DNS records,
// and the DMARC policy and alignment, all answered by the test DNS server.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// authReport is the auth part of `probe -json`.
type authReport struct {
	Auth *struct {
		Domain string `json:"domain"`
		SPF    []struct {
			Address, Result, Verdict, Error, Fix string
		} `json:"spf"`
		DKIM []struct {
			Selector, Verdict, Error, Fix string
		} `json:"dkim"`
		DMARC struct {
			Name, Policy, Verdict, Error, Fix string
			SPFAligned                        bool `json:"spf_aligned"`
			DKIMAligned                       bool `json:"dkim_aligned"`
		} `json:"dmarc"`
		Verdict string `json:"verdict"`
	} `json:"auth"`
	ExitCode int `json:"exit_code"`
}

func TestProbeSenderAuthentication(t *testing.T) {
	t.Parallel()
	n := newMailNet(t)
	n.sink("sink.test", peers.SinkOptions{})
	ip := n.host("")
	keys := t.TempDir()
	var sels []string
	for _, sel := range []string{"good", "stale"} {
		res := runGreyrelay(t, keys, "", nil, "dkim", "keygen", "-algorithm", "ed25519", "pass.test", sel)
		if res.Code != 0 {
			t.Fatal(res)
		}
		if sel == "good" {
			publishKey(t, n.dns, res.Stdout)
		}
		sels = append(sels, "{selector: "+sel+", key_file: "+filepath.Join(keys, "pass.test."+sel+".key")+"}")
	}
	// The stale selector publishes some other key.
	other := runGreyrelay(t, t.TempDir(), "", nil, "dkim", "keygen", "-algorithm", "ed25519", "pass.test", "stale")
	publishKey(t, n.dns, other.Stdout)

	n.dns.TXT("pass.test", "v=spf1 ip4:"+ip+" -all").TXT("_dmarc.pass.test", "v=DMARC1; p=reject; sp=quarantine")
	n.dns.TXT("fail.test", "v=spf1 ip4:192.0.2.1 -all").TXT("_dmarc.fail.test", "v=DMARC1; p=quarantine")
	n.dns.TXT("soft.test", "v=spf1 a ~all").A("soft.test", "192.0.2.2")
	n.dns.TXT("perm.test", "v=spf1 ip4:not-an-address -all")
	n.dns.ServFail("temp.test")
	n.dns.TXT("badpolicy.test", "v=spf1 ip4:"+ip+" -all").TXT("_dmarc.badpolicy.test", "v=DMARC1; p=maybe")
	n.dns.TXT("include.test", "v=spf1 include:pass.test -all").TXT("neutral.test", "v=spf1 ?all")
	cfg := filepath.Join(t.TempDir(), "greyrelay.yaml")
	yml := n.relayYAML(ip, "dkim={domains: {pass.test: {selectors: ["+strings.Join(sels, ", ")+"]}}}")
	if err := os.WriteFile(cfg, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	probe := func(t *testing.T, from string) authReport {
		t.Helper()
		res := runGreyrelay(t, t.TempDir(), "", nil, "probe", "-config", cfg, "-json", "-from", from, "user@sink.test")
		var rep authReport
		if err := json.Unmarshal([]byte(res.Stdout), &rep); err != nil || rep.Auth == nil {
			t.Fatalf("probe -from %s: %v\n%s", from, err, res)
		}
		if res.Code != 0 {
			t.Errorf("probe -from %s: exit %d, want 0 (the path accepts; authentication does not change it)", from, res.Code)
		}
		text := runGreyrelay(t, t.TempDir(), "", nil, "probe", "-config", cfg, "-from", from, "user@sink.test")
		if !strings.Contains(text.Stdout, "6. Sender authentication for ") {
			t.Errorf("text report has no authentication section:\n%s", text.Stdout)
		}
		return rep
	}
	spfCases := []struct{ from, result, fixHas string }{
		{"a@pass.test", "pass", ""},
		{"a@fail.test", "fail", "add ip4:" + ip + " to the SPF record of fail.test"},
		{"a@soft.test", "softfail", "add ip4:" + ip},
		{"a@none.test", "none", "publish an SPF record: none.test TXT \"v=spf1 ip4:" + ip + " -all\""},
		{"a@perm.test", "permerror", "is invalid"},
		{"a@include.test", "pass", ""},
		{"a@neutral.test", "neutral", "add ip4:" + ip},
		{"a@temp.test", "temperror", "DNS lookup of temp.test failed temporarily"},
	}
	for _, tc := range spfCases {
		t.Run("spf "+tc.result+" "+tc.from, func(t *testing.T) {
			a := probe(t, tc.from).Auth
			if len(a.SPF) != 1 || a.SPF[0].Address != ip || a.SPF[0].Result != tc.result || !strings.Contains(a.SPF[0].Fix, tc.fixHas) {
				t.Errorf("SPF: %+v, want %s for %s with a fix containing %q", a.SPF, tc.result, ip, tc.fixHas)
			}
		})
	}
	t.Run("dkim and dmarc", func(t *testing.T) {
		a := probe(t, "a@pass.test").Auth
		if len(a.DKIM) != 2 || a.DKIM[0].Verdict != "pass" || a.DKIM[1].Verdict != "fail" ||
			!strings.Contains(a.DKIM[1].Error, "not the key greyrelay signs with") || !strings.Contains(a.DKIM[1].Fix, "stale._domainkey.pass.test") {
			t.Errorf("DKIM: %+v, want good pass and stale failing with the record to publish", a.DKIM)
		}
		if d := a.DMARC; d.Verdict != "pass" || d.Policy != "reject" || !d.SPFAligned || !d.DKIMAligned {
			t.Errorf("DMARC: %+v", d)
		}
		if a.Verdict != "fail" {
			t.Errorf("overall verdict %q, want fail (the stale selector)", a.Verdict)
		}
		// A subdomain falls back to the organisational domain's record and its sp=.
		sub := probe(t, "a@mail.pass.test").Auth
		if d := sub.DMARC; d.Name != "_dmarc.pass.test" || d.Policy != "quarantine" || d.Verdict != "fail" || !strings.Contains(d.Fix, "p=quarantine") {
			t.Errorf("DMARC for a subdomain: %+v", d)
		}
		fail := probe(t, "a@fail.test").Auth
		if d := fail.DMARC; d.Verdict != "fail" || d.SPFAligned || d.DKIMAligned || fail.DKIM[0].Verdict != "none" {
			t.Errorf("DMARC with SPF failing and no key: %+v %+v", d, fail.DKIM)
		}
		none := probe(t, "a@none.test").Auth
		if d := none.DMARC; d.Verdict != "none" || !strings.Contains(d.Fix, "_dmarc.none.test TXT \"v=DMARC1; p=none") {
			t.Errorf("no DMARC record: %+v", d)
		}
		// A record receivers cannot parse is named as such (go-msgauth's parser).
		bad := probe(t, "a@badpolicy.test").Auth
		if d := bad.DMARC; d.Verdict != "fail" || d.Error == "" || !strings.Contains(d.Fix, "correct the record at _dmarc.badpolicy.test") {
			t.Errorf("invalid DMARC record: %+v", d)
		}
	})
	// With the resolver down, nothing is advised to be published: a failed
	// lookup is not a missing record.
	t.Run("dns outage", func(t *testing.T) {
		dead := filepath.Join(t.TempDir(), "greyrelay.yaml")
		// No source_ipv4: with no connection made, SPF has no address to
		// evaluate, and the failed lookup is what the line must name.
		down := n.relayYAML(ip, "delivery.resolver="+peers.FreeAddr(t, "127.0.0.1"), "delivery.source_ipv4=",
			"dkim={domains: {pass.test: {selectors: ["+strings.Join(sels, ", ")+"]}}}")
		if err := os.WriteFile(dead, []byte(down), 0o600); err != nil {
			t.Fatal(err)
		}
		res := runGreyrelay(t, t.TempDir(), "", nil, "probe", "-config", dead, "-json", "-from", "a@pass.test", "user@sink.test")
		var rep authReport
		if err := json.Unmarshal([]byte(res.Stdout), &rep); err != nil || rep.Auth == nil {
			t.Fatalf("probe with the resolver down: %v\n%s", err, res)
		}
		a := rep.Auth
		for _, d := range a.DKIM {
			if d.Verdict != "fail" || !strings.Contains(d.Error, "lookup failed") || strings.Contains(d.Fix, "publish") {
				t.Errorf("DKIM with the resolver down: %+v, want a failed lookup and no advice to publish", d)
			}
		}
		if len(a.SPF) != 1 || a.SPF[0].Result != "temperror" || !strings.Contains(a.SPF[0].Fix, "DNS lookup of pass.test failed temporarily") {
			t.Errorf("SPF with the resolver down: %+v, want temperror naming the failed lookup", a.SPF)
		}
		if d := a.DMARC; d.Verdict != "fail" || !strings.Contains(d.Fix, "lookup failed") {
			t.Errorf("DMARC with the resolver down: %+v", d)
		}
		text := runGreyrelay(t, t.TempDir(), "", nil, "probe", "-config", dead, "-from", "a@pass.test", "user@sink.test")
		if !strings.Contains(text.Stdout, "SPF of pass.test for an unknown source address: temperror") {
			t.Errorf("text report names neither the domain nor the failed lookup:\n%s", text.Stdout)
		}
	})
}
