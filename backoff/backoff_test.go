package backoff

import (
	"math"
	"strings"
	"testing"
	"time"
)

const (
	sec    = time.Second
	minute = time.Minute
	ms     = time.Millisecond
)

func TestNext_ExactSchedule(t *testing.T) {
	p := DefaultPolicy()
	cases := []struct {
		name string
		in   Input
		rnd  float64
		want time.Duration
	}{
		// General schedule, ±10% jitter: 5m, 10m, 20m, 40m, capped at 1h.
		{"generic 1 mid", Input{Attempt: 1}, 0.5, 5 * minute},
		{"generic 2 mid", Input{Attempt: 2}, 0.5, 10 * minute},
		{"generic 3 mid", Input{Attempt: 3}, 0.5, 20 * minute},
		{"generic 4 mid", Input{Attempt: 4}, 0.5, 40 * minute},
		{"generic 5 capped", Input{Attempt: 5}, 0.5, time.Hour},
		{"generic 50 capped", Input{Attempt: 50}, 0.5, time.Hour},
		{"generic 1 low", Input{Attempt: 1}, 0, 4*minute + 30*sec},
		{"generic 3 low", Input{Attempt: 3}, 0, 18 * minute},
		{"generic 5 low", Input{Attempt: 5}, 0, 54 * minute},
		{"generic 1 high", Input{Attempt: 1}, 0.999, 5*minute + 29940*ms},
		{"generic 4 high", Input{Attempt: 4}, 0.999, 43*minute + 59520*ms},
		{"generic 5 high", Input{Attempt: 5}, 0.999, time.Hour + 5*minute + 59280*ms},
		{"attempt 0 counts as 1", Input{Attempt: 0}, 0.5, 5 * minute},
		{"negative attempt", Input{Attempt: -7}, 0.5, 5 * minute},
		{"unknown kind is generic", Input{Kind: Kind(42), Attempt: 2}, 0.5, 10 * minute},

		// Rate limited: one step ahead of generic.
		{"ratelimited 1 mid", Input{Kind: RateLimited, Attempt: 1}, 0.5, 10 * minute},
		{"ratelimited 1 low", Input{Kind: RateLimited, Attempt: 1}, 0, 9 * minute},
		{"ratelimited 1 high", Input{Kind: RateLimited, Attempt: 1}, 0.999, 10*minute + 59880*ms},
		{"ratelimited 3 mid", Input{Kind: RateLimited, Attempt: 3}, 0.5, 40 * minute},
		{"ratelimited 4 capped", Input{Kind: RateLimited, Attempt: 4}, 0.5, time.Hour},

		// Greylist quick track: upward jitter only, up to 2%; retries at
		// 30 s, 63 s, then 2.1 times the time so far up to QuickEnd (no
		// jitter on that last step), then doubling the time so far up to
		// Max; the general schedule if the episode's start is unknown.
		{"greylist first low", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1}, 0, 30 * sec},
		{"greylist first mid", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1}, 0.5, 30300 * ms},
		{"greylist first high", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1}, 0.999, 30599400 * time.Microsecond},
		{"greylist tries 0 is first", Input{Kind: Greylisted, Attempt: 1}, 0, 30 * sec},
		{"greylist second low", Input{Kind: Greylisted, Attempt: 2, GreylistTries: 2}, 0, 33 * sec},
		{"greylist second mid", Input{Kind: Greylisted, Attempt: 2, GreylistTries: 2}, 0.5, 33330 * ms},
		{"greylist third ladder", Input{Kind: Greylisted, Attempt: 3, GreylistTries: 3, Elapsed: 63 * sec}, 0, 69300 * ms},
		{"greylist fourth ladder", Input{Kind: Greylisted, Attempt: 4, GreylistTries: 4, Elapsed: 132300 * ms}, 0, 145530 * ms},
		{"greylist ladder ends at QuickEnd", Input{Kind: Greylisted, Attempt: 5, GreylistTries: 5, Elapsed: 277830 * ms}, 0, QuickEnd - 277830*ms},
		{"greylist ladder's end is not jittered", Input{Kind: Greylisted, Attempt: 5, GreylistTries: 5, Elapsed: 280 * sec}, 0.999, 20 * sec},
		{"greylist QuickEnd is postgrey's default", Input{Kind: Greylisted, Attempt: 5, GreylistTries: 5, Elapsed: 277830 * ms}, 0.5, 300*sec - 277830*ms},
		{"greylist third general", Input{Kind: Greylisted, Attempt: 3, GreylistTries: 3}, 0.5, 20 * minute},
		{"greylist past QuickEnd doubles", Input{Kind: Greylisted, Attempt: 6, GreylistTries: 6, Elapsed: QuickEnd}, 0.9, 5 * minute},
		{"greylist doubling again", Input{Kind: Greylisted, Attempt: 7, GreylistTries: 7, Elapsed: 10 * minute}, 0.9, 10 * minute},
		{"greylist doubling capped", Input{Kind: Greylisted, Attempt: 9, GreylistTries: 9, Elapsed: 80 * minute}, 0.9, time.Hour},
		{"greylist third low", Input{Kind: Greylisted, Attempt: 3, GreylistTries: 3}, 0, 18 * minute},
		{"greylist tries ahead of attempt", Input{Kind: Greylisted, Attempt: 2, GreylistTries: 5}, 0.5, time.Hour},
		{"generic after greylisting continues", Input{Kind: Generic, Attempt: 3}, 0.5, 20 * minute},

		// Learned window: at High itself (no margin, no jitter), never
		// floored at HintMin; a probe as chosen; a refused probe at High;
		// a refusal at High by a second's edge a second later.
		{"window 25s", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1, Window: Window{Low: 24 * sec, High: 25 * sec}}, 0, 25 * sec},
		{"window 25s high", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1, Window: Window{Low: 24 * sec, High: 25 * sec}}, 0.999, 25 * sec},
		{"window 5m", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1, Window: Window{High: 5 * minute}}, 0, 5 * minute},
		{"window refused at High: a second later", Input{Kind: Greylisted, Attempt: 2, GreylistTries: 2, Window: Window{Low: 20 * sec, High: 25 * sec}, Elapsed: 25200 * ms}, 0.9, 1 * sec},
		{"window refused again at an edge's High: the delay grew", Input{Kind: Greylisted, Attempt: 3, GreylistTries: 3, Window: Window{Low: 25200 * ms, High: 26200 * ms}, Elapsed: 26300 * ms}, 0.9, 26300 * ms},
		{"window refused at High, late: still a second", Input{Kind: Greylisted, Attempt: 2, GreylistTries: 2, Window: Window{Low: 240 * sec, High: 300 * sec}, Elapsed: 300500 * ms}, 0.9, 1 * sec},
		{"window 10h capped", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1, Window: Window{High: 10 * time.Hour}}, 0, 4 * time.Hour},
		{"window probe", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1, Window: Window{Low: 10 * sec, High: 30 * sec}, Probe: 20 * sec}, 0.9, 20 * sec},
		{"window probe refused", Input{Kind: Greylisted, Attempt: 2, GreylistTries: 2, Window: Window{Low: 10 * sec, High: 30 * sec}, Elapsed: 20 * sec}, 0.9, 10 * sec},
		{"window no high yet", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1, Window: Window{Low: 26 * sec}}, 0.9, 52 * sec},
		{"window grew: doubling", Input{Kind: Greylisted, Attempt: 2, GreylistTries: 2, Window: Window{Low: 24 * sec, High: 25 * sec}, Elapsed: 26 * sec}, 0.9, 26 * sec},
		{"window grew: doubling past second", Input{Kind: Greylisted, Attempt: 2, GreylistTries: 2, Window: Window{High: 25 * sec}, Elapsed: 11 * minute}, 0, 11 * minute},
		{"window grew: doubling capped", Input{Kind: Greylisted, Attempt: 3, GreylistTries: 3, Window: Window{High: 25 * sec}, Elapsed: 3 * time.Hour}, 0, time.Hour},

		// Server hints win for any kind, clamped, upward jitter only.
		{"hint generic", Input{Attempt: 1, Hint: 10 * minute}, 0, 10 * minute},
		{"hint generic mid", Input{Attempt: 1, Hint: 10 * minute}, 0.5, 10*minute + 30*sec},
		{"hint greylist", Input{Kind: Greylisted, Attempt: 1, GreylistTries: 1, Window: Window{High: 3 * minute}, Hint: 2 * minute}, 0, 2 * minute},
		{"hint ratelimited", Input{Kind: RateLimited, Attempt: 9, Hint: 90 * sec}, 0, 90 * sec},
		{"hint below minute", Input{Attempt: 1, Hint: 10 * sec}, 0, minute},
		{"hint above max", Input{Attempt: 1, Hint: 24 * time.Hour}, 0, 4 * time.Hour},
		{"hint above max high", Input{Attempt: 1, Hint: 24 * time.Hour}, 0.999, 4*time.Hour + 1438560*ms},
		{"negative hint ignored", Input{Attempt: 2, Hint: -time.Hour}, 0.5, 10 * minute},

		// Out-of-range samples are clamped into [0,1).
		{"rnd negative", Input{Attempt: 1}, -3, 4*minute + 30*sec},
		{"rnd NaN", Input{Attempt: 1}, math.NaN(), 4*minute + 30*sec},
		{"rnd above 1", Input{Attempt: 1}, 7, 5*minute + 30*sec},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := p.Next(c.in, c.rnd); got != c.want {
				t.Errorf("Next(%+v, %v) = %v, want %v", c.in, c.rnd, got, c.want)
			}
		})
	}
}

