package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/relay/smtpd"
)

func runCmd(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(args, strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), err
}

func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if err != nil {
		return 1
	}
	return 0
}

func TestCommands(t *testing.T) {
	t.Setenv("GREYRELAY_CONFIG", "")
	cases := []struct {
		name     string
		args     []string
		stdin    string
		wantCode int
		wantOut  string
	}{
		{"version", []string{"version"}, "", 0, "greyrelay "},
		{"help", []string{"help"}, "", 0, "greyrelay config check"},
		{"unknown", []string{"frobnicate"}, "", 2, ""},
		{"config without subcommand", []string{"config"}, "", 2, ""},
		{"config check default", []string{"config", "check"}, "", 0, "(embedded default): configuration is valid"},
		{"config check missing file", []string{"config", "check", "-config", "/nonexistent.yaml"}, "", 2, ""},
		{"user add without password", []string{"user", "add", "alice"}, "", 2, ""},
		{"user add", []string{"user", "add", "alice", "-sender", "a@example.com"}, "pw\n", 0, "alice:$2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runCmd(t, tc.stdin, tc.args...)
			if got := exitCode(err); got != tc.wantCode {
				t.Fatalf("exit %d (%v), want %d", got, err, tc.wantCode)
			}
			if !strings.Contains(out, tc.wantOut) {
				t.Errorf("output %q does not contain %q", out, tc.wantOut)
			}
		})
	}
}

func TestConfigDefaultPrintsEmbeddedFile(t *testing.T) {
	out, _, err := runCmd(t, "", "config", "default")
	if err != nil || out != string(configs.Default) {
		t.Fatalf("config default: err %v, output differs from configs/default.yaml", err)
	}
}

// The line `user add` prints must authenticate with the same password.
func TestUserAddLineAuthenticates(t *testing.T) {
	out, _, err := runCmd(t, "s3cret pass\n", "user", "add", "bob")
	if err != nil {
		t.Fatal(err)
	}
	users, err := smtpd.ParseUsers(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := users.Authenticate("bob", "s3cret pass"); !ok {
		t.Error("the printed line does not authenticate bob")
	}
	if ok, _ := users.Authenticate("bob", "wrong"); ok {
		t.Error("a wrong password authenticates")
	}
}
