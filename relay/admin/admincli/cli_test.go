package admincli

import (
	"encoding/json"
	"errors"
	"flag"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
	"github.com/greyrelay/greyrelay/relay/admin/admintest"
	"github.com/greyrelay/greyrelay/relay/config"
)

func runQueue(c *adminclient.Client, args ...string) (string, error) {
	var out, errOut strings.Builder
	err := RunQueue(args, c, &out, &errOut)
	return out.String(), err
}

func TestCLIQueueListTable(t *testing.T) {
	f, c := cliFixture(t)
	out, err := runQueue(c, "list")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 7 { // header, 5 rows, footer
		t.Fatalf("want 7 lines, got:\n%s", out)
	}
	for _, want := range []string{"QUEUE ID", "STATUS", "REASON", "NEXT", "SOURCE IP", "MX", "LAST REPLY"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("header lacks %q: %s", want, lines[0])
		}
	}
	row := lines[1]
	for _, want := range []string{f.m1.String() + "/0", "deferred", "greylisted", "in 4m", "2h",
		"alice@example.org", "bob@greylist.test", "192.0.2.10", "mx.peer.test", "451 4.7.1 Greylisted"} {
		if !strings.Contains(row, want) {
			t.Errorf("row lacks %q: %s", want, row)
		}
	}
	if !strings.Contains(lines[3], "<>") || !strings.Contains(lines[3], "rate-limited") {
		t.Errorf("null-sender row: %s", lines[3])
	}
	if !strings.Contains(lines[4], " due ") || strings.Contains(lines[5], "in 4m") {
		t.Errorf("next attempt of a queued and a held recipient:\n%s\n%s", lines[4], lines[5])
	}
	if strings.Contains(out, "\x1b") {
		t.Error("a control character from a reply reached the terminal")
	}
	if lines[6] != "recipients 1-5 of 5" {
		t.Errorf("footer %q", lines[6])
	}
}

func TestCLIQueueListFiltersAndJSON(t *testing.T) {
	f, c := cliFixture(t)
	out, err := runQueue(c, "list", "-status", "deferred", "-domain", "greylist.test", "-json")
	if err != nil {
		t.Fatal(err)
	}
	var l admin.ListResult
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if l.Total != 2 || l.Rows[0].ID != f.m1.String() {
		t.Errorf("list %+v", l)
	}
	out, err = runQueue(c, "list", "-older-than", "1h", "-limit", "2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "recipients 1-2 of 3 (next page: -offset 2)") {
		t.Errorf("paging footer:\n%s", out)
	}
	out, err = runQueue(c, "list", "-reason", "mailbox-full")
	if err != nil || !strings.Contains(out, "no recipients match") {
		t.Errorf("empty list: %v %q", err, out)
	}
}

func TestCLIQueueShow(t *testing.T) {
	f, c := cliFixture(t)
	out, err := runQueue(c, "show", f.m1.String()+"/1") // the id/n form list prints
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"message", f.m1.String(), "alice@example.org", "recipient 1", "carol@greylist.test",
		"deferred (greylisted)", "from 192.0.2.10 to mx.peer.test [198.51.100.7]", "meaning", "what to do",
		"START", "451 4.7.1"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	out, err = runQueue(c, "show", f.m2.String(), "-json")
	if err != nil {
		t.Fatal(err)
	}
	var m admin.Message
	if err := json.Unmarshal([]byte(out), &m); err != nil || m.Sender != "" || len(m.Recipients) != 1 {
		t.Errorf("show -json: %v %+v", err, m)
	}
	if _, err := runQueue(c, "show", "abcdef"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown id: %v", err)
	}
}

