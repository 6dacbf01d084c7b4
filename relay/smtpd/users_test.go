package smtpd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

func TestUsers_ParseErrors(t *testing.T) {
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	hash := string(h)
	tests := []struct{ in, want string }{
		{"alice", "line 1"},
		{"alice:notahash", "not a bcrypt hash"},
		{":" + hash, "user name"},
		{"al ice:" + hash, "user name"},
		{"alice:" + hash + "\nalice:" + hash, "line 2: user \"alice\" listed twice"},
		{"alice:" + hash + ":bad..sender@x", "allowed sender"},
		{"alice:" + hash + ":@-bad.example", "allowed sender"},
		{"alice:" + hash + ":a%b@x.example", "allowed sender"},
	}
	for _, tc := range tests {
		_, err := ParseUsers(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseUsers(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestUsers_Authenticate(t *testing.T) {
	u := testUsers(t)
	for _, tc := range []struct {
		name, pw string
		ok       bool
	}{
		{"alice", "alice-pw", true},
		{"alice", "wrong", false},
		{"Alice", "alice-pw", false},
		{"nobody", "alice-pw", false},
		{"", "", false},
		{"alice", strings.Repeat("x", 100), false},
	} {
		if ok, _ := u.Authenticate(tc.name, tc.pw); ok != tc.ok {
			t.Errorf("Authenticate(%q, %q) = %v", tc.name, tc.pw, ok)
		}
	}
	ok, allowed := u.Authenticate("bob", "bob-pw")
	if !ok || strings.Join(allowed, ",") != "bob@example.com,@corp.example" {
		t.Errorf("bob: %v %q", ok, allowed)
	}
}

// TestUserLine checks that a generated line loads and authenticates, with
// its allowed senders normalised. The hash uses bcrypt's minimum cost to
// keep the test fast; UserLine itself uses bcrypt.DefaultCost.
func TestUserLine(t *testing.T) {
	line, err := userLine("carol", "s3cret", []string{"Carol@Example.COM", "@Corp.Example", "<>"}, bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(line, "s3cret") {
		t.Fatal("password in the line")
	}
	path := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(path, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := LoadUsers(path)
	if err != nil {
		t.Fatal(err)
	}
	ok, allowed := u.Authenticate("carol", "s3cret")
	if !ok || strings.Join(allowed, ",") != "Carol@example.com,@corp.example,<>" {
		t.Errorf("%v %q", ok, allowed)
	}
	for _, bad := range []struct {
		name, pw string
		senders  []string
	}{
		{"a:b", "pw", nil},
		{"a\nb", "pw", nil},
		{"ok", "", nil},
		{"ok", strings.Repeat("p", 73), nil},
		{"ok", "pw", []string{"not an address"}},
	} {
		if _, err := UserLine(bad.name, bad.pw, bad.senders); err == nil {
			t.Errorf("UserLine(%q, %d octets, %q) accepted", bad.name, len(bad.pw), bad.senders)
		}
	}
	if _, err := LoadUsers(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing file accepted")
	}
}
