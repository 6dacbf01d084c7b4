package main

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/metrics"
)

// The status page's outcomes per minute outlive the process: what one run
// saved when it stopped, the next restores; a damaged stored value is logged, and the
// charts start afresh rather than the relay not starting.
func TestChartsKeptAcrossRestart(t *testing.T) {
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	path := filepath.Join(t.TempDir(), "q.db")
	run := func(t *testing.T, stored []byte, add string) (*metrics.Recent, *observer.ObservedLogs) {
		t.Helper()
		q, err := queue.Open(path, queue.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		if stored != nil {
			if err := q.Store(chartStore).Put(chartKey, stored); err != nil {
				t.Fatal(err)
			}
		}
		core, logs := observer.New(zap.WarnLevel)
		r := metrics.NewRecent()
		k := restoreCharts(q, r, zap.New(core))
		if add != "" {
			r.Add(add, now)
		}
		ctx, stop := context.WithCancel(context.Background())
		stop()
		k.run(ctx) // the relay stops: the last save

		return r, logs
	}
	tests := []struct {
		name      string
		stored    []byte
		add       string
		delivered int
		warns     int
	}{
		{name: "first run", add: "delivered", delivered: 1},
		{name: "restart", delivered: 1},
		{name: "restart, one more", add: "delivered", delivered: 2},
		{name: "damaged value", stored: []byte("{garbage"), add: "delivered", warns: 1, delivered: 1},
		{name: "after the damage", delivered: 1},
	}
	for _, tt := range tests {
		r, logs := run(t, tt.stored, tt.add)
		if got := r.Series(metrics.RecentDelivered, now, 1); !slices.Equal(got, []int{tt.delivered}) {
			t.Errorf("%s: delivered %v, want %d", tt.name, got, tt.delivered)
		}
		if logs.Len() != tt.warns {
			t.Errorf("%s: %d warnings, want %d: %v", tt.name, logs.Len(), tt.warns, logs.All())
		}
	}
}
