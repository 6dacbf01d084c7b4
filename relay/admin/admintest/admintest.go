// Package admintest is what the tests of the admin packages (the server in
// relay/admin, the CLI in relay/admin/admincli) share: a real queue in a
// temporary directory holding a known set of messages, recipients and
// destinations, and a fake delivery engine that records what it is asked.
// It imports only the queue, so that relay/admin's own tests can use it
// without an import cycle; each test package builds its server on it.
package admintest

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/greyrelay/greyrelay/queue"
)

// T0 is when the first test message arrived; Now, two hours later, is the
// clock the tests give the server.
var (
	T0  = time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	Now = T0.Add(2 * time.Hour)
)

// GreylistReply is the greylisting reply recorded for the greylisted
// recipients, with markup that must never reach a page unescaped.
var GreylistReply = queue.Reply{Code: 451, Enhanced: "4.7.1", Text: "Greylisted <script>alert(1)</script>, try again in 300 seconds"}

// NoSuchUser is a permanent failure's reply, with markup.
var NoSuchUser = queue.Reply{Code: 550, Enhanced: "5.1.1", Text: "no such user <b>here</b>"}

// Fixture is a real queue in t.TempDir() with four messages:
//
//	M1 alice → bob@greylist.test, carol@greylist.test  deferred, greylisted (451 4.7.1)
//	M2 <>    → dave@slow.test                          deferred, rate-limited (421 4.7.0)
//	M3 alice → erin@new.test                           queued, never attempted
//	M4 bob   → frank@greylist.test                     held after one greylisting
//
// and three destinations: greylist.test greylists (learned 5m), slow.test
// throttles and has a dead host, quiet.test has nothing worth showing.
type Fixture struct {
	Q              *queue.Queue
	M1, M2, M3, M4 queue.ID
}

