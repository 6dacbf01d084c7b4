package integration

// DKIM signing with the real binary: keys made by docs/dkim.md's
// `greyrelay dkim keygen` commands and named by its dkim example, records
// published in the test DNS server, and every signature checked by dkimpy
// (python3-dkim), an implementation independent of the relay's, both at a
// sink that is the MX and behind a real Postfix destination.

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// readmeDKIM runs docs/dkim.md's `greyrelay dkim keygen` lines in dir, as
// written, publishes each printed TXT record in dns and returns docs/dkim.md's
// dkim configuration with key_file paths made absolute in dir (the relay
// runs in a directory of its own).
func readmeDKIM(t *testing.T, dir string, dns *peers.DNS) map[string]any {
	t.Helper()
	blocks := recipeBlocks(t, "TestDKIMSignedMailVerifies")
	if len(blocks) != 3 || !strings.HasPrefix(blocks[0].Text, "greyrelay dkim keygen") || !strings.HasPrefix(blocks[1].Text, "dkim:") {
		t.Fatalf("docs/dkim.md's blocks for TestDKIMSignedMailVerifies: want dkim keygen, the dkim configuration and probe -from: %+v", blocks)
	}
	for _, line := range strings.Split(strings.TrimSpace(blocks[0].Text), "\n") {
		args := strings.Fields(line)[1:]
		res := runGreyrelay(t, dir, "", nil, args...)
		if res.Code != 0 {
			t.Fatalf("docs/dkim.md's %q: %s", line, res)
		}
		publishKey(t, dns, res.Stdout)
	}
	for _, f := range []string{"example.com.ed2026.key", "example.com.rsa2026.key"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("key file %s: %v, mode %v; want mode 0600", f, err, fi.Mode())
		}
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(blocks[1].Text), &cfg); err != nil {
		t.Fatal(err)
	}
	d := cfg["dkim"].(map[string]any)
	for _, dom := range d["domains"].(map[string]any) {
		for _, s := range dom.(map[string]any)["selectors"].([]any) {
			sel := s.(map[string]any)
			sel["key_file"] = filepath.Join(dir, sel["key_file"].(string))
		}
	}
	return d
}

var txtLine = regexp.MustCompile(`(?m)^(\S+)\. IN TXT \( (.*) \)$`)

// publishKey adds the TXT record `dkim keygen` printed to dns, joining its
// character-strings as a resolver does.
func publishKey(t *testing.T, dns *peers.DNS, out string) {
	t.Helper()
	m := txtLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no TXT record in keygen output:\n%s", out)
	}
	var rec strings.Builder
	for _, part := range regexp.MustCompile(`"([^"]*)"`).FindAllStringSubmatch(m[2], -1) {
		rec.WriteString(part[1])
	}
	dns.TXT(m[1], rec.String())
}

