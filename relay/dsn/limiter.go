package dsn

import (
	"strings"
	"sync"
	"time"

	"github.com/greyrelay/greyrelay/relay/address"
)

// maxSenders bounds the Limiter's memory. A backscatter storm hits few
// senders hard; many thousands of distinct senders with a live window
// would mean a busy relay, where forgetting the oldest window is harmless.
const maxSenders = 10000

// window is the DSN count of one sender in its current hour.
type window struct {
	start time.Time
	count int
}

// Limiter caps the DSNs sent to one envelope sender per hour, so a
// forged-sender flood cannot turn the relay into a backscatter source
// (Postfix BACKSCATTER_README).
//
// Each sender has a fixed window of one hour that opens with its first DSN;
// the window restarts at the first DSN after it ends. The Limiter never
// reads the clock: callers pass now. It is safe for concurrent use.
type Limiter struct {
	perHour int

	mu      sync.Mutex
	senders map[string]*window
}

// NewLimiter returns a Limiter that allows perHour DSNs per sender per hour.
// perHour <= 0 means no cap (the configuration layer is expected to forbid
// that).
func NewLimiter(perHour int) *Limiter {
	return &Limiter{perHour: perHour, senders: make(map[string]*window)}
}

// Allow reports whether a DSN to sender may be sent at now, and if so counts
// it. Senders are compared case-insensitively and with their domain in
// canonical form, which can only merge windows, never split them. A nil
// Limiter allows everything.
func (l *Limiter) Allow(sender string, now time.Time) bool {
	if l == nil || l.perHour <= 0 {
		return true
	}
	key := strings.ToLower(sender)
	if i := strings.LastIndexByte(key, '@'); i >= 0 {
		key = key[:i+1] + address.DomainKey(key[i+1:])
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.senders[key]
	if !ok {
		l.makeRoom(now)
		l.senders[key] = &window{start: now, count: 1}
		return true
	}
	switch age := now.Sub(w.start); {
	case age >= time.Hour:
		w.start, w.count = now, 0
	case age < 0:
		// The clock went backwards: keep the count but re-anchor the
		// window, so it neither ends early nor stays open forever.
		w.start = now
	}
	if w.count >= l.perHour {
		return false
	}
	w.count++
	return true
}

// makeRoom keeps the table under maxSenders: it drops every expired window,
// and if all are live, the oldest one. Called with l.mu held.
func (l *Limiter) makeRoom(now time.Time) {
	if len(l.senders) < maxSenders {
		return
	}
	var oldest string
	var oldestStart time.Time
	found := false
	for k, w := range l.senders {
		if now.Sub(w.start) >= time.Hour {
			delete(l.senders, k)
		} else if !found || w.start.Before(oldestStart) {
			oldest, oldestStart, found = k, w.start, true
		}
	}
	if len(l.senders) >= maxSenders {
		delete(l.senders, oldest)
	}
}
