package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/events"
	"github.com/greyrelay/greyrelay/relay/metrics"
	"github.com/greyrelay/greyrelay/relay/smtpd"
)

// newEvents builds the delivery events of cfg.Events. It comes before the
// queue opens: the queue calls it while it replays its journal.
func newEvents(c config.Events, node string, log *zap.Logger, m *metrics.Events) (*events.Events, error) {
	opt := events.Options{File: c.File, MaxAge: c.MaxAge, StripTag: c.Tag == "strip", Timeout: c.Timeout,
		Batch: c.BatchSize, Logger: log, Metrics: m, Node: node}
	for i, w := range c.Webhooks {
		secret, err := config.ReadSecret(w.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("events.webhooks[%d].secret_file: %w", i, err)
		}
		hook := events.Webhook{URL: w.URL, Secret: secret}
		for _, k := range w.Events {
			hook.Kinds = append(hook.Kinds, events.Kind(k))
		}
		opt.Webhooks = append(opt.Webhooks, hook)
	}
	return events.New(opt), nil
}

// runEvents passes stored events on until ctx ends, and reopens the event
// file on SIGHUP (logrotate). The returned function stops it and waits.
func runEvents(ctx context.Context, ev *events.Events, q *queue.Queue) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{}, 2)
	go func() {
		ev.Run(ctx, q)
		done <- struct{}{}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				ev.Reopen()
			}
		}
	}()
	return func() {
		cancel()
		<-done
		<-done
		signal.Stop(hup)
		ev.Close()
	}
}

// refusedEvents stores a refused event for each recipient intake refuses
// for being suppressed; nil without event sinks. A failed write (a full
// disk) loses the event, not the reply: the refusal is what the client
// sees, and nothing was queued.
func refusedEvents(q *queue.Queue, ev *events.Events, log *zap.Logger) func(smtpd.Refusal) {
	if !ev.Enabled() {
		return nil
	}
	return func(r smtpd.Refusal) {
		if err := q.AddEvents(ev.Refused(r.From, r.Rcpt, r.Reason, r.Code, r.Enhanced, r.Text, r.Time)); err != nil {
			log.Warn("storing a refused event failed", zap.String("rcpt", r.Rcpt), zap.Error(err))
		}
	}
}
