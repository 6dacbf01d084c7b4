package integration

// Who gets what signed, with the real binary and dkimpy as the verifier:
// an authenticated user only the From addresses they may send as, a client
// of trusted_networks only the domains dkim.trusted_clients grants it.

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// identityKeys makes Ed25519 keys for a.test and b.test with `greyrelay
// dkim keygen`, publishes them, and returns the dkim.domains YAML.
func identityKeys(t *testing.T, n *mailNet) string {
	t.Helper()
	dir := t.TempDir()
	var doms []string
	for _, d := range []string{"a.test", "b.test"} {
		res := runGreyrelay(t, dir, "", nil, "dkim", "keygen", "-algorithm", "ed25519", d, "s1")
		if res.Code != 0 {
			t.Fatal(res)
		}
		publishKey(t, n.dns, res.Stdout)
		doms = append(doms, d+": {selectors: [{selector: s1, key_file: "+dir+"/"+d+".s1.key}]}")
	}
	return "{" + strings.Join(doms, ", ") + "}"
}

var dkimDomain = regexp.MustCompile(`(?m)^DKIM-Signature:.*?\bd=([^;]+);`)

// signedAs returns the d= of every DKIM-Signature of msg that dkimpy
// verifies, failing the test for one that does not verify.
func signedAs(t *testing.T, msg []byte, dns string) []string {
	t.Helper()
	if !bytes.Contains(msg, []byte("DKIM-Signature:")) {
		return nil
	}
	out, ok := peers.DKIMVerify(t, msg, dns)
	if !ok || !strings.Contains(out, ": ok") {
		t.Errorf("dkimpy does not verify the signature:\n%s\n%s", out, head(msg))
		return nil
	}
	var ds []string
	unfolded := regexp.MustCompile(`\r\n[ \t]`).ReplaceAll(msg, []byte(" "))
	for _, m := range dkimDomain.FindAllSubmatch(unfolded, -1) {
		ds = append(ds, strings.TrimSpace(string(m[1])))
	}
	return ds
}

// bySubject finds the message with the subject in the sink.
func bySubject(t *testing.T, sink *peers.Sink, subject string) []byte {
	t.Helper()
	for _, m := range sink.Messages() {
		if bytes.Contains(m.Data, []byte("\r\nSubject: "+subject+"\r\n")) {
			return m.Data
		}
	}
	t.Fatalf("no message %q at the sink", subject)
	return nil
}

// TestDKIMHeaderFromIsIdentity is the DMARC-aligned forgery and its fix:
// bob may send only as bob@b.test; MAIL FROM:<bob@b.test> with From:
// alice@a.test gets 550 5.7.1 after DATA (and with foreign_header_from:
// unsigned arrives without any signature), while bob's own From is signed
// d=b.test and verifies. A trusted client granted b.test gets b.test
// signed and a.test not; a trusted client without a grant gets nothing
// signed.
func TestDKIMHeaderFromIsIdentity(t *testing.T) {
	peers.Require(t, "swaks", "dkimverify")
	t.Parallel()
	n := newMailNet(t)
	keys := identityKeys(t, n)
	sink := n.sink("sink.test", peers.SinkOptions{})
	users := usersFile(t, []string{"bob", "bob@b.test"}, []string{"alice", "alice@a.test"})
	granted, ungranted := n.host(""), n.host("")
	// docs/dkim.md's trusted_clients, its web servers' network standing
	// for granted and their shop's domain for b.test.
	block := recipeBlocks(t, "TestDKIMHeaderFromIsIdentity")[0].Text
	if !strings.Contains(block, "10.1.0.0/16") || !strings.Contains(block, "shop.example.com") {
		t.Fatalf("docs/dkim.md's trusted_clients block changed:\n%s", block)
	}
	block = strings.NewReplacer("10.1.0.0/16", granted+"/32", "shop.example.com", "B.TEST").Replace(block)
	var doc struct {
		DKIM map[string]any `yaml:"dkim"`
	}
	if err := yaml.Unmarshal([]byte(block), &doc); err != nil {
		t.Fatal(err)
	}
	var domains map[string]any
	if err := yaml.Unmarshal([]byte(keys), &domains); err != nil {
		t.Fatal(err)
	}
	doc.DKIM["domains"] = domains
	cfg := []string{"users_file=" + users, "trusted_networks=[" + granted + "/32, " + ungranted + "/32]",
		"dkim=" + yamlOf(t, doc.DKIM)}
	r := n.relay(cfg...)

	asBob := func(r *testRelay, from, subject string) (string, int) {
		return peers.SwaksMessage{Server: r.SMTPAddr, From: "bob@b.test", To: []string{"x@sink.test"},
			Data: message(from, "x@sink.test", subject),
			Args: []string{"--auth", "PLAIN", "--auth-user", "bob", "--auth-password", "bob-pw"}}.Send(t)
	}
	out, code := asBob(r, "alice@a.test", "forged")
	if code != 26 || !strings.Contains(out, "550 5.7.1 Header From/Sender <alice@a.test>: Sender address rejected: not owned by user bob") {
		t.Errorf("bob with From alice@a.test: swaks exit %d, want 26 (refused after DATA):\n%s", code, out)
	}
	if out, code := asBob(r, "bob@b.test", "own"); code != 0 {
		t.Fatalf("bob as himself: exit %d\n%s", code, out)
	}
	for _, c := range []struct{ src, from, subject string }{
		{granted, "app@b.test", "granted"},
		{granted, "app@a.test", "not granted"},
		{ungranted, "app@b.test", "no grant"},
	} {
		r.send(peers.SwaksMessage{LocalIP: c.src, From: "app@app.test", To: []string{"x@sink.test"}, Data: message(c.from, "x@sink.test", c.subject)})
	}
	sink.WaitFor(t, 4, 30*time.Second)
	for subject, want := range map[string]string{"own": "b.test", "granted": "b.test", "not granted": "", "no grant": ""} {
		if got := strings.Join(signedAs(t, bySubject(t, sink, subject), n.dns.Addr()), ","); got != want {
			t.Errorf("%s: signed d=%q, want %q", subject, got, want)
		}
	}

	// The operator's other choice: the forgery is relayed, unsigned.
	r2 := n.relay(append(cfg, "foreign_header_from=unsigned")...)
	if out, code := asBob(r2, "alice@a.test", "forged unsigned"); code != 0 {
		t.Fatalf("foreign_header_from unsigned: exit %d\n%s", code, out)
	}
	sink.WaitFor(t, 5, 30*time.Second)
	if msg := bySubject(t, sink, "forged unsigned"); bytes.Contains(msg, []byte("DKIM-Signature:")) {
		t.Errorf("the forged From was signed:\n%s", head(msg))
	}
}
