package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
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
	clearEnv(t)
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

// clearEnv removes GREYRELAY_ variables (CI sets some for the test
// harness) for the test's duration: the commands refuse unknown ones.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "GREYRELAY_") {
			t.Setenv(name, "") // restored after the test
			os.Unsetenv(name)
		}
	}
}

func TestHelpListsEveryCommand(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "help"} {
		out, _, err := runCmd(t, "", arg)
		if err != nil {
			t.Fatalf("%s: %v", arg, err)
		}
		for _, cmd := range []string{"serve", "config check", "config default", "user add", "queue list", "queue show",
			"queue shape", "destinations", "destinations forget", "probe", "dkim keygen", "health", "version"} {
			if !strings.Contains(out, "greyrelay "+cmd) && !strings.Contains(out, "greyrelay ["+cmd) {
				t.Errorf("%s: the command list lacks %q:\n%s", arg, cmd, out)
			}
		}
	}
}

func TestConfigFlagAnywhere(t *testing.T) {
	cases := []struct{ in, want []string }{
		{[]string{"queue", "list", "-json", "-config", "F"}, []string{"queue", "-config", "F", "list", "-json"}},
		{[]string{"queue", "-config", "F", "list"}, []string{"queue", "-config", "F", "list"}},
		{[]string{"queue", "salvage", "-config", "F"}, []string{"queue", "salvage", "-config", "F"}},
		{[]string{"queue", "-config", "F", "salvage"}, []string{"queue", "salvage", "-config", "F"}},
		{[]string{"-config=F", "queue", "show", "X"}, []string{"queue", "-config", "F", "show", "X"}},
		{[]string{"destinations", "forget", "--config", "F", "-all"}, []string{"destinations", "-config", "F", "forget", "-all"}},
		{[]string{"config", "check", "-config", "F"}, []string{"config", "check", "-config", "F"}},
		{[]string{"-check-queue", "-config", "F"}, []string{"-config", "F", "-check-queue"}},
		{[]string{"serve", "-config", "F"}, []string{"serve", "-config", "F"}},
		{[]string{"health", "--config=F"}, []string{"health", "-config", "F"}},
		{[]string{"user", "add", "bob", "-config", "F"}, []string{"user", "add", "bob"}},
		{[]string{"queue", "list", "-sender", "x", "--", "-config", "F"}, []string{"queue", "list", "-sender", "x", "--", "-config", "F"}},
		{[]string{"queue", "list"}, []string{"queue", "list"}},
	}
	for _, tc := range cases {
		if got := configFirst(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("configFirst(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// config check reads the file, the environment and validates, and reports
// everything it found in one run; warnings do not make it fail.
func TestConfigCheckReportsEverything(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("hostnme: x\nretry:\n  lifetime: 5 minutes\nlimits:\n  max_connections: 0\n"), 0o600)
	t.Setenv("GREYRELAY_RETRY_INITAL_INTERVAL", "1s")
	_, _, err := runCmd(t, "", "config", "check", "-config", bad)
	if exitCode(err) != 2 {
		t.Fatalf("exit %d, want 2: %v", exitCode(err), err)
	}
	for _, want := range []string{"line 1: unknown key hostnme (did you mean hostname?)", "line 3 (key retry.lifetime)",
		"GREYRELAY_RETRY_INITAL_INTERVAL", "limits.max_connections"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	os.Unsetenv("GREYRELAY_RETRY_INITAL_INTERVAL")
	warn := filepath.Join(dir, "warn.yaml")
	os.WriteFile(warn, []byte("listeners:\n  - {address: 0.0.0.0:2525, mode: smtp}\nretry:\n  lifetime: 2h\n"), 0o600)
	out, errOut, err := runCmd(t, "", "config", "check", warn)
	if err != nil || !strings.Contains(out, "configuration is valid") ||
		!strings.Contains(errOut, "warning: listeners[0]: 0.0.0.0:2525 accepts connections from other hosts") ||
		!strings.Contains(errOut, "warning: retry.delay_warnings: 4h0m0s is not before retry.lifetime") {
		t.Errorf("warnings: err %v\nstdout %s\nstderr %s", err, out, errOut)
	}
}

// Every command finds the configuration the same way: -config, else
// $GREYRELAY_CONFIG (empty: the embedded default), else the default path
// when it exists, else the embedded default; and says which.
func TestChooseConfig(t *testing.T) {
	cases := []struct {
		name        string
		flag        string
		env         map[string]string
		etcExists   bool
		path, saids string
	}{
		{"flag", "f.yaml", map[string]string{"GREYRELAY_CONFIG": "e.yaml"}, true, "f.yaml", "using configuration f.yaml (-config)"},
		{"environment", "", map[string]string{"GREYRELAY_CONFIG": "e.yaml"}, true, "e.yaml", "using configuration e.yaml ($GREYRELAY_CONFIG)"},
		{"empty environment", "", map[string]string{"GREYRELAY_CONFIG": ""}, true, "", "using the embedded default configuration ($GREYRELAY_CONFIG is empty)"},
		{"default path", "", nil, true, defaultConfigPath, "using configuration /etc/greyrelay/greyrelay.yaml (the default path)"},
		{"embedded", "", nil, false, "", "using the embedded default configuration (no -config, no $GREYRELAY_CONFIG, no /etc/greyrelay/greyrelay.yaml)"},
	}
	for _, tc := range cases {
		lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
		exists := func(p string) bool { return tc.etcExists && p == defaultConfigPath }
		got := chooseConfig(tc.flag, lookup, exists)
		if got.path != tc.path || got.String() != tc.saids {
			t.Errorf("%s: path %q, says %q; want %q, %q", tc.name, got.path, got.String(), tc.path, tc.saids)
		}
	}
}
