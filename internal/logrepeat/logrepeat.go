// Package logrepeat keeps a failure that repeats from flooding the log:
// a zap core that lets the first warning or error with a given message
// through, drops the ones with the same message that follow within an
// interval, and adds to the next one it lets through how many it dropped
// ("repeated"). A full disk makes every delivery worker fail the same way
// many times a second; one line a minute with a count says as much, and
// leaves the disk that holds the log alone. Info lines (the delivery log)
// are never dropped.
package logrepeat

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Wrap returns core with warnings and errors limited to one line per
// message and interval. It reads no clock: the entries' own times count.
func Wrap(core zapcore.Core, interval time.Duration) zapcore.Core {
	return &limited{Core: core, s: &state{interval: interval, seen: map[string]*seen{}}}
}

type limited struct {
	zapcore.Core
	s *state // shared by the cores With derives
}

type state struct {
	interval time.Duration
	mu       sync.Mutex
	seen     map[string]*seen // by level and message: a bounded set (messages are constants)
}

type seen struct {
	at      time.Time // when the last line let through was written
	dropped int       // lines dropped since
}

// With keeps the shared state, so that lines with different fields count
// together.
func (c *limited) With(fields []zapcore.Field) zapcore.Core {
	return &limited{Core: c.Core.With(fields), s: c.s}
}

// Check routes warnings and errors through Write.
func (c *limited) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if ent.Level < zapcore.WarnLevel {
		return c.Core.Check(ent, ce)
	}
	if !c.Enabled(ent.Level) {
		return ce
	}
	return ce.AddCore(ent, c)
}

// Write writes ent unless a line with its level and message was written
// less than the interval before.
func (c *limited) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	key := ent.Level.String() + "\x00" + ent.Message
	c.s.mu.Lock()
	last := c.s.seen[key]
	if last != nil && ent.Time.Sub(last.at) < c.s.interval && !ent.Time.Before(last.at) {
		last.dropped++
		c.s.mu.Unlock()
		return nil
	}
	dropped := 0
	if last != nil {
		dropped = last.dropped
	}
	c.s.seen[key] = &seen{at: ent.Time}
	c.s.mu.Unlock()
	if dropped > 0 {
		fields = append(fields[:len(fields):len(fields)], zap.Int("repeated", dropped))
	}
	return c.Core.Write(ent, fields)
}
