package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin/admincli"
	"github.com/greyrelay/greyrelay/relay/cluster"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/events"
	"github.com/greyrelay/greyrelay/relay/suppress"
)

// openSuppressions opens the suppression list beside the queue file, or
// returns nil when suppression.enabled is false. With a cluster the list
// is shared through it (syncSuppressions).
func openSuppressions(cfg *config.Config, shared *cluster.Cluster) (*suppress.List, error) {
	if !cfg.Suppression.Enabled {
		return nil, nil
	}
	opt := suppress.Options{Scope: cfg.Suppression.Scope, TTL: cfg.Suppression.TTL}
	if shared != nil { // a nil *cluster.Cluster in the interface would not be nil
		opt.Shared = shared
	}
	return suppress.Open(filepath.Join(filepath.Dir(cfg.Queue.Path), "suppressions.db"), opt)
}

// suppressionSync is how often a node of a cluster follows the shared
// suppression list: an address suppressed on one node is refused on the
// others within about this long.
const suppressionSync = 2 * time.Second

// syncSuppressions follows the shared suppression list until ctx ends.
func syncSuppressions(ctx context.Context, l *suppress.List, log *zap.Logger) {
	t := time.NewTicker(suppressionSync)
	defer t.Stop()
	for {
		if err := l.Sync(); err != nil {
			log.Error("following the shared suppression list failed", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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

// announcedList is the suppression list as the admin API changes it: an
// entry the operator adds is also a suppressed event.
type announcedList struct {
	list *suppress.List
	q    *queue.Queue
	ev   *events.Events
	log  *zap.Logger
}

// Put implements admin.SuppressionList.
func (l announcedList) Put(e suppress.Entry) error {
	if err := l.list.Put(e); err != nil {
		return err
	}
	if err := l.q.AddEvents(l.ev.SuppressedBy(strings.ToLower(e.Address), strings.ToLower(e.Scope), e.Reason, e.Since)); err != nil {
		l.log.Warn("storing a suppressed event failed", zap.String("address", e.Address), zap.Error(err))
	}
	return nil
}

// List implements admin.SuppressionList.
func (l announcedList) List() ([]suppress.Entry, error) { return l.list.List() }

// Remove implements admin.SuppressionList.
func (l announcedList) Remove(scope, addr string) error { return l.list.Remove(scope, addr) }

// importRefresh is how often every import is applied again even when no
// file changed: an address whose other entry ended (a bounce's) is
// suppressed by its import again within this time.
const importRefresh = time.Hour

// loadImport applies one file of suppression.imports to the list and
// logs what changed. A file that cannot be read or parsed changes nothing
// (the entries it made stay) and is logged.
func loadImport(l *suppress.List, path, cause string, log *zap.Logger) {
	f, err := os.Open(path)
	if err != nil {
		log.Error(cause+": suppression import not read, its entries stay", zap.String("file", path), zap.Error(err))
		return
	}
	addrs, err := suppress.ParseAddresses(f)
	f.Close()
	if err != nil {
		log.Error(cause+": suppression import not read, its entries stay", zap.String("file", path), zap.Error(err))
		return
	}
	added, removed, err := l.Import(path, addrs)
	if err != nil {
		log.Error(cause+": suppression import failed", zap.String("file", path), zap.Error(err))
		return
	}
	log.Info(cause+": suppression import applied", zap.String("file", path), zap.Int("addresses", len(addrs)),
		zap.Int("added", added), zap.Int("removed", removed))
}

// watchImports applies suppression.imports again on SIGHUP, when a file
// changes (polled every directoryPoll) and every importRefresh, until ctx
// ends. The caller applied them once at start.
func watchImports(ctx context.Context, files []string, l *suppress.List, log *zap.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tick := time.NewTicker(directoryPoll)
	defer tick.Stop()
	seen := make([]fileStamp, len(files))
	for i, f := range files {
		seen[i] = stampOf(f)
	}
	last := time.Now()
	for {
		all := ""
		select {
		case <-ctx.Done():
			return
		case <-hup:
			all = "SIGHUP"
		case <-tick.C:
			if time.Since(last) >= importRefresh {
				all = "refresh"
			}
		}
		if all != "" {
			last = time.Now()
		}
		for i, f := range files {
			st := stampOf(f)
			switch {
			case all != "":
				loadImport(l, f, all, log)
			case st != seen[i]:
				loadImport(l, f, "file changed", log)
			}
			seen[i] = st
		}
	}
}
