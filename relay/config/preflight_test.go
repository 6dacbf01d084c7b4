package config

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// fakeHost binds nothing: inUse and missing list the addresses whose
// bind fails, and names the hostnames that resolve.
type fakeHost struct {
	inUse, missing map[string]bool
	names          map[string]bool
	bound          []string
}

func (f *fakeHost) host(as *Account) Host {
	return Host{
		Listen: func(network, addr string) (net.Listener, error) {
			f.bound = append(f.bound, addr)
			switch {
			case f.inUse[addr]:
				return nil, &net.OpError{Op: "listen", Net: network, Err: os.NewSyscallError("bind", syscall.EADDRINUSE)}
			case f.missing[addr]:
				return nil, &net.OpError{Op: "listen", Net: network, Err: os.NewSyscallError("bind", syscall.EADDRNOTAVAIL)}
			}
			return nopListener{}, nil
		},
		LookupHost: func(_ context.Context, h string) ([]string, error) {
			if f.names[h] {
				return []string{"192.0.2.1"}, nil
			}
			return nil, errors.New("no such host")
		},
		As: as,
	}
}

type nopListener struct{ net.Listener }

func (nopListener) Close() error { return nil }

// Preflight predicts serve: an address in use is a warning (the running
// relay), one that cannot be bound, a queue directory that cannot be
// written and a key the relay's user cannot read are errors at their
// line; a hostname that does not resolve is a warning.
func TestPreflight(t *testing.T) {
	dir := t.TempDir()
	// t.TempDir's directories are 0700: open them to other users, so that
	// only the files' own modes decide.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	key := filepath.Join(dir, "dkim.key")
	open := filepath.Join(dir, "open.pem")
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{{key, 0o600}, {open, 0o644}} {
		if err := os.WriteFile(f.path, []byte("x"), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f.path, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	roDir := filepath.Join(dir, "ro")
	if err := os.Mkdir(roDir, 0o755); err != nil {
		t.Fatal(err)
	}
	uid := os.Getuid()
	owner := &Account{Name: "owner", UID: uid}
	stranger := &Account{Name: "stranger", UID: uid + 4711, Groups: []int{4711}}
	dynamic := &Account{Name: "greyrelay", UID: -1}
	file := "hostname: relay.test\n" + // 1
		"listeners:\n" + // 2
		"  - address: 127.0.0.1:2525\n" + // 3
		"    tls_cert: " + open + "\n" + // 4
		"    tls_key: " + key + "\n" + // 5
		"  - address: 127.0.0.1:2526\n" + // 6
		"delivery:\n" + // 7
		"  source_ipv4: 192.0.2.10\n" + // 8
		"queue:\n" + // 9
		"  path: " + filepath.Join(roDir, "q", "queue.db") + "\n" // 10
	cases := []struct {
		name     string
		as       *Account
		errs     []string
		warnings []string
	}{
		{"as the owner", owner, []string{"test.yaml: line 8: delivery.source_ipv4: 192.0.2.10 is not bindable on this host"},
			[]string{"listeners[1].address: 127.0.0.1:2526 is in use (the relay running?)", `hostname: "relay.test" does not resolve`}},
		{"as another user", stranger, []string{
			"test.yaml: line 5: listeners[0].tls_key: " + key + " is not readable by user stranger (owner " + strconv.Itoa(uid),
			"test.yaml: line 10: queue.path: " + filepath.Join(roDir, "q", "queue.db") + ": user stranger may not write in directory " + roDir,
		}, nil},
		{"as a DynamicUser", dynamic, []string{"line 5: listeners[0].tls_key: " + key + " is not readable by user greyrelay",
			"LoadCredential="}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, file, nil)
			if err != nil {
				t.Fatal(err)
			}
			f := &fakeHost{inUse: map[string]bool{"127.0.0.1:2526": true}, missing: map[string]bool{"192.0.2.10:0": true}}
			warnings, err := c.Preflight(context.Background(), f.host(tc.as))
			got := ""
			if err != nil {
				got = err.Error()
			}
			for _, w := range tc.errs {
				if !strings.Contains(got, w) {
					t.Errorf("errors lack %q:\n%s", w, got)
				}
			}
			if strings.Contains(got, "tls_cert") {
				t.Errorf("a world-readable certificate refused:\n%s", got)
			}
			for _, w := range tc.warnings {
				if !strings.Contains(strings.Join(warnings, "\n"), w) {
					t.Errorf("warnings lack %q: %q", w, warnings)
				}
			}
			if strings.Contains(got, "2526") {
				t.Errorf("an address in use is an error, want a warning:\n%s", got)
			}
			if want := []string{"127.0.0.1:2525", "127.0.0.1:2526", "127.0.0.1:8025", "192.0.2.10:0"}; strings.Join(f.bound, " ") != strings.Join(want, " ") {
				t.Errorf("bound %q, want %q", f.bound, want)
			}
		})
	}
	// A resolving hostname and bindable addresses: nothing to say.
	c, err := load(t, "hostname: relay.test\nqueue:\n  path: "+filepath.Join(dir, "queue.db")+"\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeHost{names: map[string]bool{"relay.test": true}}
	if warnings, err := c.Preflight(context.Background(), f.host(nil)); err != nil || len(warnings) > 0 {
		t.Errorf("clean configuration: warnings %q, err %v", warnings, err)
	}
}

// LookupAccount: a known user has its uid and groups; an unknown name is
// a DynamicUser (no uid of its own); an unknown number is that uid.
func TestLookupAccount(t *testing.T) {
	root, err := LookupAccount("root")
	if err != nil || root.UID != 0 || len(root.Groups) == 0 || root.Groups[0] != 0 || root.Note() != "" {
		t.Errorf("root: %+v, %v", root, err)
	}
	dyn, err := LookupAccount("greyrelay-no-such-user")
	if err != nil || dyn.UID != -1 || !strings.Contains(dyn.Note(), "DynamicUser") {
		t.Errorf("unknown name: %+v, %v", dyn, err)
	}
	num, err := LookupAccount("65532")
	if err != nil || num.UID != 65532 || len(num.Groups) != 0 {
		t.Errorf("unknown number: %+v, %v", num, err)
	}
}
