package admincli

import (
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/relay/admin"
)

// TestCLIBulkSelections: the filters select, combine and count in a dry
// run; a value no recipient can have is refused with the valid ones.
func TestCLIBulkSelections(t *testing.T) {
	_, c := cliFixture(t, func(o *admin.Options) { o.Engine = nil })
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"hold", "-dry-run", "-domain", "GREYLIST.test."}, "hold (dry run): 2 recipient(s) would change; nothing was changed"},
		{[]string{"hold", "-dry-run", "-status", "deferred", "-reason", "greylisted"}, "would change"},
		{[]string{"delete", "-dry-run", "-sender", "<>"}, "delete (dry run): 1 recipient(s) would change"},
		{[]string{"requeue", "-dry-run", "-older-than", "1h"}, "requeue (dry run): "},
		{[]string{"hold", "-domain", "nowhere.test"}, "greyrelay destinations suspend nowhere.test"},
		{[]string{"hold", "-status", "deferred", "-domain", "greylist.test"}, "hold: 2 recipient(s) changed"},
		{[]string{"release", "-status", "held", "-dry-run"}, "release (dry run): 3 recipient(s) would change"},
	}
	for _, tt := range tests {
		out, err := runQueue(c, tt.args...)
		if err != nil || !strings.Contains(out, tt.want) {
			t.Errorf("%v: %v %q, want %q", tt.args, err, out, tt.want)
		}
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"hold", "-reason", "greylist"}, "want one of greylisted, "},
		{[]string{"delete", "-status", "defered"}, "want one of queued, deferred, active, held, delivered, relayed, failed"},
		{[]string{"list", "-status", "bogus"}, "want one of queued"},
		{[]string{"hold", "-older-than", "2x"}, "older-than"},
		{[]string{"hold", "-older-than", "0s", "-domain", "a.test"}, "not a positive duration"},
		{[]string{"hold"}, "give an ID, a selection"},
		{[]string{"hold", "-all", "-status", "held"}, "takes no ID or other selection"},
		{[]string{"frobnicate", "-all"}, "unknown subcommand"},
	} {
		if _, err := runQueue(c, tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want an error with %q", tt.args, err, tt.want)
		}
	}
	if out, err := runQueue(c, "list", "-older-than", "2d"); err != nil || !strings.Contains(out, "no recipients match") {
		t.Errorf("list -older-than 2d: %v %q", err, out)
	}
}

// TestCLISuspendResume: suspend and resume print what they did; the
// suspension shows in destinations and in the next-attempt column.
func TestCLISuspendResume(t *testing.T) {
	_, c := cliFixture(t)
	run := func(args ...string) (string, error) {
		var out strings.Builder
		err := RunDestinations(args, c, &out, &out)
		return out.String(), err
	}
	if out, err := run("suspend", "-reason", "migration", "Greylist.Test"); err != nil ||
		!strings.Contains(out, "delivery to greylist.test stops until `greyrelay destinations resume greylist.test`") {
		t.Fatalf("suspend: %v %q", err, out)
	}
	if out, err := run("greylist.test"); err != nil || !strings.Contains(out, "suspended until resumed (migration)") {
		t.Errorf("destinations greylist.test: %v %q", err, out)
	}
	if out, err := runQueue(c, "list", "-domain", "greylist.test"); err != nil || !strings.Contains(out, "suspended until resumed") {
		t.Errorf("queue list: %v %q", err, out)
	}
	if out, err := run("suspend", "-for", "2h", "fresh.test"); err != nil || !strings.Contains(out, "stops until 20") {
		t.Errorf("suspend -for: %v %q", err, out)
	}
	if out, err := run("fresh.test"); err != nil || !strings.Contains(out, "suspended, resumes in 2h") {
		t.Errorf("a domain suspended before anything was learned: %v %q", err, out)
	}
	if out, err := run("resume", "greylist.test"); err != nil || !strings.Contains(out, "resume: delivery to greylist.test goes on; 2 recipient(s) made due") {
		t.Errorf("resume: %v %q", err, out)
	}
	if out, err := run("resume", "greylist.test"); err != nil || !strings.Contains(out, "was not suspended") {
		t.Errorf("resume twice: %v %q", err, out)
	}
	for _, args := range [][]string{{"suspend"}, {"suspend", "a.test", "b.test"}, {"suspend", "-for", "-1h", "a.test"},
		{"suspend", "[192.0.2.1]"}, {"resume"}} {
		if _, err := run(args...); err == nil {
			t.Errorf("destinations %v: no error", args)
		}
	}
}
