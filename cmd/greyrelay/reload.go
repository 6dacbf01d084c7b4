package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/smtpd"
)

// directoryPoll is how often users_file and api.tokens_file are looked at
// for a change: a stat of each, so that a user or token added with
// `greyrelay user add` or `token add` works within seconds, without a
// signal. SIGHUP reloads them at once.
const directoryPoll = 2 * time.Second

// fileStamp is what tells that a file changed: its size, modification
// time and inode (an editor or a configuration tool replaces the file).
type fileStamp struct {
	size, mtime int64
	ino         uint64
	err         bool
}

func stampOf(path string) fileStamp {
	if path == "" {
		return fileStamp{}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{err: true}
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}

// watchDirectory reloads users_file and api.tokens_file into users on
// SIGHUP and when either file changes, until ctx ends. A file that does
// not load keeps the accounts in use (and is logged). Sessions and
// requests already authenticated keep their identity: only new AUTH
// commands and requests see the new files.
func watchDirectory(ctx context.Context, cfg *config.Config, users *smtpd.Users, log *zap.Logger) {
	tokens := ""
	if cfg.API.Address != "" {
		tokens = cfg.API.TokensFile
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tick := time.NewTicker(directoryPoll)
	defer tick.Stop()
	seen := [2]fileStamp{stampOf(cfg.UsersFile), stampOf(tokens)}
	for {
		cause := "SIGHUP"
		select {
		case <-ctx.Done():
			return
		case <-hup:
		case <-tick.C:
			cause = "file changed"
		}
		now := [2]fileStamp{stampOf(cfg.UsersFile), stampOf(tokens)}
		if cause != "SIGHUP" && now == seen {
			continue
		}
		seen = now
		n, err := smtpd.LoadDirectory(cfg.UsersFile, tokens)
		if err != nil {
			log.Error(cause+": users and tokens not reloaded, the ones in use stay", zap.Error(err))
			continue
		}
		users.Replace(n)
		nu, nt := users.Counts()
		log.Info(cause+": users_file and api.tokens_file reloaded", zap.Int("users", nu), zap.Int("tokens", nt))
	}
}
