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
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/metrics"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestScheduler_SleepsUntilDue runs the loop on the fake clock of
// testing/synctest: with one message due in an hour, the loop sleeps on
// its timer for the whole hour (no wakeups, no attempts), then makes the
// attempt on time. The route is a static IP route to a closed port, so
// no DNS and no server is involved; the connection is refused at once.
func TestScheduler_SleepsUntilDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		port := freePort(t)
		cfg, err := config.Load(config.Source{Default: configs.Default, File: []byte(baseYAML)})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Retry.InitialInterval, cfg.Retry.MaxInterval, cfg.Retry.Lifetime = 10*time.Minute, time.Hour, 5*time.Hour
		cfg.Delivery.Routes = map[string]string{"later.test": relaytest.Loopback(t) + ":" + strconv.Itoa(port)}
		q, err := queue.Open(filepath.Join(t.TempDir(), "q.db"), queue.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		start := time.Now()
		if _, err := q.Enqueue(queue.NewMessage{From: "a@sender.test", Arrival: start, NextAttempt: start.Add(time.Hour),
			To: []queue.NewRecipient{{Addr: "x@later.test", Domain: "later.test"}}, Body: []byte("\r\n")}); err != nil {
			t.Fatal(err)
		}
		core, logs := observer.New(zap.InfoLevel)
		m := metrics.New(prometheus.NewRegistry())
		cl, _ := classifier.New(nil)
		eng, err := New(Options{Config: cfg, Queue: q, Classifier: cl,
			Router:  &mx.Router{Routes: cfg.Delivery.Routes, IPv4: true, AllowPrivate: true},
			Dialer4: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(sourceIP)}},
			Logger:  zap.New(core), Metrics: m, Now: time.Now, Rand: func() float64 { return 0 }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- eng.Run(ctx) }()

		synctest.Wait()
		wakeups := testutil.ToFloat64(m.SchedulerWakeup)
		time.Sleep(59 * time.Minute)
		synctest.Wait()
		if got := testutil.ToFloat64(m.SchedulerWakeup); got != wakeups {
			t.Errorf("loop woke %v times while nothing was due", got-wakeups)
		}
		if n := logs.FilterMessage("delivery attempt").Len(); n != 0 {
			t.Fatalf("%d attempts before the due time", n)
		}
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		attempts := logs.FilterMessage("delivery attempt").All()
		if len(attempts) != 1 || attempts[0].ContextMap()["reason"] != "connect" {
			t.Fatalf("attempts %v, want one refused connection", attempts)
		}
		if at := attempts[0].Time; at.Before(start.Add(time.Hour)) {
			t.Errorf("attempt at %v, before the due time %v", at, start.Add(time.Hour))
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
