package tlsrpt

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// ReportTick is how often a Reporter saves its counts and sends the
// reports that are due: Take hands out only finished days, so a day's
// report leaves within a tick of midnight UTC.
const ReportTick = time.Minute

// Reporter owns TLS reporting between the delivery engine, which counts
// sessions into Agg, and the reports' receivers: it saves the counts,
// sends the reports that are due, and keeps the reports still owed. One
// send runs at a time, the daily one or the operator's.
type Reporter struct {
	Agg    *Aggregator
	Sender *Sender
	Store  Store // the queue database: counts and reports owed survive a restart
	Log    *zap.Logger
	Now    func() time.Time

	mu   sync.Mutex
	owed []Owed // reports not yet delivered everywhere; under mu
}

// Load reads the counts and the reports owed that the last run saved.
func (r *Reporter) Load() error {
	if err := r.Agg.Load(r.Store); err != nil {
		return err
	}
	owed, err := LoadOwed(r.Store)
	r.mu.Lock()
	r.owed = owed
	r.mu.Unlock()
	return err
}

// Save stores the counts (when they changed); Run calls it every tick, and
// the relay once more after the delivery engine stopped.
func (r *Reporter) Save() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.Agg.Save(r.Store); err != nil {
		r.Log.Warn("TLS report counts not saved", zap.Error(err))
	}
}

// Send sends the reports of the finished days, or of everything counted
// when all is set, and tries again the reports owed whose time has come.
// The reports still owed are saved before the counts they were taken
// from are dropped from the store: a crash in between sends a report
// twice rather than never.
func (r *Reporter) Send(ctx context.Context, all bool) []Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.Now()
	res, owed := r.Sender.Deliver(ctx, r.Agg.Take(now, all), r.owed, now)
	r.owed = owed
	for _, x := range res {
		r.Log.Info("TLS report", zap.String("domain", x.Domain), zap.Strings("sent", x.Sent), zap.Strings("errors", x.Errors))
	}
	if len(res) == 0 {
		return res
	}
	if err := SaveOwed(r.Store, owed); err != nil {
		r.Log.Warn("TLS reports owed not saved", zap.Error(err))
	}
	if err := r.Agg.Save(r.Store); err != nil {
		r.Log.Warn("TLS report counts not saved", zap.Error(err))
	}
	return res
}

// Run sends the reports that are due and saves the counts, every
// ReportTick until ctx ends.
func (r *Reporter) Run(ctx context.Context) {
	t := time.NewTicker(ReportTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Send(ctx, false)
			r.Save()
		}
	}
}
