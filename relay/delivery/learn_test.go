package delivery

import (
	"fmt"
	"math/rand"
	"testing"
	"testing/synctest"
	"time"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
)

// greylister is a postgrey in miniature: a triplet seen for the first time
// is refused, and refused again until delay has passed since then (0: it
// greylists nothing, as after whitelisting us).
type greylister struct {
	delay time.Duration
	first map[string]time.Time
}

func (g *greylister) accepts(triplet string, now time.Time) bool {
	if g.delay <= 0 {
		return true
	}
	f, ok := g.first[triplet]
	if !ok {
		g.first[triplet] = now
		return false
	}
	return now.Sub(f) >= g.delay
}

// delivery is one simulated message: its attempts and the time from its
// 250 at intake to acceptance.
type delivery struct {
	attempts int
	took     time.Duration
}

// deliverOne sends a message to a new recipient through g, as the engine
// does: each greylisting reply is learned and places the retry
// (greylistWait), the pass is learned (learnGreylistPass). The relay's
// clock lags the greylister's by the time it takes to settle an attempt.
func deliverOne(p backoff.Policy, rec *queue.Destination, g *greylister, triplet string, rnd *rand.Rand) delivery {
	const settle = 50 * time.Millisecond
	start := time.Now()
	var first time.Time
	tries := 0
	for n := 1; ; n++ {
		ok := g.accepts(triplet, time.Now())
		time.Sleep(settle)
		now := time.Now()
		if ok {
			if !first.IsZero() {
				learnGreylistPass(rec, now.Sub(first))
			}
			return delivery{attempts: n, took: now.Sub(start)}
		}
		if first.IsZero() {
			first = now
		}
		tries++
		in := backoff.Input{Kind: backoff.Greylisted, Attempt: n, GreylistTries: tries}
		time.Sleep(greylistWait(p, rec, in, first, now, rnd.Float64()))
	}
}

// TestGreylistWindowConverges runs phases of messages to new recipients
// through a greylister whose delay changes (25 s, 60 s, 300 s, 8 s, none,
// 25 s again). Within each phase, after a few messages, every message
// passes within 10% + 2 s of the delay, in 2 attempts, but for at most one
// check below the window (backoff.CheckEvery) refused in a third.
func TestGreylistWindowConverges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := defaultPolicy(t)
		p.GreylistFirst, p.GreylistSecond = 10*time.Second, 20*time.Second
		rnd := rand.New(rand.NewSource(1))
		rec := queue.Destination{Domain: "dest.test"}
		g := &greylister{first: map[string]time.Time{}}
		const perPhase, settled = 16, 5 // the last 5 of each phase must meet the goal
		n := 0
		for _, delay := range []time.Duration{25 * time.Second, 60 * time.Second, 300 * time.Second, 8 * time.Second, 0, 25 * time.Second} {
			g.delay = delay
			var log []string
			checks := 0
			for i := range perPhase {
				n++
				d := deliverOne(p, &rec, g, fmt.Sprintf("a@src.test b%d@dest.test", n), rnd)
				log = append(log, fmt.Sprintf("%d: %d attempts, %v (window %v..%v)", i+1, d.attempts, d.took.Round(100*time.Millisecond), rec.GreylistLow.Round(100*time.Millisecond), rec.LearnedDelay.Round(100*time.Millisecond)))
				if i < perPhase-settled {
					continue
				}
				goal := delay + delay/10 + 2*time.Second
				if delay == 0 {
					goal = time.Second
				}
				if d.attempts > 2 {
					checks++ // a check below the window, refused
				}
				if d.attempts > 3 || d.took > goal {
					t.Errorf("delay %v, message %d of the phase: %d attempts, %v after its 250; want at most 2 (3 for a refused check below the window) within %v", delay, i+1, d.attempts, d.took, goal)
				}
			}
			if checks > 1 {
				t.Errorf("delay %v: %d of the last %d messages needed 3 attempts; want at most one (a check below the window)", delay, checks, settled)
			}
			t.Logf("delay %v:\n%s", delay, joinLines(log))
			if t.Failed() {
				return
			}
		}
	})
}

func joinLines(ls []string) string {
	s := ""
	for _, l := range ls {
		s += "  " + l + "\n"
	}
	return s
}

func TestLearnGreylistPass(t *testing.T) {
	const m = time.Minute
	for _, c := range []struct {
		name      string
		low, high time.Duration
		seen      time.Duration
		wantLow   time.Duration
		wantHigh  time.Duration
	}{
		{"first observation", 0, 0, 6 * m, 0, 6 * m},
		{"a pass past the bound keeps it", 2 * m, 6 * m, 7 * m, 2 * m, 6 * m},
		{"a shorter pass teaches a shorter bound", 2 * m, 6 * m, 4 * m, 2 * m, 4 * m},
		{"a pass below the lower bound: the delay shrank", 2 * m, 6 * m, m, 0, m},
	} {
		rec := queue.Destination{GreylistLow: c.low, LearnedDelay: c.high}
		learnGreylistPass(&rec, c.seen)
		if rec.GreylistLow != c.wantLow || rec.LearnedDelay != c.wantHigh || !rec.Greylists || rec.GreylistPassed != 1 {
			t.Errorf("%s: %+v, want window %v..%v", c.name, rec, c.wantLow, c.wantHigh)
		}
	}
}

// defaultPolicy is the retry policy of configs/default.yaml.
func defaultPolicy(t *testing.T) backoff.Policy {
	t.Helper()
	cfg, err := config.Load(config.Source{Default: configs.Default})
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Retry.Policy()
}
