package events

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
)

// Backoff between failed deliveries to a sink: doubling from minBackoff to
// maxBackoff, and back to none after a success.
const (
	minBackoff = time.Second
	maxBackoff = 5 * time.Minute
)

// sink is one destination of events with its reader: a webhook or the file.
type sink struct {
	name  string        // its outbox name in the queue
	label string        // its metrics label
	kinds map[Kind]bool // nil: every kind
	send  func(ctx context.Context, batch [][]byte) error
	wake  chan struct{} // capacity 1: records were stored
}

func (s *sink) wants(k Kind) bool { return s.kinds == nil || s.kinds[k] }

// Stored is queue.Options.OnEvents: it counts the new records as pending
// and wakes their sinks' readers.
func (e *Events) Stored(added map[string]int) {
	for _, s := range e.sinks {
		if n := added[s.name]; n > 0 {
			if e.opt.Metrics != nil {
				e.opt.Metrics.Pending.WithLabelValues(s.label).Add(float64(n))
			}
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// Run reads q's outbox for every sink until ctx ends.
func (e *Events) Run(ctx context.Context, q *queue.Queue) {
	done := make(chan struct{}, len(e.sinks))
	for _, s := range e.sinks {
		e.recount(q, s)
		go func() {
			e.read(ctx, q, s)
			done <- struct{}{}
		}()
	}
	for range e.sinks {
		<-done
	}
}

// read passes s's records on, oldest first, until ctx ends: a batch is
// removed from the queue only after s took it.
func (e *Events) read(ctx context.Context, q *queue.Queue, s *sink) {
	fails := 0
	for ctx.Err() == nil {
		recs, err := q.Outbox(s.name, e.opt.Batch)
		if err != nil {
			if !errors.Is(err, queue.ErrClosed) {
				e.opt.Logger.Error("events: reading the queue failed", zap.String("sink", s.label), zap.Error(err))
			}
			sleep(ctx, nil, minBackoff)
			continue
		}
		if recs = e.dropOld(q, s, recs); len(recs) == 0 {
			sleep(ctx, s.wake, maxBackoff)
			continue
		}
		batch := make([][]byte, 0, len(recs))
		for _, r := range recs {
			if _, js, ok := decodeRecord(r.Data); ok {
				batch = append(batch, js)
			}
		}
		if err := s.send(ctx, batch); err != nil {
			if ctx.Err() != nil {
				return // stopping: the batch stays for the next start
			}
			fails++
			e.count(s, func(m metricSet) { m.failed.Inc() })
			wait := backoffAfter(fails)
			e.opt.Logger.Warn("events: delivery failed; trying again", zap.String("sink", s.label),
				zap.Int("events", len(batch)), zap.Duration("retry_in", wait), zap.Error(err))
			sleep(ctx, nil, wait)
			continue
		}
		fails = 0
		if err := q.OutboxDone(s.name, recs[len(recs)-1].Seq); err != nil {
			// Sent again later, with the same IDs.
			e.opt.Logger.Error("events: removing delivered events failed", zap.String("sink", s.label), zap.Error(err))
			sleep(ctx, nil, minBackoff)
			continue
		}
		e.count(s, func(m metricSet) { m.sent.Add(float64(len(recs))) })
		e.recount(q, s)
	}
}

// recount sets s's pending gauge to what its outbox holds. Stored adds new
// records as they are committed, but a commit can land between Run's first
// count and its Set, or between a removal and a Sub, and an incremental
// count would then stay wrong (it was seen at -2); reading the length
// after each removal corrects any such drift within one batch.
func (e *Events) recount(q *queue.Queue, s *sink) {
	if e.opt.Metrics == nil {
		return
	}
	if n, err := q.OutboxLen(s.name); err == nil {
		e.opt.Metrics.Pending.WithLabelValues(s.label).Set(float64(n))
	}
}

// dropOld removes the leading records older than MaxAge and returns the
// rest.
func (e *Events) dropOld(q *queue.Queue, s *sink, recs []queue.OutboxRecord) []queue.OutboxRecord {
	if e.opt.MaxAge <= 0 || len(recs) == 0 {
		return recs
	}
	limit := e.opt.Now().Add(-e.opt.MaxAge)
	n := 0
	var oldest time.Time
	for n < len(recs) {
		t, _, ok := decodeRecord(recs[n].Data)
		if ok && !t.Before(limit) {
			break
		}
		if n == 0 {
			oldest = t
		}
		n++
	}
	if n == 0 {
		return recs
	}
	if err := q.OutboxDone(s.name, recs[n-1].Seq); err != nil {
		e.opt.Logger.Error("events: dropping old events failed", zap.String("sink", s.label), zap.Error(err))
		return recs
	}
	e.count(s, func(m metricSet) { m.dropped.Add(float64(n)) })
	e.recount(q, s)
	e.opt.Logger.Warn("events: dropped undelivered events older than events.max_age", zap.String("sink", s.label),
		zap.Int("events", n), zap.Time("oldest", oldest), zap.Duration("max_age", e.opt.MaxAge))
	return recs[n:]
}

// backoffAfter is the wait after the nth failure in a row.
func backoffAfter(n int) time.Duration {
	d := minBackoff
	for i := 1; i < n && d < maxBackoff; i++ {
		d *= 2
	}
	return min(d, maxBackoff)
}

// sleep waits d, or until wake receives or ctx ends.
func sleep(ctx context.Context, wake <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-wake:
	case <-t.C:
	}
}

// joinBatch is the body of a POST: a JSON array of the events.
func joinBatch(batch [][]byte) []byte {
	return append(append([]byte("["), bytes.Join(batch, []byte(","))...), ']')
}

// metricSet is one sink's collectors.
type metricSet struct {
	pending               prometheus.Gauge
	sent, failed, dropped prometheus.Counter
}

// count updates s's metrics, if there are any.
func (e *Events) count(s *sink, f func(metricSet)) {
	m := e.opt.Metrics
	if m == nil {
		return
	}
	f(metricSet{m.Pending.WithLabelValues(s.label), m.Sent.WithLabelValues(s.label),
		m.Failed.WithLabelValues(s.label), m.Dropped.WithLabelValues(s.label)})
}
