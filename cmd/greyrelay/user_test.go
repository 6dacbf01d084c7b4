package main

import (
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/relay/smtpd"
)

// `user add NAME [SENDER...]`: the senders after the name become the
// line's allowed senders, normalised, with -sender still accepted.
func TestUserAddSenders(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // the line's sender field
	}{
		{[]string{"carol", "Carol@Example.COM", "*@Corp.Example", "<>"}, "Carol@example.com,@corp.example,<>"},
		{[]string{"carol", "a@example.com", "-sender", "b@example.com,c@example.com", "@d.example"},
			"a@example.com,@d.example,b@example.com,c@example.com"},
		{[]string{"carol"}, ""},
	} {
		out, _, err := runCmd(t, "pw\n", append([]string{"user", "add"}, tc.args...)...)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		line := strings.TrimSpace(out)
		fields := strings.SplitN(line, ":", 3)
		got := ""
		if len(fields) == 3 {
			got = fields[2]
		}
		if fields[0] != "carol" || got != tc.want {
			t.Errorf("%q: printed %q, want senders %q", tc.args, line, tc.want)
		}
		users, err := smtpd.ParseUsers(strings.NewReader(out))
		if err != nil {
			t.Fatal(err)
		}
		if ok, allowed := users.Authenticate("carol", "pw"); !ok || strings.Join(allowed, ",") != tc.want {
			t.Errorf("%q: the line authenticates %v with senders %q", tc.args, ok, allowed)
		}
	}
	for _, bad := range [][]string{{"carol", "not an address"}, {"carol", "*@"}, {"carol", "-nosuchflag"}} {
		if _, _, err := runCmd(t, "pw\n", append([]string{"user", "add"}, bad...)...); exitCode(err) != 2 {
			t.Errorf("%q: exit %d (%v), want 2", bad, exitCode(err), err)
		}
	}
}
