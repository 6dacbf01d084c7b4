package admincli

import (
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

func TestCLIQueueShowContent(t *testing.T) {
	f, c := cliFixture(t)
	m := queue.NewMessage{From: "a@example.org", Arrival: testNow,
		To:   []queue.NewRecipient{{Addr: "x@new.test", Domain: "new.test"}},
		Body: []byte("Subject: \x1b[31mred\r\nX-Bare: a\rb\r\n\r\nline 1\r\nline 2\r\n")}
	id, err := f.q.Enqueue(m)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args         []string
		stdout, note string
	}{
		{[]string{"show", "-headers", id.String()}, "Subject: ?[31mred\nX-Bare: a?b\n", ""},
		{[]string{"show", id.String() + "/0", "-body"}, "line 1\nline 2\n", ""},
		{[]string{"show", "-headers", "-body", id.String()}, "Subject: ?[31mred\nX-Bare: a?b\n\nline 1\nline 2\n", ""},
		{[]string{"show", "-body", "-max", "4", id.String()}, "line", "showed the first 4 of 16 octets"},
		{[]string{"show", "-headers", "-body", "-raw", id.String()}, string(m.Body), ""},
	}
	for _, tc := range tests {
		var out, errOut strings.Builder
		if err := RunQueue(tc.args, c, &out, &errOut); err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if out.String() != tc.stdout {
			t.Errorf("%v: stdout %q, want %q", tc.args, out.String(), tc.stdout)
		}
		if !strings.Contains(errOut.String(), tc.note) || (tc.note == "" && errOut.Len() > 0) {
			t.Errorf("%v: stderr %q, want %q", tc.args, errOut.String(), tc.note)
		}
	}
	for _, args := range [][]string{{"show", "-body", "-max", "0", id.String()}, {"show", "-body", "-json", id.String()},
		{"show", "-body", "ffffff"}} {
		if _, err := runQueue(c, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestCLIQueueShowFinished(t *testing.T) {
	f, c := cliFixture(t)
	finishKeys(t, f.q, testNow.Add(-time.Hour), queue.Failed, "no-such-user", noSuchUser, queue.Key{ID: f.m3})
	out, err := runQueue(c, "show", f.m3.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"finished", "no longer in the queue", "failed (no-such-user)", "550 5.1.1 no such user"} {
		if !strings.Contains(out, want) {
			t.Errorf("queue show lacks %q:\n%s", want, out)
		}
	}
	out, err = runQueue(c, "list", "-status", "failed")
	if err != nil || !strings.Contains(out, f.m3.String()+"/0") || !strings.Contains(out, "recipients 1-1 of 1") {
		t.Errorf("queue list -status failed: %v\n%s", err, out)
	}
}

func TestCLIQueueShape(t *testing.T) {
	_, c := cliFixture(t)
	out, err := runQueue(c, "shape")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("want a header, TOTAL and 3 rows:\n%s", out)
	}
	if f := strings.Fields(lines[0]); strings.Join(f, " ") != "T 5 10 20 40 80 160 320 640 1280 1280+" {
		t.Errorf("header %q", lines[0])
	}
	if f := strings.Fields(lines[1]); strings.Join(f, " ") != "TOTAL 5 0 0 0 1 1 3 0 0 0 0" {
		t.Errorf("total %q", lines[1])
	}
	if f := strings.Fields(lines[2]); strings.Join(f, " ") != "greylist.test 3 0 0 0 1 0 2 0 0 0 0" {
		t.Errorf("first row %q", lines[2])
	}
	if len(lines[0]) != len(lines[2]) {
		t.Errorf("columns not aligned:\n%s", out)
	}
	out, err = runQueue(c, "shape", "-by", "reason", "-limit", "1")
	if err != nil || !strings.Contains(out, "greylisted") || !strings.Contains(out, "(2 more rows") {
		t.Errorf("by reason: %v\n%s", err, out)
	}
	out, err = runQueue(c, "shape", "-json")
	if err != nil || !strings.Contains(out, `"bucket_minutes"`) {
		t.Errorf("-json: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"shape", "-by", "sender"}, {"shape", "extra"}, {"shape", "-limit", "0"}} {
		if _, err := runQueue(c, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