func TestCLIQueueActions(t *testing.T) {
	f, c := cliFixture(t, func(o *admin.Options) { o.Engine = nil })
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"retry", "-domain", "greylist.test"}, "retry: 2 recipient(s) changed"},
		{[]string{"hold", f.m2.String()}, "hold: 1 recipient(s) changed"},
		{[]string{"release", "-all"}, "release: 2 recipient(s) changed"},
		{[]string{"delete", "-json", f.m3.String()}, `"recipients": 1`},
	}
	for _, tt := range tests {
		out, err := runQueue(c, tt.args...)
		if err != nil || !strings.Contains(out, tt.want) {
			t.Errorf("%v: %v %q, want %q", tt.args, err, out, tt.want)
		}
	}
	if _, err := runQueue(c, "bounce", f.m1.String()); err == nil || !strings.Contains(err.Error(), "not available") {
		t.Errorf("bounce without engine: %v", err)
	}
}

func TestCLIUsageErrors(t *testing.T) {
	_, c := cliFixture(t)
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"retry"},
		{"retry", "-all", "-domain", "x.test"},
		{"delete", "1", "-all"},
		{"show"},
		{"list", "extra"},
		{"list", "-status", "bogus"}, // refused by the server: 400
		{"list", "-limit", "0"},
	} {
		if _, err := runQueue(c, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	if _, err := runQueue(c, "list", "-h"); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	if out, err := runQueue(c, "help"); err != nil || !strings.Contains(out, "usage:") {
		t.Errorf("help: %v %q", err, out)
	}
}

func TestCLIDestinations(t *testing.T) {
	_, c := cliFixture(t)
	var out strings.Builder
	if err := RunDestinations(nil, c, &out, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"DOMAIN", "LEARNED DELAY", "greylist.test", "yes", "5m", "3/1",
		"slow.test", "10m", "mx1.slow.test (in 30m)", "quiet.test"} {
		if !strings.Contains(s, want) {
			t.Errorf("destinations lack %q:\n%s", want, s)
		}
	}
	out.Reset()
	if err := RunDestinations([]string{"-json", "slow.test"}, c, &out, &out); err != nil {
		t.Fatal(err)
	}
	var d admin.Destinations
	if err := json.Unmarshal([]byte(out.String()), &d); err != nil || len(d.Destinations) != 1 || d.Destinations[0].ThrottleLevel != 2 {
		t.Errorf("-json: %v %s", err, out.String())
	}
}

func TestCLIDestinationsForget(t *testing.T) {
	f, c := cliFixture(t)
	run := func(args ...string) (string, error) {
		var out strings.Builder
		err := RunDestinations(append([]string{"forget"}, args...), c, &out, &out)
		return out.String(), err
	}
	if out, err := run("slow.test"); err != nil || out != "forget: 1 destination(s) changed\n" {
		t.Errorf("forget slow.test: %v %q", err, out)
	}
	if out, err := run("-all", "-json"); err != nil || !strings.Contains(out, `"destinations": 1`) {
		t.Errorf("forget -all -json: %v %q", err, out)
	}
	for _, args := range [][]string{{}, {"a.test", "-all"}, {"a.test", "b.test"}} {
		if _, err := run(args...); err == nil {
			t.Errorf("forget %v: no error", args)
		}
	}
	if want := []string{"slow.test", "all"}; !slices.Equal(f.engine.Forgotten(), want) {
		t.Errorf("engine forgot %v, want %v", f.engine.Forgotten(), want)
	}
}

func TestCLIToken(t *testing.T) {
	_, c := cliFixture(t, func(o *admin.Options) { o.Config.Admin.Token = "tok" })
	if _, err := runQueue(c, "list"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without token: %v", err)
	}
	c.Token = "tok"
	if _, err := runQueue(c, "list"); err != nil {
		t.Errorf("with token: %v", err)
	}
	var out strings.Builder
	if err := RunHealth(c, &out); err != nil {
		t.Errorf("health with token: %v", err)
	}
}

func TestCLIHealthNotReady(t *testing.T) {
	_, c := cliFixture(t, func(o *admin.Options) { o.Ready = func() error { return errors.New("queue closed") } })
	var out strings.Builder
	if err := RunHealth(c, &out); err == nil || !strings.Contains(err.Error(), "queue closed") {
		t.Errorf("health: %v", err)
	}
}

func TestCLIUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := adminclient.New(&config.Config{Admin: config.Admin{Address: addr}})
	want := "greyrelay is not reachable at http://" + addr + ": "
	var out strings.Builder
	errs := []error{
		RunQueue([]string{"list"}, c, &out, &out),
		RunQueue([]string{"retry", "-all"}, c, &out, &out),
		RunDestinations(nil, c, &out, &out),
		RunHealth(c, &out),
	}
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("call %d: %v, want %q", i, err, want)
		}
	}
}

