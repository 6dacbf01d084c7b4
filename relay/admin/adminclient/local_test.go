package adminclient

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/config"
)

// asJSON renders a view as the API sends it.
func asJSON(t *testing.T, v any) string {
	t.Helper()
	var b bytes.Buffer
	if err := admin.EncodeJSON(&b, v); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestLocalMatchesClient: every read gives the same view in process as
// over HTTP, byte for byte once encoded.
func TestLocalMatchesClient(t *testing.T) {
	f, c := cliFixture(t)
	l := admin.NewLocal(f.q, "relay.test", func() time.Time { return testNow })
	ctx := context.Background()
	for _, lq := range []admin.ListQuery{
		{},
		{Status: queue.Deferred, Domain: "greylist.test", Limit: 1},
		{Reason: "rate-limited"},
		{Sender: "bob@example.org", Offset: 0, Limit: 5},
		{OlderThan: time.Hour, Offset: 1},
	} {
		viaHTTP, err1 := c.List(ctx, lq)
		direct, err2 := l.List(ctx, lq)
		if err1 != nil || err2 != nil || asJSON(t, viaHTTP) != asJSON(t, direct) {
			t.Errorf("List(%+v): HTTP %v %s\nlocal %v %s", lq, err1, asJSON(t, viaHTTP), err2, asJSON(t, direct))
		}
	}
	viaHTTP, err1 := c.Message(ctx, f.m1.String())
	direct, err2 := l.Message(ctx, f.m1.String())
	if err1 != nil || err2 != nil || asJSON(t, viaHTTP) != asJSON(t, direct) || len(direct.Recipients) != 2 {
		t.Errorf("Message: HTTP %v %+v\nlocal %v %+v", err1, viaHTTP, err2, direct)
	}
	ds1, err1 := c.Destinations(ctx)
	ds2, err2 := l.Destinations(ctx)
	if err1 != nil || err2 != nil || asJSON(t, ds1) != asJSON(t, ds2) || len(ds2.Destinations) != 3 {
		t.Errorf("Destinations: HTTP %v %+v\nlocal %v %+v", err1, ds1, err2, ds2)
	}
	for _, dom := range []string{"slow.test", "greylist.test", "unknown.test"} {
		d1, err1 := c.Destination(ctx, dom)
		d2, err2 := l.Destination(ctx, dom)
		if err1 != nil || err2 != nil || asJSON(t, d1) != asJSON(t, d2) || (d2 == nil) != (dom == "unknown.test") {
			t.Errorf("Destination(%s): HTTP %v %+v\nlocal %v %+v", dom, err1, d1, err2, d2)
		}
	}
	d, _ := l.Destination(ctx, "slow.test")
	if d == nil || d.ThrottleLevel != 2 || len(d.DeadHosts) != 1 || d.DeadHosts[0].Host != "mx1.slow.test" {
		t.Errorf("slow.test: %+v", d)
	}
}

// TestLocalRefusesWhatTheAPIRefuses: both paths validate with one parser
// and report the queue's typed errors.
func TestLocalRefusesWhatTheAPIRefuses(t *testing.T) {
	f, c := cliFixture(t)
	l := admin.NewLocal(f.q, "relay.test", nil)
	ctx := context.Background()
	for _, lq := range []admin.ListQuery{{Status: "bogus"}, {Reason: "greylist"}, {Limit: admin.MaxLimit + 1}, {Offset: -1}, {OlderThan: -time.Hour}} {
		_, err1 := c.List(ctx, lq)
		_, err2 := l.List(ctx, lq)
		// relay/admin's TestLocalRefusesBadQueries checks that err2 is the
		// API's bad-request error.
		if err1 == nil || !strings.Contains(err1.Error(), "400") || err2 == nil {
			t.Errorf("List(%+v): HTTP %v, local %v", lq, err1, err2)
		}
	}
	if _, err := l.Message(ctx, "ffff"); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	if _, err := c.Message(ctx, "ffff"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown id over HTTP: %v", err)
	}
}

func TestClientAct(t *testing.T) {
	f, c := cliFixture(t, func(o *admin.Options) { o.Engine = nil })
	ctx := context.Background()
	res, err := c.Act(ctx, "hold", Target{Domain: "greylist.test"})
	if err != nil || res != (admin.ActionResult{Action: "hold", Recipients: 2}) {
		t.Errorf("hold domain: %+v %v", res, err)
	}
	res, err = c.Act(ctx, "release", Target{ID: f.m1.String()})
	if err != nil || res.Recipients != 2 {
		t.Errorf("release id: %+v %v", res, err)
	}
	for _, bad := range []Target{{}, {ID: "1", All: true}, {Domain: "x.test", All: true}, {Status: queue.Held, All: true}} {
		if _, err := c.Act(ctx, "retry", bad); err == nil || !strings.Contains(err.Error(), "selection") {
			t.Errorf("Act(%+v): %v", bad, err)
		}
	}
	// An ID with a filter narrows it: only the message's recipients at
	// the domain; a dry run counts and changes nothing.
	res, err = c.Act(ctx, "hold", Target{ID: f.m1.String(), Domain: "other.test"})
	if err != nil || res.Recipients != 0 {
		t.Errorf("hold id at another domain: %+v %v", res, err)
	}
	res, err = c.Act(ctx, "hold", Target{Status: queue.Queued, DryRun: true})
	if err != nil || !res.DryRun || res.Recipients == 0 {
		t.Errorf("dry-run hold of the queued: %+v %v", res, err)
	}
	if again, _ := c.Act(ctx, "hold", Target{Status: queue.Queued, DryRun: true}); again.Recipients != res.Recipients {
		t.Errorf("a dry run changed the queue: %d then %d would change", res.Recipients, again.Recipients)
	}
}

// TestClientUnreachable: a disabled or silent admin API is an
// *UnreachableError, which callers such as the probe tell apart from an
// API that answered with an error.
func TestClientUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx := context.Background()
	for _, c := range []*Client{New(&config.Config{}), New(&config.Config{Admin: config.Admin{Address: addr}})} {
		_, err := c.Destination(ctx, "example.test")
		var ue *UnreachableError
		if !errors.As(err, &ue) || ue.Base != c.Base {
			t.Errorf("base %q: %v", c.Base, err)
		}
	}
	_, c := cliFixture(t, func(o *admin.Options) { o.Config.Admin.Token = "tok" })
	_, err = c.List(ctx, admin.ListQuery{})
	var ue *UnreachableError
	if err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong token: %v", err)
	}
}

// TestClientThroughGuard: the client's requests pass the server's guard
// against web pages (Host and cross-origin checks) on a real listener.
func TestClientThroughGuard(t *testing.T) {
	f := newFixture(t)
	c := &Client{Base: f.start(t)}
	res, err := c.Act(context.Background(), "hold", Target{Domain: "new.test"})
	if err != nil || res.Recipients != 1 {
		t.Fatalf("client hold: %+v %v", res, err)
	}
	if out, err := c.Ready(context.Background()); err != nil || out != "ok" {
		t.Errorf("ready: %v %q", err, out)
	}
	// NodeStats, as another node's status page asks it.
	st, err := NodeStats("")(context.Background(), admin.ClusterNode{AdminURL: c.Base})
	if err != nil || st.Messages != 4 || st.ByStatus[string(queue.Held)] != 2 {
		t.Errorf("NodeStats: %+v, %v; want 4 messages, 2 recipients held", st, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "not reachable") {
		t.Errorf("ready after shutdown: %v", err)
	}
}
