package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/relay/dkim"
)

// keygen writes a key that dkim.ReadKey accepts with mode 0600, prints a
// record whose strings join to the key's record, never overwrites a key,
// and refuses bad arguments with exit status 2.
func TestDKIMKeygen(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ alg, want string }{{"ed25519", dkim.Ed25519SHA256}, {"rsa2048", dkim.RSASHA256}} {
		path := filepath.Join(dir, tc.alg+".key")
		out, _, err := runCmd(t, "", "dkim", "keygen", "example.com", "s1", "-algorithm", tc.alg, "-out", path)
		if err != nil {
			t.Fatalf("%s: %v", tc.alg, err)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", tc.alg, err, fi)
		}
		k, err := dkim.ReadKey(path, tc.want)
		if err != nil {
			t.Fatal(err)
		}
		line := out[strings.Index(out, "s1._domainkey.example.com. IN TXT ( "):]
		line = line[:strings.IndexByte(line, '\n')]
		var rec strings.Builder
		for _, part := range strings.Split(line, `"`)[1:] {
			if !strings.HasPrefix(part, " ") {
				rec.WriteString(part)
			}
		}
		if rec.String() != dkim.Record(k.Public()) {
			t.Errorf("%s: printed record %q, want %q", tc.alg, rec.String(), dkim.Record(k.Public()))
		}
		for _, s := range strings.Split(line, `"`) {
			if len(s) > 255 {
				t.Errorf("%s: character-string of %d octets", tc.alg, len(s))
			}
		}
		// A DNS provider's web form takes the value as one string.
		web := "; or, in a DNS provider's web form: name s1._domainkey, type TXT, and as\n; value this one line (no quotes):\n" +
			dkim.Record(k.Public()) + "\n"
		if !strings.Contains(out, web) {
			t.Errorf("%s: no one-line value for a web form (%q):\n%s", tc.alg, web, out)
		}
		if _, _, err := runCmd(t, "", "dkim", "keygen", "-out", path, "example.com", "s1"); exitCode(err) == 0 {
			t.Errorf("%s: keygen overwrote an existing key", tc.alg)
		}
	}
	for _, args := range [][]string{
		{"dkim"}, {"dkim", "keygen", "example.com"}, {"dkim", "keygen", "-algorithm", "dsa", "example.com", "s1"},
		{"dkim", "keygen", "[127.0.0.1]", "s1"}, {"dkim", "keygen", "example.com", "bad selector"},
	} {
		if _, _, err := runCmd(t, "", args...); exitCode(err) != 2 {
			t.Errorf("%v: exit %d (%v), want 2", args, exitCode(err), err)
		}
	}
}

// A domain typed with U-labels, capitals or a final dot gets its key and
// record under the canonical A-label name, the one DNS is asked for.
func TestDKIMKeygen_CanonicalDomain(t *testing.T) {
	dir := t.TempDir()
	for i, d := range []string{"Bücher.test.", "XN--BCHER-KVA.test"} {
		path := filepath.Join(dir, strconv.Itoa(i)+".key")
		out, _, err := runCmd(t, "", "dkim", "keygen", "-algorithm", "ed25519", "-out", path, d, "s1")
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if !strings.Contains(out, "s1._domainkey.xn--bcher-kva.test. IN TXT ( ") {
			t.Errorf("%s: record not under the A-label name:\n%s", d, out)
		}
	}
}