// TestCLIHealth: `greyrelay health` prints the server's answer and
// succeeds when it is ready; without an admin address it fails.
func TestCLIHealth(t *testing.T) {
	_, c := cliFixture(t)
	var out strings.Builder
	if err := RunHealth(c, &out); err != nil || strings.TrimSpace(out.String()) != "ok" {
		t.Errorf("health: %v %q", err, out.String())
	}
	if err := RunHealth(adminclient.New(&config.Config{}), &out); err == nil || !strings.Contains(err.Error(), "disabled") {
		t.Errorf("disabled admin: %v", err)
	}
}

// TestCLIQueueListFilterValues: a filter value that can match nothing (a
// typo) is an error naming the valid values, said once, and a duration
// takes d as the configuration does.
func TestCLIQueueListFilterValues(t *testing.T) {
	_, c := cliFixture(t)
	var out, errOut strings.Builder
	err := RunQueue([]string{"list", "-reason", "greylist"}, c, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), `unknown reason "greylist"`) || !strings.Contains(err.Error(), "greylisted") {
		t.Errorf("-reason greylist: %v, want an error listing the reasons", err)
	}
	if errOut.Len() != 0 || out.Len() != 0 {
		t.Errorf("-reason greylist printed %q and %q besides the error (the caller prints it once)", out.String(), errOut.String())
	}
	got, err := runQueue(c, "list", "-older-than", "2d")
	if err != nil || !strings.Contains(got, "no recipients match") {
		t.Errorf("-older-than 2d: %v %q", err, got)
	}
	if _, err := runQueue(c, "list", "-older-than", "2 days"); err == nil || !strings.Contains(err.Error(), "e.g. 90s") {
		t.Errorf("-older-than '2 days': %v, want the duration hint", err)
	}
	out.Reset()
	errOut.Reset()
	if err := RunQueue([]string{"list", "-h"}, c, &out, &errOut); !errors.Is(err, flag.ErrHelp) || !strings.Contains(errOut.String(), "-older-than") {
		t.Errorf("list -h: %v, flags %q", err, errOut.String())
	}
}

// TestCLIQueueShowGreyLike: `queue show` prints the evidence that a reply
// without a greylisting text is greylisting at its MX host.
func TestCLIQueueShowGreyLike(t *testing.T) {
	f, c := cliFixture(t)
	exim := queue.Reply{Code: 451, Text: "Temporary local problem - please try later"}
	id := admintest.Enqueue(t, f.q, "alice@example.org", testNow.Add(-time.Hour), "x@exim.test")
	admintest.DeferKeys(t, f.q, testNow.Add(-time.Minute), "greylisted", exim, queue.Key{ID: id})
	if _, err := f.q.Apply(queue.Update{Destinations: []queue.Destination{{Domain: "[198.51.100.7]",
		GreyLike: exim.Text, GreyLikePassed: 3, GreyLikeRefused: 1, Updated: testNow}}}); err != nil {
		t.Fatal(err)
	}
	out, err := runQueue(c, "show", id.String())
	if err != nil {
		t.Fatal(err)
	}
	want := `greylisting by behaviour  not by its text: at [198.51.100.7], 3 recipient(s) deferred with "Temporary local problem - please try later" passed at their first retry (same address, same source) and 1 were refused again`
	if !strings.Contains(out, want) {
		t.Errorf("show lacks %q:\n%s", want, out)
	}
	if out, _ := runQueue(c, "show", f.m1.String()); strings.Contains(out, "by behaviour") {
		t.Errorf("greylisted by its text, shown as by behaviour:\n%s", out)
	}
}
