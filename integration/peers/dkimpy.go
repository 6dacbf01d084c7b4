package peers

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// dkimpyScript verifies every DKIM-Signature of the message on stdin with
// dkimpy (Debian python3-dkim), looking keys up in the DNS server given as
// host:port, as a receiving MTA would. It prints one line per signature
// and exits 0 only if there is at least one and all verify.
const dkimpyScript = `
import sys, dkim, dns.resolver
host, port = sys.argv[1].rsplit(":", 1)
res = dns.resolver.Resolver(configure=False)
res.nameservers, res.port = [host], int(port)
def txt(name, timeout=5):
    name = name.decode() if isinstance(name, bytes) else name
    try:
        ans = res.resolve(name, "TXT", lifetime=timeout)
    except Exception:
        return None
    for rr in ans:
        return b"".join(rr.strings)
msg = sys.stdin.buffer.read()
headers, _ = dkim.rfc822_parse(msg)
n = sum(1 for k, _ in headers if k.lower() == b"dkim-signature")
ok = n > 0
for i in range(n):
    d = dkim.DKIM(msg)
    good = d.verify(idx=i, dnsfunc=txt)
    tags = dkim.util.parse_tag_value(headers[[j for j, (k, _) in enumerate(headers) if k.lower() == b"dkim-signature"][i]][1])
    print("signature %d d=%s s=%s a=%s: %s" % (i, tags[b"d"].decode(), tags[b"s"].decode(), tags[b"a"].decode(), "ok" if good else "FAILED"))
    ok = ok and good
if n == 0:
    print("no DKIM-Signature")
sys.exit(0 if ok else 1)
`

// DKIMVerify verifies msg's DKIM signatures with dkimpy, an implementation
// independent of the relay's, fetching keys from the DNS server at
// dnsAddr. It returns dkimpy's report and whether every signature (at
// least one) verified.
func DKIMVerify(t testing.TB, msg []byte, dnsAddr string) (string, bool) {
	t.Helper()
	Require(t, "dkimverify")
	cmd := exec.Command(dkimpyPython(t), "-c", dkimpyScript, dnsAddr)
	cmd.Stdin = bytes.NewReader(msg)
	out, err := runBounded(cmd, 30*time.Second)
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("peers: dkimpy: %v\n%s", err, out)
		}
		return out, false
	}
	return out, true
}

// dkimpyPython is the interpreter python3-dkim is installed for: the one
// its dkimverify script names (a python3 earlier on PATH, e.g. pyenv's,
// may not have the module).
func dkimpyPython(t testing.TB) string {
	p := mustLookPath(t, "dkimverify")
	f, err := os.Open(p)
	if err != nil {
		t.Fatalf("peers: %v", err)
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	fields := strings.Fields(strings.TrimPrefix(line, "#!"))
	if len(fields) == 0 || !strings.HasPrefix(line, "#!") {
		t.Fatalf("peers: %s has no interpreter line", p)
	}
	if fields[0] == "/usr/bin/env" && len(fields) > 1 {
		return mustLookPath(t, fields[1])
	}
	return fields[0]
}
