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
	check    bool // the first retry checked below the window's lower bound
}

// deliverOne sends a message to a new recipient through g, as the engine
// does: each greylisting reply is learned and places the retry
// (greylistWait), the pass is learned (learnGreylistPass). The relay's
// clock lags the greylister's by the time it takes to settle an attempt.
func deliverOne(p backoff.Policy, rec *queue.Destination, g *greylister, triplet string, rnd *rand.Rand) delivery {
	const settle = 50 * time.Millisecond
	start := time.Now()
	var first time.Time
	tries, check := 0, false
	for n := 1; ; n++ {
		ok := g.accepts(triplet, time.Now())
		time.Sleep(settle)
		now := time.Now()
		if ok {
			if !first.IsZero() {
				learnGreylistPass(rec, now.Sub(first), now)
			}
			return delivery{attempts: n, took: now.Sub(start), check: check}
		}
		if first.IsZero() {
			first = now
		}
		tries++
		in := backoff.Input{Kind: backoff.Greylisted, Attempt: n, GreylistTries: tries}
		low := rec.GreylistLow
		wait := greylistWait(p, rec, in, first, now, rnd.Float64())
		check = check || (tries == 1 && wait <= low)
		time.Sleep(wait)
	}
}

// phase is a stretch of messages through a greylister with one delay: the
// first handful may take longer while the window is learned again, every
// later one must pass within 10% + 2 s of the delay in at most 2 attempts
// (1 if nothing is greylisted). gap is the idle time between messages.
type phase struct {
	delay    time.Duration
	messages int
	handful  int
	gap      time.Duration
}

// TestGreylistWindowConverges runs messages to new recipients, one after
// the other, through a greylister whose delay changes, for a few quick-track
// settings: after the first handful of each phase (the first message
// learns, the next few probe inside the window), no message passes later
// than the goal, and none takes a third attempt but for a check below the
// window, at most one an hour (backoff.CheckAfter). A shorter delay is seen
// only by such a check, so that phase spaces its messages and allows for
// the wait.
func TestGreylistWindowConverges(t *testing.T) {
	const m = time.Minute
	for _, c := range []struct {
		name          string
		first, second time.Duration
		phases        []phase
	}{
		{"quick 10s/20s", 10 * time.Second, 20 * time.Second, []phase{
			{25 * time.Second, 12, 5, 0},
			{60 * time.Second, 12, 5, 0}, // longer; the quick track's third retry (2.1 × the time so far) leaves one more probe
			{300 * time.Second, 12, 5, 0},
			{8 * time.Second, 12, 6, 10 * m}, // shorter: the next check, then a few
			{0, 5, 0, 0},                     // whitelisted
			{25 * time.Second, 12, 5, 0},
		}},
		{"integration's 20s/10s", 20 * time.Second, 10 * time.Second, []phase{
			{25 * time.Second, 12, 4, 0}, // one more probe since the quick track's third retry comes at 2.1 × the time so far
			{60 * time.Second, 12, 4, 0},
		}},
		{"integration's 45s/30s, 60s", 45 * time.Second, 30 * time.Second, []phase{
			{60 * time.Second, 8, 4, 0},
		}},
		{"defaults 30s/33s, 60s", 0, 0, []phase{
			{60 * time.Second, 16, 4, 0}, // the quick track leaves a window of 30..63 s: a few probes
		}},
		{"defaults 30s/33s", 0, 0, []phase{
			{300 * time.Second, 12, 4, 0},
			{60 * time.Second, 12, 7, 10 * m}, // shorter
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := defaultPolicy(t)
				if c.first > 0 {
					p.GreylistFirst, p.GreylistSecond = c.first, c.second
				}
				rnd := rand.New(rand.NewSource(1))
				rec := queue.Destination{Domain: "dest.test"}
				g := &greylister{first: map[string]time.Time{}}
				n, lastCheck := 0, time.Time{}
				for _, ph := range c.phases {
					g.delay = ph.delay
					var log []string
					for i := range ph.messages {
						n++
						time.Sleep(ph.gap)
						d := deliverOne(p, &rec, g, fmt.Sprintf("a@src.test b%d@dest.test", n), rnd)
						log = append(log, fmt.Sprintf("%d: %d attempts%s, %v (window %v..%v)", i+1, d.attempts, map[bool]string{true: " (check)"}[d.check], d.took.Round(100*time.Millisecond), rec.GreylistLow.Round(100*time.Millisecond), rec.LearnedDelay.Round(100*time.Millisecond)))
						if i < ph.handful {
							continue
						}
						goal, attempts := ph.delay+ph.delay/10+2*time.Second, 2
						if ph.delay == 0 {
							goal, attempts = time.Second, 1
						}
						if d.attempts == 3 && d.check && time.Since(lastCheck) >= backoff.CheckAfter {
							lastCheck, attempts = time.Now(), 3 // the hourly check, refused
						}
						if d.attempts > attempts || d.took > goal {
							t.Errorf("delay %v, message %d of the phase: %d attempts, %v after its 250; want at most %d within %v", ph.delay, i+1, d.attempts, d.took, attempts, goal)
						}
					}
					t.Logf("delay %v:\n%s", ph.delay, joinLines(log))
				}
			})
		})
	}
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
		learnGreylistPass(&rec, c.seen, time.Time{})
		if rec.GreylistLow != c.wantLow || rec.LearnedDelay != c.wantHigh || !rec.Greylists || rec.GreylistPassed != 1 {
			t.Errorf("%s: %+v, want window %v..%v", c.name, rec, c.wantLow, c.wantHigh)
		}
	}
}

// TestToStart: a greylisting pass is learned up to the passing attempt's
// start, the way a later retry's wait is placed, not up to its settlement
// (which would add the passing transaction to every later message).
func TestToStart(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		wait    time.Duration
		started time.Time
		want    time.Duration
	}{
		{"a transaction of 2 s", 302 * time.Second, now.Add(-2 * time.Second), 300 * time.Second},
		{"start unknown", 302 * time.Second, time.Time{}, 302 * time.Second},
		{"start after now", 302 * time.Second, now.Add(time.Second), 302 * time.Second},
		{"start before the wait began", 30 * time.Second, now.Add(-time.Minute), 30 * time.Second},
	} {
		if got := toStart(c.wait, c.started, now); got != c.want {
			t.Errorf("%s: toStart(%v) = %v, want %v", c.name, c.wait, got, c.want)
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
