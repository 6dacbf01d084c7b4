package main

import (
	"context"
	"io"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/admin/admincli"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/suppress"
)

// openSuppressions opens the suppression list beside the queue file, or
// returns nil when suppression.enabled is false.
func openSuppressions(cfg *config.Config) (*suppress.List, error) {
	if !cfg.Suppression.Enabled {
		return nil, nil
	}
	return suppress.Open(filepath.Join(filepath.Dir(cfg.Queue.Path), "suppressions.db"),
		suppress.Options{Scope: cfg.Suppression.Scope, TTL: cfg.Suppression.TTL})
}

// suppressFunc is the delivery engine's Options.Suppress: it adds the
// address and logs it. Nil without a list.
func suppressFunc(l *suppress.List, log *zap.Logger) func(from, rcpt, reason, reply string, at time.Time) bool {
	if l == nil {
		return nil
	}
	return func(from, rcpt, reason, reply string, at time.Time) bool {
		e, err := l.Suppress(from, rcpt, reason, reply, at)
		if err != nil {
			log.Error("suppressing an address failed", zap.String("rcpt", rcpt), zap.Error(err))
			return false
		}
		log.Info("address suppressed", zap.String("rcpt", e.Address), zap.String("scope", e.Scope),
			zap.String("reply", reply), zap.Time("expires", e.Expires))
		return true
	}
}

// pruneSuppressions deletes expired entries every hour until ctx ends.
func pruneSuppressions(ctx context.Context, l *suppress.List, log *zap.Logger) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := l.Prune(); err != nil {
			log.Warn("pruning the suppression list failed", zap.Error(err))
		} else if n > 0 {
			log.Info("suppressions expired", zap.Int("addresses", n))
		}
	}
}

func suppressionCmd(args []string, stdout, stderr io.Writer) error {
	c, rest, err := clientFor(args, stderr)
	if err != nil {
		return err
	}
	return admincli.RunSuppression(rest, c, stdout, stderr)
}