// New opens and fills the fixture's queue (keeping history, so finished
// messages can be shown); it is closed when the test ends.
func New(t testing.TB) *Fixture {
	t.Helper()
	q, err := queue.Open(filepath.Join(t.TempDir(), "queue.db"), queue.Options{
		History: queue.HistoryOptions{Retention: 7 * 24 * time.Hour, MaxMessages: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	f := &Fixture{Q: q}
	f.M1 = Enqueue(t, q, "alice@example.org", T0, "bob@greylist.test", "carol@greylist.test")
	f.M2 = Enqueue(t, q, "", T0.Add(30*time.Minute), "dave@slow.test")
	f.M3 = Enqueue(t, q, "alice@example.org", T0.Add(time.Hour), "erin@new.test")
	f.M4 = Enqueue(t, q, "bob@example.org", T0.Add(90*time.Minute), "frank@greylist.test")
	DeferKeys(t, q, Now.Add(-time.Hour), "greylisted", GreylistReply, queue.Key{ID: f.M1}, queue.Key{ID: f.M1, Rcpt: 1})
	DeferKeys(t, q, Now.Add(-time.Minute), "rate-limited",
		queue.Reply{Code: 421, Enhanced: "4.7.0", Text: "Too many connections \x1b[31mfrom you"}, queue.Key{ID: f.M2})
	DeferKeys(t, q, Now.Add(-30*time.Minute), "greylisted", GreylistReply, queue.Key{ID: f.M4})
	if _, err := q.Hold(queue.Selector{ID: f.M4}); err != nil {
		t.Fatal(err)
	}
	_, err = q.Apply(queue.Update{Destinations: []queue.Destination{
		{Domain: "greylist.test", Greylists: true, GreylistSeen: 3, GreylistPassed: 1, LearnedDelay: 5 * time.Minute,
			GreylistLearned: Now.Add(-2 * time.Hour), LastGreylisted: Now.Add(-time.Hour), LastReply: GreylistReply, Updated: Now.Add(-time.Hour)},
		{Domain: "slow.test", ThrottleLevel: 2, ThrottledUntil: Now.Add(10 * time.Minute),
			DeadHosts:    map[string]time.Time{"mx1.slow.test": Now.Add(30 * time.Minute)},
			PaceInterval: 2 * time.Second, PaceRefused: Now.Add(-time.Minute), Updated: Now},
		{Domain: "quiet.test", Updated: Now},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Enqueue stores a small message from from to the recipients to.
func Enqueue(t testing.TB, q *queue.Queue, from string, arrival time.Time, to ...string) queue.ID {
	t.Helper()
	m := queue.NewMessage{From: from, Body: []byte("Subject: x\r\n\r\nhi\r\n"), Arrival: arrival,
		ClientAddr: "127.0.0.1:40000", Helo: "client.test"}
	for _, a := range to {
		m.To = append(m.To, queue.NewRecipient{Addr: a, Domain: a[strings.IndexByte(a, '@')+1:]})
	}
	id, err := q.Enqueue(m)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// DeferKeys records one attempt for keys that ended with reply, deferred
// until four minutes after Now.
func DeferKeys(t testing.TB, q *queue.Queue, at time.Time, reason string, reply queue.Reply, keys ...queue.Key) {
	t.Helper()
	err := q.Begin(queue.Start{Keys: keys, Time: at, SourceIP: "192.0.2.10", MXHost: "mx." + "peer.test",
		MXAddr: "198.51.100.7", LeaseUntil: at.Add(10 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var u queue.Update
	for _, k := range keys {
		u.Results = append(u.Results, queue.Result{Key: k, Status: queue.Deferred, Reason: reason,
			Reply: reply, Stage: "rcpt", End: at.Add(time.Second), NextAttempt: Now.Add(4 * time.Minute)})
	}
	if _, err := q.Apply(u); err != nil {
		t.Fatal(err)
	}
}

// FinishKeys records one final attempt (status st) for keys.
func FinishKeys(t testing.TB, q *queue.Queue, at time.Time, st queue.Status, reason string, reply queue.Reply, keys ...queue.Key) {
	t.Helper()
	err := q.Begin(queue.Start{Keys: keys, Time: at, SourceIP: "192.0.2.10", MXHost: "mx.peer.test",
		MXAddr: "198.51.100.7", LeaseUntil: at.Add(10 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var u queue.Update
	for _, k := range keys {
		u.Results = append(u.Results, queue.Result{Key: k, Status: st, Reason: reason, Reply: reply,
			Stage: "rcpt", End: at.Add(time.Second)})
	}
	if _, err := q.Apply(u); err != nil {
		t.Fatal(err)
	}
}

// Engine is a fake delivery engine (admin.Engine) on the queue Q: Retry
// and Bounce act on the queue (Bounce only selects), Forget changes
// nothing; each call is recorded.
type Engine struct {
	Q      *queue.Queue
	mu     sync.Mutex
	bounce []queue.Selector
	retry  []queue.Selector
	forget []string // domain, or "all"
	kicks  int
}

// Retry records sel and retries it in the queue.
func (e *Engine) Retry(sel queue.Selector, now time.Time) (int, error) {
	e.mu.Lock()
	e.retry = append(e.retry, sel)
	e.mu.Unlock()
	return e.Q.Retry(sel, now)
}

// Forget records domain ("all" for all) and reports one destination.
func (e *Engine) Forget(domain string, all bool, _ time.Time) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if all {
		domain = "all"
	}
	e.forget = append(e.forget, domain)
	return 1, nil
}

// Bounce records sel and reports how many recipients it selects.
func (e *Engine) Bounce(sel queue.Selector, _ time.Time) (int, error) {
	e.mu.Lock()
	e.bounce = append(e.bounce, sel)
	e.mu.Unlock()
	rs, err := e.Q.Select(sel)
	return len(rs), err
}

// Requeue requeues sel in the queue, with domains lower-cased.
func (e *Engine) Requeue(sel queue.Selector, now time.Time) (int, error) {
	return e.Q.Requeue(sel, now, func(addr string) string {
		_, d, _ := strings.Cut(addr, "@")
		return strings.ToLower(d)
	}, nil)
}

// Suspend stores the suspension in the queue, as the engine does.
func (e *Engine) Suspend(domain, reason string, until, now time.Time) (queue.Suspension, error) {
	s := queue.Suspension{Domain: domain, Reason: reason, Since: now, Until: until}
	return s, e.Q.Suspend(s)
}

// Resume removes the suspension and retries the domain, as the engine does.
func (e *Engine) Resume(domain string, now time.Time) (bool, int, error) {
	was, err := e.Q.Resume(domain)
	if err != nil {
		return false, 0, err
	}
	n, err := e.Q.Retry(queue.Selector{Domain: domain}, now)
	return was, n, err
}

// Operate performs the operator's action in the queue, without reporting.
func (e *Engine) Operate(action string, sel queue.Selector, now time.Time) (int, error) {
	return e.Q.Operate(action, sel, now, nil)
}

// Kick counts the wake-ups.
func (e *Engine) Kick() {
	e.mu.Lock()
	e.kicks++
	e.mu.Unlock()
}

// Retried is what Retry was given, in order.
func (e *Engine) Retried() []queue.Selector {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.retry)
}

// Bounced is what Bounce was given, in order.
func (e *Engine) Bounced() []queue.Selector {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.bounce)
}

// Forgotten is what Forget was given, in order ("all" for all).
func (e *Engine) Forgotten() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.forget)
}

// Kicks is how many times Kick was called.
func (e *Engine) Kicks() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.kicks
}

// Listening returns a logger for an admin server and a function that
// reads the server's base URL ("http://127.0.0.1:PORT") from the line it
// logs when Start has bound admin.address: with port 0 there, that line
// is where an operator, and a test, learns the port.
func Listening(t testing.TB) (*zap.Logger, func() string) {
	core, logs := observer.New(zap.InfoLevel)
	return zap.New(core), func() string {
		t.Helper()
		for _, e := range logs.FilterMessage("admin server listening").All() {
			if addr, ok := e.ContextMap()["address"].(string); ok {
				return "http://" + addr
			}
		}
		t.Fatal("admintest: the admin server logged no listening address (not started?)")
		return ""
	}
}
