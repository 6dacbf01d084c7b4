package delivery

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/emersion/go-smtp"
)

// rateWindow accepts n RCPTs per window, counted from the first RCPT after
// the last window ended (as the bench's throttling destination counts),
// and refuses the rest with a rate-limit reply without a hint.
type rateWindow struct {
	n      int
	window time.Duration
	start  time.Time
	count  int
}

func (w *rateWindow) rcpt(_, _, _ string, now time.Time) *smtp.SMTPError {
	if now.Sub(w.start) >= w.window {
		w.start, w.count = now, 0
	}
	if w.count >= w.n {
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 7, 1}, Message: "rate limit exceeded, slow down"}
	}
	w.count++
	return nil
}

// TestPacing_UsesAllowedRate sends a burst of one-recipient messages at
// once through the engine, with the default configuration, to a
// destination that accepts n per window, on the fake clock of
// testing/synctest, five times each with other jitter. Every run must
// deliver everything, and no gap between two attempts may be longer than
// twice the window and a second (the opening's doubling gap overshoots
// the window's turn by at most that): the pace never waits much longer
// than the destination needs. The stall this guards against: after the
// opening burst every attempt was accepted, yet the gaps between attempts
// grew 0.9, 4.3, 10, 24, 56, 131 s while the learned pace said 2 s
// (workers waiting for a start each reserved one a gap ahead), and a run
// of accepted messages forgotten with an idle destination, or ended by a
// transaction under way when the first refusal came, set a pace of one
// per hour or one per 10 ms.
//
// The rate (messages over the time from the burst to the last
// acceptance, as the bench counts) is logged and held to 50%, the
// refusals to 20% (below): the goal is 80% with at most 5%. The rate meets it
// (87-96%; before the slow start, one run in about twenty of the 5 per
// 5 s case reached 56%); the refusals do for 5 per 5 s only (4.8-5.7%;
// 6.2-7.4% per minute, 5.1-7.1% per hour): the opening costs log2 of the
// window in seconds while the gap doubles from 1 s until the window
// turns, plus the transactions under way when the first refusal came
// (their refusals do not double the gap: they say nothing new). How many
// are under way then depends on goroutine scheduling, which synctest does
// not fix while the queue writes to a real file: under -race one run in
// about thirty of the per-minute case saw 21 of 171 (12.3%). The bound is
// therefore 20%, still far below the stall's 43% (12 of 28).
func TestPacing_UsesAllowedRate(t *testing.T) {
	for _, c := range []struct {
		n        int
		window   time.Duration
		messages int
	}{
		{5, 5 * time.Second, 100},
		{30, time.Minute, 150},
		{100, time.Hour, 300},
	} {
		t.Run(fmt.Sprintf("%d per %v", c.n, c.window), func(t *testing.T) {
			for run := range 5 {
				t.Run(fmt.Sprint("run ", run), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						paceRun(t, c.n, c.window, c.messages, int64(run))
					})
				})
			}
		})
	}
}

func paceRun(t *testing.T, n int, window time.Duration, messages int, seed int64) {
	lim := &rateWindow{n: n, window: window}
	p := startPipeMX(lim.rcpt)
	defer p.close()
	var mu sync.Mutex
	rnd := rand.New(rand.NewSource(seed))
	pe := startPipeEngine(t, p, map[string]string{"slow.test": "127.0.0.53:25"}, func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return rnd.Float64()
	}, nil)
	defer pe.stop(t)
	start := time.Now()
	for i := range messages {
		pe.send(t, "a@src.test", fmt.Sprintf("t%d@slow.test", i))
	}
	limit := start.Add(time.Duration(3*messages/n+2) * window)
	for time.Now().Before(limit) {
		time.Sleep(window / 10)
		synctest.Wait()
		if accepted(p.rcpts()) >= messages {
			break
		}
	}
	rs := p.rcpts()
	got := accepted(rs)
	var last time.Time
	var longest time.Duration
	for i, r := range rs {
		if i > 0 {
			longest = max(longest, r.at.Sub(rs[i-1].at))
		}
		if r.ok {
			last = r.at
		}
	}
	refused := len(rs) - got
	rate := float64(got) / last.Sub(start).Seconds() / (float64(n) / window.Seconds())
	t.Logf("seed %d: %d of %d delivered in %v, %.0f%% of the allowed rate, %d of %d RCPTs refused (%.1f%%), longest gap %v",
		seed, got, messages, last.Sub(start).Round(time.Second), 100*rate, refused, len(rs), 100*float64(refused)/float64(len(rs)), longest.Round(100*time.Millisecond))
	if got < messages || rate < 0.5 || float64(refused) > 0.20*float64(len(rs)) {
		t.Errorf("seed %d: %d of %d delivered at %.0f%% of the allowed rate with %d of %d RCPTs refused; want all, at least 50%%, at most 20%% refused",
			seed, got, messages, 100*rate, refused, len(rs))
	}
	if longest > 2*window+time.Second {
		t.Errorf("seed %d: %v between two attempts, longer than the window (%v) needs", seed, longest, window)
	}
}

func accepted(rs []pipeRcpt) int {
	n := 0
	for _, r := range rs {
		if r.ok {
			n++
		}
	}
	return n
}
