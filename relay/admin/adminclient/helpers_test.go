package adminclient

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/admintest"
	"github.com/greyrelay/greyrelay/relay/config"
)

var testNow = admintest.Now

// fixture is admintest's queue (see there for its messages and
// destinations) served by an admin server with a fake engine.
type fixture struct {
	q              *queue.Queue
	srv            *admin.Server
	base           func() string // the base URL, once started (admintest.Listening)
	m1, m2, m3, m4 queue.ID
}

// options adjusts the server options of a fixture before admin.New.
type options func(*admin.Options)

// newFixture builds the fixture's server without serving it.
func newFixture(t *testing.T, opts ...options) *fixture {
	t.Helper()
	d := admintest.New(t)
	f := &fixture{q: d.Q, m1: d.M1, m2: d.M2, m3: d.M3, m4: d.M4}
	o := admin.Options{Config: &config.Config{Hostname: "relay.test", Admin: config.Admin{Address: "127.0.0.1:0"}},
		Queue: f.q, Engine: &admintest.Engine{Q: d.Q}, Registry: prometheus.NewRegistry(), Now: func() time.Time { return testNow }}
	o.Logger, f.base = admintest.Listening(t)
	for _, fn := range opts {
		fn(&o)
	}
	var err error
	if f.srv, err = admin.New(o); err != nil {
		t.Fatal(err)
	}
	return f
}

// cliFixture serves a fixture over real loopback HTTP for the client.
func cliFixture(t *testing.T, opts ...options) (*fixture, *Client) {
	t.Helper()
	f := newFixture(t, opts...)
	return f, &Client{Base: f.start(t)}
}

// start starts f's server as serve starts it (Start on admin.address,
// 127.0.0.1:0), stopped when the test ends, and returns its base URL.
func (f *fixture) start(t *testing.T) string {
	t.Helper()
	if err := f.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.srv.Shutdown(ctx)
	})
	return f.base()
}