func yamlOf(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDKIMSignedMailVerifies: a message from example.com is signed with
// the Ed25519 and the RSA key; dkimpy verifies both at the MX (a sink) and
// after a real Postfix passed it on, and fails both when a signed header or
// the body is changed. A message from a domain without a key arrives
// unsigned.
func TestDKIMSignedMailVerifies(t *testing.T) {
	peers.Require(t, "swaks", "postfix", "dkimverify")
	t.Parallel()
	n := newMailNet(t)
	d := readmeDKIM(t, t.TempDir(), n.dns)
	sink := n.sink("sink.test", peers.SinkOptions{})
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	n.postfix("dest.test", peers.PostfixConfig{DeliverTo: final.Addr})
	r := n.relay("dkim=" + yamlOf(t, d))

	r.send(peers.SwaksMessage{From: "a@example.com", To: []string{"b@sink.test"}, Data: message("a@example.com", "b@sink.test", "signed")})
	got := sink.WaitFor(t, 1, 30*time.Second)[0].Data
	out, ok := peers.DKIMVerify(t, got, n.dns.Addr())
	if !ok || strings.Count(out, ": ok") != 2 || !strings.Contains(out, "a=ed25519-sha256") || !strings.Contains(out, "a=rsa-sha256") {
		t.Errorf("dkimpy at the MX: want two good signatures (Ed25519 and RSA):\n%s\nmessage:\n%s", out, head(got))
	}
	if !bytes.HasPrefix(got, []byte("DKIM-Signature: ")) || bytes.Index(got, []byte("Received: ")) < bytes.LastIndex(got, []byte("DKIM-Signature: ")) {
		t.Errorf("want the signatures above greyrelay's Received field:\n%s", head(got))
	}
	for name, alter := range map[string]func([]byte) []byte{
		"signed header": func(m []byte) []byte {
			return bytes.Replace(m, []byte("Subject: signed"), []byte("Subject: signeD"), 1)
		},
		"body": func(m []byte) []byte { return bytes.Replace(m, []byte("Hello,"), []byte("Hello!"), 1) },
		"added From": func(m []byte) []byte {
			return bytes.Replace(m, []byte("\r\nSubject: "), []byte("\r\nFrom: eve@evil.test\r\nSubject: "), 1)
		},
	} {
		if out, ok := peers.DKIMVerify(t, alter(bytes.Clone(got)), n.dns.Addr()); ok || strings.Contains(out, ": ok") {
			t.Errorf("dkimpy accepted the message with its %s changed:\n%s", name, out)
		}
	}

	r.send(peers.SwaksMessage{From: "a@example.com", To: []string{"b@dest.test"}, Data: message("a@example.com", "b@dest.test", "through postfix")})
	got = final.WaitFor(t, 1, 30*time.Second)[0].Data
	if out, ok := peers.DKIMVerify(t, got, n.dns.Addr()); !ok || strings.Count(out, ": ok") != 2 {
		t.Errorf("dkimpy after Postfix: want two good signatures:\n%s\nmessage:\n%s", out, head(got))
	}

	r.send(peers.SwaksMessage{From: "a@other.test", To: []string{"b@sink.test"}, Data: message("a@other.test", "b@sink.test", "unsigned")})
	got = sink.WaitFor(t, 2, 30*time.Second)[1].Data
	if bytes.Contains(got, []byte("DKIM-Signature:")) {
		t.Errorf("a message from a domain without a key was signed:\n%s", head(got))
	}

	// docs/dkim.md's probe line, as written, with the relay's configuration:
	// SPF, both keys and DMARC pass.
	n.dns.TXT("example.com", "v=spf1 ip4:"+r.IP+" -all").TXT("_dmarc.example.com", "v=DMARC1; p=reject")
	n.sink("example.net", peers.SinkOptions{})
	line, ok := strings.CutPrefix(strings.TrimSpace(recipeBlocks(t, "TestDKIMSignedMailVerifies")[2].Text), "greyrelay probe -from ")
	if !ok {
		t.Fatal("docs/dkim.md's third block for TestDKIMSignedMailVerifies is not `greyrelay probe -from`")
	}
	res := runGreyrelay(t, r.Dir, "", []string{"GREYRELAY_CONFIG=" + r.ConfigPath}, append([]string{"probe", "-from"}, strings.Fields(line)...)...)
	if res.Code != 0 || !strings.Contains(res.Stdout, "6. Sender authentication for example.com") ||
		!strings.Contains(res.Stdout, "): PASS") || strings.Count(res.Stdout, "published key matches") != 2 {
		t.Errorf("docs/dkim.md's probe -from: want exit 0 and every check passing:\n%s", res)
	}
}

// TestDKIMRefuseAndReload: with without_key: refuse a message from a
// domain without a key gets 550 5.7.1 at the end of DATA; after a new
// selector is added to the file and the relay gets SIGHUP, mail is signed
// with it; a configuration naming a missing key file is refused by
// `config check` with the key's name.
func TestDKIMRefuseAndReload(t *testing.T) {
	peers.Require(t, "swaks", "dkimverify")
	t.Parallel()
	n := newMailNet(t)
	keys := t.TempDir()
	for _, sel := range []string{"one", "two"} {
		res := runGreyrelay(t, keys, "", nil, "dkim", "keygen", "-algorithm", "ed25519", "example.com", sel)
		if res.Code != 0 {
			t.Fatal(res)
		}
		publishKey(t, n.dns, res.Stdout)
	}
	sink := n.sink("sink.test", peers.SinkOptions{})
	sel := func(name string) string {
		return "{selector: " + name + ", key_file: " + filepath.Join(keys, "example.com."+name+".key") + "}"
	}
	r := n.relay("dkim={without_key: refuse, domains: {example.com: {selectors: [" + sel("one") + "]}}}")

	out, code := peers.SwaksMessage{Server: r.SMTPAddr, From: "a@other.test", To: []string{"b@sink.test"},
		Data: message("a@other.test", "b@sink.test", "refused")}.Send(t)
	if code == 0 || !strings.Contains(out, "550 5.7.1 No DKIM key for the From domain other.test") {
		t.Errorf("without_key refuse: swaks exit %d:\n%s", code, out)
	}

	cfg, err := os.ReadFile(r.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	// The file is YAML the harness wrote: swap the selector and its key.
	cfg = bytes.Replace(cfg, []byte("selector: one"), []byte("selector: two"), 1)
	cfg = bytes.Replace(cfg, []byte("example.com.one.key"), []byte("example.com.two.key"), 1)
	if err := os.WriteFile(r.ConfigPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.Log(), "DKIM keys reloaded") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	r.send(peers.SwaksMessage{From: "a@example.com", To: []string{"b@sink.test"}, Data: message("a@example.com", "b@sink.test", "after reload")})
	got := sink.WaitFor(t, 1, 30*time.Second)[0].Data
	if out, ok := peers.DKIMVerify(t, got, n.dns.Addr()); !ok || !strings.Contains(out, "s=two") || strings.Contains(out, "s=one") {
		t.Errorf("after SIGHUP: want one good signature by selector two:\n%s", out)
	}

	// A key that does not load on SIGHUP leaves the keys in use.
	cfg = bytes.Replace(cfg, []byte("example.com.two.key"), []byte("example.com.gone.key"), 1)
	if err := os.WriteFile(r.ConfigPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(r.Log(), "DKIM keys unchanged") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(r.Log(), "example.com.gone.key") {
		t.Errorf("the failed reload does not name the key file:\n%s", r.Log())
	}
	r.send(peers.SwaksMessage{From: "a@example.com", To: []string{"b@sink.test"}, Data: message("a@example.com", "b@sink.test", "after failed reload")})
	got = sink.WaitFor(t, 2, 30*time.Second)[1].Data
	if out, ok := peers.DKIMVerify(t, got, n.dns.Addr()); !ok || !strings.Contains(out, "s=two") {
		t.Errorf("after a failed reload: want the selector two signature still:\n%s", out)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("dkim: {domains: {example.com: {selectors: [{selector: x, key_file: /nonexistent.key}]}}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res := runGreyrelay(t, t.TempDir(), "", nil, "config", "check", "-config", bad)
	if res.Code != 2 || !strings.Contains(res.Stderr, "dkim.domains.example.com.selectors[0].key_file") {
		t.Errorf("config check with a missing key: %s", res)
	}
}