// TestNext_GreylistFloor checks that a persistent greylister is never retried
// sooner than the quick track, even with a short general schedule.
func TestNext_GreylistFloor(t *testing.T) {
	p := DefaultPolicy()
	p.Initial = time.Minute
	p.GreylistFirst, p.GreylistSecond = 5*time.Minute+30*time.Second, 10*time.Minute
	for _, rnd := range []float64{0, 0.5, 0.999} {
		got := p.Next(Input{Kind: Greylisted, Attempt: 3, GreylistTries: 3}, rnd)
		if got != p.GreylistSecond {
			t.Errorf("rnd %v: got %v, want floor %v", rnd, got, p.GreylistSecond)
		}
	}
}

func TestNext_MonotonicCappedNonNegative(t *testing.T) {
	for _, pol := range []struct {
		name string
		p    Policy
	}{
		{"default", DefaultPolicy()},
		{"factor 1", func() Policy { p := DefaultPolicy(); p.Factor = 1; return p }()},
		{"factor 1.25 no jitter", func() Policy { p := DefaultPolicy(); p.Factor = 1.25; p.Jitter = 0; return p }()},
		{"factor 10 huge max", func() Policy { p := DefaultPolicy(); p.Factor = 10; p.Max = math.MaxInt64; return p }()},
	} {
		p := pol.p
		upper := float64(p.Max) * (1 + p.Jitter)
		for _, kind := range []Kind{Generic, RateLimited, Greylisted} {
			prev := time.Duration(0)
			for a := 1; a <= 200; a++ {
				in := Input{Kind: kind, Attempt: a, GreylistTries: a + 2}
				base := p.Next(in, 0.5) // rnd 0.5 is exactly "no jitter"
				if base < prev {
					t.Fatalf("%s kind %d attempt %d: %v < previous %v", pol.name, kind, a, base, prev)
				}
				prev = base
				for _, rnd := range []float64{0, 0.5, 0.999} {
					d := p.Next(in, rnd)
					if d < 0 || float64(d) > upper {
						t.Fatalf("%s kind %d attempt %d rnd %v: %v outside [0, %v]", pol.name, kind, a, rnd, d, upper)
					}
				}
			}
			if pol.name == "default" && prev != p.Max {
				t.Errorf("%s kind %d: attempt 200 = %v, want Max %v", pol.name, kind, prev, p.Max)
			}
		}
	}
}

