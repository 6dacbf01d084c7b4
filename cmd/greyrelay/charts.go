package main

import (
	"bytes"
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/metrics"
)

// chartSaveEvery is how often the status page's chart series are stored:
// a crash loses at most this much of them; a clean stop stores them last.
const chartSaveEvery = time.Minute

// chartStore and chartKey name where the series are kept in the queue's
// file: a store of their own, one value rewritten whole (at most a few
// kilobytes: six hours of minutes). queue/salvage copies it with the
// other stores.
const (
	chartStore = "charts"
	chartKey   = "recent"
)

// chartKeeper keeps the status page's outcomes per minute
// (metrics.Recent) in the queue database, so that a restart does not
// start the charts afresh.
type chartKeeper struct {
	q   *queue.Store
	r   *metrics.Recent
	log *zap.Logger

	last []byte // what was stored last
}

// restoreCharts loads the stored series into r. Losing them is no reason
// not to start: a damaged value is logged and replaced at the next save.
func restoreCharts(q *queue.Queue, r *metrics.Recent, log *zap.Logger) *chartKeeper {
	k := &chartKeeper{q: q.Store(chartStore), r: r, log: log}
	v, err := k.q.Get(chartKey)
	if err == nil && v != nil {
		err = r.UnmarshalBinary(v)
	}
	if err != nil {
		log.Warn("status page charts not restored; they start afresh", zap.Error(err))
	}
	k.last = v
	return k
}

// run stores the series every chartSaveEvery, and once more when ctx
// ends.
func (k *chartKeeper) run(ctx context.Context) {
	t := time.NewTicker(chartSaveEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			k.save()
			return
		case <-t.C:
			k.save()
		}
	}
}

// save stores the series if they changed since the last save. Only run
// calls it once the relay runs.
func (k *chartKeeper) save() {
	v, err := k.r.MarshalBinary()
	if err == nil && bytes.Equal(v, k.last) {
		return
	}
	if err == nil {
		err = k.q.Put(chartKey, v)
	}
	if err != nil {
		// A full disk, say: the charts are the least of it, and the
		// next save tries again.
		k.log.Warn("status page charts not stored", zap.Error(err))
		return
	}
	k.last = v
}
