package peers

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Zone is one authoritative zone for StartDNSSEC.
type Zone struct {
	Name    string   // "dane.test"
	Records []string // zone file lines without SOA and NS ("mx A 127.0.0.20")
	Signed  bool     // sign with ldns-signzone and make Unbound trust its key
	// Forge names records whose data is changed after signing (the last
	// digit or lower-case letter), so their signature no longer
	// verifies: Unbound answers SERVFAIL for them.
	Forge []string // owner names relative to the zone ("_25._tcp.mx")
}

// DNSSEC is an authoritative NSD serving test zones, some signed with
// ldns-signzone, behind a validating Unbound whose trust anchors are the
// signed zones' keys. Point the relay at Resolver.
type DNSSEC struct {
	Resolver string // Unbound's host:port
	Auth     string // NSD's host:port
}

// StartDNSSEC starts NSD on authIP and Unbound on resolverIP (free ports)
// for zones, in a t.TempDir(), and stops them in t.Cleanup.
func StartDNSSEC(t testing.TB, authIP, resolverIP string, zones ...Zone) *DNSSEC {
	t.Helper()
	Require(t, "nsd", "unbound", "ldns-keygen", "ldns-signzone")
	dir := t.TempDir()
	traversable(t, dir)
	d := &DNSSEC{Auth: FreeAddr(t, authIP), Resolver: FreeAddr(t, resolverIP)}
	var nsdZones, stubs, anchors, local strings.Builder
	for _, z := range zones {
		file := writeZone(t, dir, z)
		fmt.Fprintf(&nsdZones, "zone:\n  name: %q\n  zonefile: %q\n", z.Name, file)
		host, port, _ := net.SplitHostPort(d.Auth)
		fmt.Fprintf(&stubs, "stub-zone:\n  name: %q\n  stub-addr: %s@%s\n", z.Name, host, port)
		fmt.Fprintf(&local, "  local-zone: %q transparent\n", z.Name)
		if z.Signed {
			fmt.Fprintf(&anchors, "  trust-anchor-file: %q\n", filepath.Join(dir, z.Name+".ksk.key"))
		} else {
			fmt.Fprintf(&anchors, "  domain-insecure: %q\n", z.Name)
		}
	}
	host, port, _ := net.SplitHostPort(d.Auth)
	nsdConf := fmt.Sprintf(`server:
  ip-address: %s@%s
  username: ""
  database: ""
  zonesdir: %q
  pidfile: %q
  zonelistfile: %q
  xfrdfile: %q
  logfile: %q
  verbosity: 1
remote-control:
  control-enable: no
%s`, host, port, dir, filepath.Join(dir, "nsd.pid"), filepath.Join(dir, "zone.list"),
		filepath.Join(dir, "xfrd.state"), filepath.Join(dir, "nsd.log"), nsdZones.String())
	rhost, rport, _ := net.SplitHostPort(d.Resolver)
	// "local-zone: test. nodefault": Unbound answers the special-use
	// "test." itself otherwise (RFC 6761), empty and without AD.
	// "local-zone: . always_refuse" with each stubbed zone transparent:
	// a name outside the zones (a sender's domain a bounce goes to) is
	// refused at once instead of being sent to the root servers, so no
	// query leaves loopback and none waits out a timeout.
	unboundConf := fmt.Sprintf(`server:
  interface: %s@%s
  port: %s
  username: ""
  chroot: ""
  directory: %q
  pidfile: %q
  use-syslog: no
  logfile: %q
  do-not-query-localhost: no
  access-control: 127.0.0.0/8 allow
  local-zone: "test." nodefault
  local-zone: "." always_refuse
%s  module-config: "validator iterator"
  val-log-level: 2
%s%sremote-control:
  control-enable: no
`, rhost, rport, rport, dir, filepath.Join(dir, "unbound.pid"), filepath.Join(dir, "unbound.log"), local.String(), anchors.String(), stubs.String())
	for name, text := range map[string]string{"nsd.conf": nsdConf, "unbound.conf": unboundConf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatalf("peers: %v", err)
		}
	}
	for _, c := range []struct{ bin, conf string }{{"nsd", "nsd.conf"}, {"unbound", "unbound.conf"}} {
		cmd := exec.Command(mustLookPath(t, c.bin), "-d", "-c", filepath.Join(dir, c.conf))
		cmd.Dir = dir
		p, err := startProc(cmd, filepath.Join(dir, c.bin+".out"))
		if err != nil {
			t.Fatalf("peers: %v", err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				for _, f := range []string{c.bin + ".out", c.bin + ".log"} {
					b, _ := os.ReadFile(filepath.Join(dir, f))
					t.Logf("peers: %s:\n%s", f, tail(string(b), 40))
				}
			}
			_ = p.stop(5 * time.Second)
		})
	}
	// Ready when Unbound answers, through NSD, for the first zone.
	err := poll(readyTimeout, func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(zones[0].Name), dns.TypeSOA)
		r, err := dns.Exchange(m, d.Resolver)
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			return fmt.Errorf("SOA %s: %s", zones[0].Name, dns.RcodeToString[r.Rcode])
		}
		return nil
	})
	if err != nil {
		t.Fatalf("peers: DNSSEC resolver not ready: %v", err)
	}
	return d
}

// writeZone writes z's zone file, signed if asked, and returns its path.
func writeZone(t testing.TB, dir string, z Zone) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "$ORIGIN %s.\n$TTL 60\n@ SOA ns hostmaster 1 3600 600 86400 60\n@ NS ns\nns A 127.0.0.1\n", z.Name)
	for _, r := range z.Records {
		b.WriteString(r + "\n")
	}
	file := filepath.Join(dir, z.Name+".zone")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatalf("peers: %v", err)
	}
	if !z.Signed {
		return file
	}
	run := func(args ...string) string {
		cmd := exec.Command(mustLookPath(t, args[0]), args[1:]...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("peers: %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	ksk := run("ldns-keygen", "-a", "ECDSAP256SHA256", "-k", z.Name)
	zsk := run("ldns-keygen", "-a", "ECDSAP256SHA256", z.Name)
	if err := os.Rename(filepath.Join(dir, ksk+".key"), filepath.Join(dir, z.Name+".ksk.key")); err != nil {
		t.Fatalf("peers: %v", err)
	}
	if err := os.Link(filepath.Join(dir, z.Name+".ksk.key"), filepath.Join(dir, ksk+".key")); err != nil {
		t.Fatalf("peers: %v", err)
	}
	run("ldns-signzone", file, ksk, zsk)
	signed := file + ".signed"
	if len(z.Forge) > 0 {
		forge(t, signed, z)
	}
	return signed
}

// forge changes the last digit or lower-case letter of the data of z.Forge's non-RRSIG
// records in the signed file.
func forge(t testing.TB, path string, z Zone) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("peers: %v", err)
	}
	lines := strings.Split(string(b), "\n")
	n := 0
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) < 4 || f[3] == "RRSIG" || f[3] == "NSEC" {
			continue
		}
		for _, name := range z.Forge {
			if strings.EqualFold(f[0], name+"."+z.Name+".") {
				k := strings.LastIndexFunc(l, func(r rune) bool { return r >= '0' && r <= '9' || r >= 'a' && r <= 'z' })
				repl := "0"
				if l[k] == '0' {
					repl = "1"
				}
				lines[i] = l[:k] + repl + l[k+1:]
				n++
			}
		}
	}
	if n == 0 {
		t.Fatalf("peers: forge: no record of %v in %s", z.Forge, path)
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatalf("peers: %v", err)
	}
}
