package delivery

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/internal/spelling"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/metrics"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// bubble is an engine inside a testing/synctest bubble, on a queue opened
// there, routing later.test by a static IP route to a closed port: no DNS
// and no server is involved, the connection is refused at once, and every
// goroutine is durably blocked whenever the engine waits.
type bubble struct {
	q      *queue.Queue
	m      *metrics.Metrics
	logs   *observer.ObservedLogs
	cancel context.CancelFunc
	done   chan error
}

// startBubble starts the engine; call it inside synctest.Test and end with
// stop. mod adjusts the configuration.
func startBubble(t *testing.T, mod func(*config.Config)) *bubble {
	t.Helper()
	port := freePort(t)
	cfg, err := config.Load(config.Source{Default: configs.Default, File: []byte(baseYAML)})
	if err != nil {
		t.Fatal(err)
	}
	mod(cfg)
	cfg.Delivery.Routes = map[string]string{"later.test": relaytest.Loopback(t) + ":" + strconv.Itoa(port)}
	q, err := queue.Open(filepath.Join(t.TempDir(), "q.db"), queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	b := &bubble{q: q, m: metrics.New(prometheus.NewRegistry()), logs: logs, done: make(chan error, 1)}
	cl, _ := classifier.New(nil)
	eng, err := New(Options{Config: cfg, Queue: q, Classifier: cl,
		Router:  &mx.Router{Routes: cfg.Delivery.Routes, IPv4: true, AllowPrivate: true},
		Dialer4: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(sourceIP)}},
		Logger:  zap.New(core), Metrics: b.m, Now: time.Now, Rand: func() float64 { return 0 }})
	if err != nil {
		q.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	go func() { b.done <- eng.Run(ctx) }()
	return b
}

// enqueue queues a message to x@later.test, first due at next.
func (b *bubble) enqueue(t *testing.T, next time.Time) {
	t.Helper()
	if _, err := b.q.Enqueue(queue.NewMessage{From: "a@sender.test", Arrival: time.Now(), NextAttempt: next,
		To: []queue.NewRecipient{{Addr: "x@later.test", Domain: "later.test"}}, Body: []byte("\r\n")}); err != nil {
		t.Fatal(err)
	}
}

// attempts returns the logged delivery attempts.
func (b *bubble) attempts() []observer.LoggedEntry {
	return b.logs.FilterMessage("delivery attempt").All()
}

// stop ends the engine and closes the queue.
func (b *bubble) stop(t *testing.T) {
	t.Helper()
	b.cancel()
	if err := <-b.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	b.q.Close()
}

// TestScheduler_SleepsUntilDue runs the loop on the fake clock of
// testing/synctest: with one message due in an hour, the loop sleeps on
// its timer for the whole hour (no wakeups, no attempts), then makes the
// attempt on time.
func TestScheduler_SleepsUntilDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t, func(cfg *config.Config) {
			cfg.Retry.InitialInterval, cfg.Retry.MaxInterval, cfg.Retry.Lifetime = 10*time.Minute, time.Hour, 5*time.Hour
		})
		defer b.stop(t)
		start := time.Now()
		b.enqueue(t, start.Add(time.Hour))

		synctest.Wait()
		wakeups := testutil.ToFloat64(b.m.SchedulerWakeup)
		time.Sleep(59 * time.Minute)
		synctest.Wait()
		if got := testutil.ToFloat64(b.m.SchedulerWakeup); got != wakeups {
			t.Errorf("loop woke %v times while nothing was due", got-wakeups)
		}
		if n := len(b.attempts()); n != 0 {
			t.Fatalf("%d attempts before the due time", n)
		}
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		attempts := b.attempts()
		if len(attempts) != 1 || attempts[0].ContextMap()["reason"] != "connect" {
			t.Fatalf("attempts %v, want one refused connection", attempts)
		}
		if at := attempts[0].Time; at.Before(start.Add(time.Hour)) {
			t.Errorf("attempt at %v, before the due time %v", at, start.Add(time.Hour))
		}
	})
}

// TestScheduler_IdleNoPolling: with nothing queued the loop sleeps (no
// wakeup in an hour of the fake clock); an enqueue wakes it at once: the
// attempt is made at the very instant of the enqueue.
func TestScheduler_IdleNoPolling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t, func(*config.Config) {})
		defer b.stop(t)
		synctest.Wait()
		wakeups := testutil.ToFloat64(b.m.SchedulerWakeup)
		time.Sleep(time.Hour)
		synctest.Wait()
		if got := testutil.ToFloat64(b.m.SchedulerWakeup); got != wakeups {
			t.Errorf("idle loop woke %v times", got-wakeups)
		}
		now := time.Now()
		b.enqueue(t, now)
		synctest.Wait()
		attempts := b.attempts()
		if len(attempts) != 1 || !attempts[0].Time.Equal(now) {
			t.Fatalf("attempts %v, want one at the enqueue (%v)", attempts, now)
		}
	})
}

// TestDomainKey_Spellings: every spelling of a domain is one destination
// (one record, one connection limit, one route and TLS policy), also for a
// recipient an older version queued with its U-label domain.
func TestDomainKey_Spellings(t *testing.T) {
	for _, d := range []string{"example.com", "bücher.test", "xn--mnchen-3ya.test"} {
		want := domainKey(d)
		for _, sp := range spelling.Of(d) {
			if got := domainKey(sp); got != want {
				t.Errorf("domainKey(%q) = %q, domainKey(%q) = %q", sp, got, d, want)
			}
		}
	}
	if domainKey("bücher.test") != "xn--bcher-kva.test" {
		t.Errorf("domainKey(bücher.test) = %q", domainKey("bücher.test"))
	}
}