func TestNext_Overflow(t *testing.T) {
	p := DefaultPolicy()
	p.Factor = 10
	for _, a := range []int{1 << 30, math.MaxInt, 64, 1000} {
		for _, kind := range []Kind{Generic, RateLimited} {
			if got := p.Next(Input{Kind: kind, Attempt: a}, 0.5); got != p.Max {
				t.Errorf("kind %d attempt %d: got %v, want Max %v", kind, a, got, p.Max)
			}
			if got := p.Next(Input{Kind: kind, Attempt: a}, 0.999); got <= p.Max || float64(got) > float64(p.Max)*1.1 {
				t.Errorf("kind %d attempt %d high: got %v", kind, a, got)
			}
		}
	}
	// Max at the top of the Duration range: jitter must saturate, not wrap.
	p.Max = math.MaxInt64
	if got := p.Next(Input{Attempt: 1 << 30}, 0.999); got != math.MaxInt64 {
		t.Errorf("saturation: got %v, want MaxInt64", got)
	}
}

func TestValidate(t *testing.T) {
	mod := func(f func(*Policy)) Policy { p := DefaultPolicy(); f(&p); return p }
	cases := []struct {
		name string
		p    Policy
		want string // "" means valid
	}{
		{"default", DefaultPolicy(), ""},
		{"factor 1 ok", mod(func(p *Policy) { p.Factor = 1 }), ""},
		{"jitter 0 ok", mod(func(p *Policy) { p.Jitter = 0 }), ""},
		{"initial equals max ok", mod(func(p *Policy) { p.Initial = p.Max }), ""},
		{"hint minute equals max ok", mod(func(p *Policy) { p.HintMin = p.HintMax }), ""},
		{"zero policy", Policy{}, "retry.initial_interval must be positive"},
		{"initial zero", mod(func(p *Policy) { p.Initial = 0 }), "retry.initial_interval must be positive"},
		{"max negative", mod(func(p *Policy) { p.Max = -time.Hour }), "retry.max_interval must be positive"},
		{"greylist first zero", mod(func(p *Policy) { p.GreylistFirst = 0 }), "retry.greylist_first_retry"},
		{"greylist second negative", mod(func(p *Policy) { p.GreylistSecond = -1 }), "retry.greylist_second_retry"},
		{"hint minute zero", mod(func(p *Policy) { p.HintMin = 0 }), "retry.hint_min must be positive"},
		{"hint max zero", mod(func(p *Policy) { p.HintMax = 0 }), "retry.hint_max must be positive"},
		{"lifetime zero", mod(func(p *Policy) { p.Lifetime = 0 }), "retry.lifetime"},
		{"initial above max", mod(func(p *Policy) { p.Initial = 2 * time.Hour }), "exceeds retry.max_interval"},
		{"hint minute above max", mod(func(p *Policy) { p.HintMin = 5 * time.Hour }), "retry.hint_min 5h0m0s exceeds"},
		{"factor below 1", mod(func(p *Policy) { p.Factor = 0.5 }), "retry.factor"},
		{"factor zero", mod(func(p *Policy) { p.Factor = 0 }), "retry.factor"},
		{"factor NaN", mod(func(p *Policy) { p.Factor = math.NaN() }), "retry.factor"},
		{"factor Inf", mod(func(p *Policy) { p.Factor = math.Inf(1) }), "retry.factor"},
		{"jitter 1", mod(func(p *Policy) { p.Jitter = 1 }), "retry.jitter"},
		{"jitter negative", mod(func(p *Policy) { p.Jitter = -0.1 }), "retry.jitter"},
		{"jitter NaN", mod(func(p *Policy) { p.Jitter = math.NaN() }), "retry.jitter"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.p.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case c.want != "" && err == nil:
				t.Errorf("no error, want %q", c.want)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

func TestValidate_ReportsAll(t *testing.T) {
	err := Policy{}.Validate()
	for _, key := range []string{"initial_interval", "max_interval", "greylist_first_retry", "greylist_second_retry", "hint_min", "hint_max", "lifetime", "factor"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("zero policy error %v does not mention %s", err, key)
		}
	}
	if strings.Contains(err.Error(), "retry.jitter must") {
		t.Errorf("jitter 0 is valid but was reported: %v", err)
	}
}

func TestDeadlineExpired(t *testing.T) {
	p := DefaultPolicy()
	arrival := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	if got, want := p.Deadline(arrival), arrival.Add(120*time.Hour); !got.Equal(want) {
		t.Fatalf("Deadline = %v, want %v", got, want)
	}
	cases := []struct {
		now  time.Time
		want bool
	}{
		{arrival, false},
		{arrival.Add(-time.Hour), false},
		{arrival.Add(120*time.Hour - time.Nanosecond), false},
		{arrival.Add(120 * time.Hour), true},
		{arrival.Add(200 * time.Hour), true},
	}
	for _, c := range cases {
		if got := p.Expired(arrival, c.now); got != c.want {
			t.Errorf("Expired(now=%v) = %v, want %v", c.now.Sub(arrival), got, c.want)
		}
	}
}

func FuzzNext(f *testing.F) {
	d := DefaultPolicy()
	f.Add(int(Generic), 1, 0, int64(0), int64(0), 0.5, int64(d.Initial), int64(d.Max), d.Factor, d.Jitter)
	f.Add(int(Greylisted), 1, 1, int64(3*minute), int64(0), 0.999, int64(d.Initial), int64(d.Max), d.Factor, d.Jitter)
	f.Add(int(Greylisted), 3, 3, int64(0), int64(0), 0.0, int64(minute), int64(d.Max), 1.0, 0.0)
	f.Add(int(RateLimited), 1<<30, 0, int64(0), int64(0), 0.999, int64(d.Initial), int64(math.MaxInt64), 10.0, 0.99)
	f.Add(int(Generic), -5, -5, int64(-1), int64(24*time.Hour), math.NaN(), int64(0), int64(-1), math.Inf(1), -1.0)
	f.Fuzz(func(t *testing.T, kind, attempt, tries int, learned, hint int64, rnd float64, initial, maxD int64, factor, jitter float64) {
		p := DefaultPolicy()
		p.Initial, p.Max, p.Factor, p.Jitter = time.Duration(initial), time.Duration(maxD), factor, jitter
		in := Input{Kind: Kind(kind), Attempt: attempt, GreylistTries: tries, Window: Window{High: time.Duration(learned)}, Hint: time.Duration(hint)}
		got := p.Next(in, rnd) // must not panic, even for an invalid policy
		if p.Validate() != nil {
			return
		}
		hi := float64(max(p.HintMax, p.Max, p.GreylistFirst, p.GreylistSecond)) * (1 + p.Jitter)
		if got < 0 || float64(got) > hi+1 {
			t.Fatalf("Next(%+v, %v) = %v outside [0, %v] for %+v", in, rnd, got, time.Duration(hi), p)
		}
		if in.Hint > 0 && got < min(max(in.Hint, p.HintMin), p.HintMax) {
			t.Fatalf("Next(%+v) = %v earlier than the clamped hint", in, got)
		}
		if in.Hint <= 0 && in.Kind == Greylisted && !in.Window.Known() && got < p.GreylistFirst && in.GreylistTries != 2 {
			t.Fatalf("Next(%+v) = %v earlier than GreylistFirst", in, got)
		}
	})
}

func TestThrottle_Transitions(t *testing.T) {
	p := DefaultPolicy()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	var th Throttle
	if th.Concurrency(8) != 8 || th.Paused(t0) {
		t.Fatalf("zero Throttle should be healthy: %+v", th)
	}

	steps := []struct {
		name      string
		apply     func(Throttle) Throttle
		wantLevel int
		wantUntil time.Time
		wantConc  int
	}{
		{"first rate limit without hint: no pause (pacing spaces it)",
			func(s Throttle) Throttle { return p.OnRateLimited(s, t0, 0, 0.5) }, 1, time.Time{}, 1},
		{"second rate limit without hint",
			func(s Throttle) Throttle { return p.OnRateLimited(s, t0.Add(6*minute), 0, 0.5) }, 2, time.Time{}, 1},
		{"hint honoured, jitter upward",
			func(s Throttle) Throttle { return p.OnRateLimited(s, t0.Add(20*minute), 30*minute, 0) }, 3, t0.Add(50 * minute), 1},
		{"shorter new pause keeps the longer one",
			func(s Throttle) Throttle { return p.OnRateLimited(s, t0.Add(21*minute), 90*sec, 0) }, 4, t0.Add(50 * minute), 1},
		{"hint clamped to HintMax",
			func(s Throttle) Throttle { return p.OnRateLimited(s, t0.Add(time.Hour), 48*time.Hour, 0) }, 5, t0.Add(5 * time.Hour), 1},
		{"success 1", Throttle.OnSuccess, 4, t0.Add(5 * time.Hour), 1},
		{"success 2", Throttle.OnSuccess, 3, t0.Add(5 * time.Hour), 1},
		{"success 3", Throttle.OnSuccess, 2, t0.Add(5 * time.Hour), 1},
		{"success 4", Throttle.OnSuccess, 1, t0.Add(5 * time.Hour), 1},
		{"success 5: healthy", Throttle.OnSuccess, 0, t0.Add(5 * time.Hour), 8},
		{"success when healthy stays 0", Throttle.OnSuccess, 0, t0.Add(5 * time.Hour), 8},
	}
	for _, s := range steps {
		th = s.apply(th)
		if th.Level != s.wantLevel || !th.Until.Equal(s.wantUntil) || th.Concurrency(8) != s.wantConc {
			t.Fatalf("%s: got %+v conc %d, want level %d until %v conc %d",
				s.name, th, th.Concurrency(8), s.wantLevel, s.wantUntil, s.wantConc)
		}
	}
}

func TestThrottle_PausedAndBounds(t *testing.T) {
	p := DefaultPolicy()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	th := p.OnRateLimited(Throttle{}, t0, 5*minute, 0)
	if want := t0.Add(5 * minute); !th.Until.Equal(want) {
		t.Fatalf("Until = %v, want %v", th.Until, want)
	}
	for _, c := range []struct {
		now  time.Time
		want bool
	}{
		{t0, true},
		{th.Until.Add(-time.Nanosecond), true},
		{th.Until, false},
		{th.Until.Add(time.Hour), false},
	} {
		if got := th.Paused(c.now); got != c.want {
			t.Errorf("Paused(%v) = %v, want %v", c.now.Sub(t0), got, c.want)
		}
	}
	if got := (Throttle{Level: 3}).Concurrency(0); got != 0 {
		t.Errorf("Concurrency(0) while throttled = %d, want 0 (never above the limit)", got)
	}
	top := p.OnRateLimited(Throttle{Level: math.MaxInt}, t0, 0, 0.5)
	if top.Level != maxLevel || !top.Until.IsZero() {
		t.Errorf("saturated level: got %+v, want level %d, no pause", top, maxLevel)
	}
	neg := p.OnRateLimited(Throttle{Level: -4}, t0, 0, 0.5)
	if neg.Level != 1 {
		t.Errorf("negative level: got %d, want 1", neg.Level)
	}
}
