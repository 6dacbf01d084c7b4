// Package backoff computes when a deferred recipient is tried again and when
// it is given up. It is pure: callers pass attempt counts, times and a uniform
// random sample, so every schedule is reproducible in tests. Nothing here
// reads the clock, sleeps or keeps state.
//
// # Schedule
//
// Next picks the delay from the reason for the last deferral:
//
//   - A retry hint from the server ("try again in 10 minutes") wins for any
//     kind. It is clamped to [HintMin, HintMax] and jittered upwards only,
//     so we never come back earlier than the server asked.
//   - Greylisting with a learned delay (Window, window.go): the first retry
//     lands at the destination's learned upper bound itself (a retry that
//     long after passed), or probes inside its window; a probe refused
//     retries at the bound. Neither is clamped by HintMin: hint_min
//     guards against servers asking for silly waits, not against what we
//     measured.
//   - Greylisting at a destination with nothing learned gets the quick
//     track: the first retry GreylistFirst (30s) after the greylisting,
//     the second GreylistSecond (33s) after that, then each at 2.1 times
//     the time since the first greylisting reply, up to QuickEnd (exactly
//     5m, postgrey's default --delay=300 and Postfix's first retry):
//     30s, 63s, 2m12s, 4m38s, 5m. Early retries cost attempts, not time:
//     the first message through a 25s, 60s or 300s greylister passes at
//     most 5% past its delay plus a few seconds (at 300s, exactly when
//     Postfix's first retry would), and what it teaches is a window narrow
//     enough (the last refused and the passing retry) that a few probes
//     finish it. Jitter is upward only, up to 2%, and none on the last
//     step. From QuickEnd on, each retry doubles the time since the first
//     greylisting reply, as Postfix's backoff doubles a message's time in
//     its queue (each wait at most Max): 10m, 20m, 40m, then hourly, so
//     that a longer delay is passed no later than Postfix's defaults pass
//     it. A greylister that restarts its timer at every early retry is
//     only passed by a gap between two retries as long as its delay: the
//     gaps (30s, 33s, 69s, 2m26s, 22s, 5m, 10m, ...) clear any delay,
//     one up to 5m by the 5m gap.
//   - Everything else follows the general schedule Initial·Factor^n with
//     n = Attempt-1, capped at Max, then jittered by ±Jitter. With the
//     defaults: 5m, 10m, 20m, 40m, 1h, 1h, ... Greylisting tries count as
//     attempts, so after two quick greylist retries a generic deferral at
//     attempt 3 continues at 20m, as if the quick tries had been generic.
//   - A rate-limited deferral is one step further along the general
//     schedule (n = Attempt, so at least Initial·Factor before jitter): the
//     server told us to slow down, so a generic hiccup's first retry is too
//     eager. Destination-wide slowdown is Throttle's job (throttle.go),
//     and the delivery engine brings a rate-limited recipient back at the
//     destination's learned Pace (pace.go) instead when the server gave no
//     hint.
//
// Messages expire Lifetime (default 120h) after arrival.
//
// # Deviation from RFC 5321
//
// RFC 5321 §4.5.4.1 says "the retry interval SHOULD be at least 30 minutes;
// however, more sophisticated and variable strategies will be beneficial when
// the SMTP client can determine the reason for non-delivery". We can: the
// classifier tells greylisting and rate limiting apart from other 4xx
// replies, so the greylist track retries within the first five minutes
// (30s, 63s, 2m12s, 4m38s and 5m after the greylisting), and the
// generic track starts at 5m. That is in line with Postfix, whose first retry comes
// 5-10 minutes after a deferral whatever its reason (minimal_backoff_time and
// queue_run_delay are both 300s), while our give-up follows the RFC's "at
// least 4-5 days" (§4.5.4.1; Postfix's maximal_queue_lifetime is also 5d).
// Our 1h cap is tighter than the RFC's "one every two or three hours" and
// Postfix's 4000s; it is configurable, as the RFC requires ("The parameters
// to the retry algorithm MUST be configurable").
package backoff

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Policy holds the retry parameters. Every field is configurable (config
// keys retry.*, whose defaults are in configs/default.yaml); the zero value
// is invalid.
type Policy struct {
	Initial        time.Duration // retry.initial_interval: first generic retry
	Factor         float64       // retry.factor: growth per attempt
	Max            time.Duration // retry.max_interval: cap per delay, before jitter
	Jitter         float64       // retry.jitter: ±fraction on generic delays, upward fraction otherwise
	GreylistFirst  time.Duration // retry.greylist_first_retry: first retry after greylisting
	GreylistSecond time.Duration // retry.greylist_second_retry: second quick retry
	HintMin        time.Duration // retry.hint_min: lower clamp for server hints only
	HintMax        time.Duration // retry.hint_max: upper clamp for server hints and learned delays
	Lifetime       time.Duration // retry.lifetime: give up this long after arrival
}

// Validate reports every invalid parameter, joined into one error.
func (p Policy) Validate() error {
	var errs []error
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("backoff: %s must be positive, got %v", key, d))
		}
	}
	positive("retry.initial_interval", p.Initial)
	positive("retry.max_interval", p.Max)
	positive("retry.greylist_first_retry", p.GreylistFirst)
	positive("retry.greylist_second_retry", p.GreylistSecond)
	positive("retry.hint_min", p.HintMin)
	positive("retry.hint_max", p.HintMax)
	positive("retry.lifetime", p.Lifetime)
	if p.Initial > p.Max {
		errs = append(errs, fmt.Errorf("backoff: retry.initial_interval %v exceeds retry.max_interval %v", p.Initial, p.Max))
	}
	if p.HintMin > p.HintMax {
		errs = append(errs, fmt.Errorf("backoff: retry.hint_min %v exceeds retry.hint_max %v", p.HintMin, p.HintMax))
	}
	if !(p.Factor >= 1) || math.IsInf(p.Factor, 0) { // !(>=) also rejects NaN
		errs = append(errs, fmt.Errorf("backoff: retry.factor must be finite and >= 1, got %v", p.Factor))
	}
	if !(p.Jitter >= 0 && p.Jitter < 1) {
		errs = append(errs, fmt.Errorf("backoff: retry.jitter must be in [0, 1), got %v", p.Jitter))
	}
	return errors.Join(errs...)
}

// Kind says what the last deferral was.
type Kind int

// Deferral kinds, as decided by the classifier.
const (
	Generic     Kind = iota // any other temporary failure
	Greylisted              // the reply looked like greylisting
	RateLimited             // the destination asked us to slow down
)

// Input describes the deferral just recorded.
type Input struct {
	Kind          Kind
	Attempt       int // attempts so far, including the one that just failed (>= 1)
	GreylistTries int // consecutive greylisting deferrals so far, including this one
	// Window is what the destination's greylisting is known to be, as it
	// was before this deferral (see Window); Probe is the wait of a probe
	// chosen for this first retry (Window.Probe), 0 if none; Elapsed is
	// the time since the episode's first greylisting reply.
	Window  Window
	Probe   time.Duration
	Elapsed time.Duration
	Hint    time.Duration // retry hint parsed from the server reply, 0 if none
}

// Next returns the delay before the next attempt. rnd is a uniform sample in
// [0,1) supplied by the caller; values outside are clamped into it. Attempt
// and GreylistTries below 1 count as 1.
func (p Policy) Next(in Input, rnd float64) time.Duration {
	rnd = clampRnd(rnd)
	attempt := max(in.Attempt, 1)
	if in.Hint > 0 {
		return p.up(clampDur(in.Hint, p.HintMin, p.HintMax), rnd)
	}
	switch in.Kind {
	case Greylisted:
		tries := max(in.GreylistTries, 1)
		if d, ok := p.greylistedWindow(in, tries); ok {
			return min(d, p.HintMax)
		}
		return p.greylisted(attempt, tries, in.Elapsed, rnd)
	case RateLimited:
		return p.spread(p.general(float64(attempt)), rnd)
	default:
		return p.spread(p.general(float64(attempt-1)), rnd)
	}
}

// QuickEnd is where the quick track ends: its last retry lands exactly
// this long after the episode's first greylisting reply, with no jitter,
// so that it passes postgrey's default --delay=300 (a retry at least 300 s
// after the triplet was first seen; the reply came after that, so the
// retry does too) at the moment Postfix's first retry would, 300 s after
// its deferral by default: the first message through the most common
// greylisting setting is no slower than with Postfix.
const QuickEnd = 5 * time.Minute

// quickRatio is how the quick track's retries after the second grow: each
// lands at quickRatio times the time since the first greylisting reply.
// With the default first and second retries (30 s and 33 s later) they
// land at 30 s, 63 s, 2m12s, 4m38s and QuickEnd (5m): a delay of 25 s, 60 s or
// 300 s (the common settings of postgrey and its kin) is cleared by a
// retry at most 5% past it plus a few seconds, so that what the first
// pass teaches (backoff.Window) is a narrow window already.
const quickRatio = 2.1

// greylisted handles Kind == Greylisted without a server hint: the quick
// track (GreylistFirst, GreylistSecond, then retries growing by
// quickRatio until QuickEnd), then doubling the time so far; the general
// schedule if the episode's start is unknown.
func (p Policy) greylisted(attempt, tries int, elapsed time.Duration, rnd float64) time.Duration {
	switch {
	case tries == 1:
		return quickUp(p.GreylistFirst, rnd)
	case tries == 2:
		return quickUp(p.GreylistSecond, rnd)
	case elapsed > 0 && elapsed < QuickEnd:
		at := toDuration(float64(elapsed) * quickRatio)
		if at >= QuickEnd {
			// The last step aims at a point, not a gap: jitter would
			// only make the first message later than Postfix's.
			return max(QuickEnd-elapsed, minProbe)
		}
		return quickUp(max(at-elapsed, minProbe), rnd)
	case elapsed >= QuickEnd:
		// Past the quick track: double the time so far, as Postfix does.
		return max(min(elapsed, p.Max), p.GreylistFirst, p.GreylistSecond)
	}
	// No episode start known: general schedule, but never sooner than the
	// quick retries that already failed to pass.
	n := max(attempt, tries) - 1
	return max(p.spread(p.general(float64(n)), rnd), p.GreylistFirst, p.GreylistSecond)
}

// quickUp jitters a quick-track wait upwards by up to 2%, as the retries
// placed by a window are: enough to spread many recipients, little enough
// that what the pass teaches stays close to the delay.
func quickUp(d time.Duration, rnd float64) time.Duration {
	return d + toDuration(float64(d)*rnd/50)
}

// general returns Initial·Factor^n capped at Max. It computes in float64 and
// converts once (maddy #678 truncated the factor instead); overflow, Inf and
// NaN all yield Max.
func (p Policy) general(n float64) time.Duration {
	f := float64(p.Initial) * math.Pow(p.Factor, n)
	if math.IsNaN(f) || f >= float64(p.Max) {
		return p.Max
	}
	return max(time.Duration(f), 0)
}

// spread applies symmetric jitter: d·(1 + Jitter·(2·rnd − 1)).
func (p Policy) spread(d time.Duration, rnd float64) time.Duration {
	return toDuration(float64(d) * (1 + p.Jitter*(2*rnd-1)))
}

// up applies upward-only jitter, d·(1 + Jitter·rnd), for delays we must not
// undercut (server hints, greylist windows).
func (p Policy) up(d time.Duration, rnd float64) time.Duration {
	return toDuration(float64(d) * (1 + p.Jitter*rnd))
}

// Deadline returns the time after which a message that arrived at arrival is
// given up (and bounced with a 4.4.7 DSN).
func (p Policy) Deadline(arrival time.Time) time.Time {
	return arrival.Add(p.Lifetime)
}

// Expired reports whether now is at or past the message's deadline.
func (p Policy) Expired(arrival, now time.Time) bool {
	return !now.Before(p.Deadline(arrival))
}

// toDuration rounds f to a Duration, saturating instead of overflowing and
// never returning a negative value.
func toDuration(f float64) time.Duration {
	switch {
	case math.IsNaN(f) || f <= 0:
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	}
	return time.Duration(math.Round(f))
}

func clampDur(d, lo, hi time.Duration) time.Duration {
	return min(max(d, lo), hi)
}

func clampRnd(r float64) float64 {
	switch {
	case math.IsNaN(r) || r < 0:
		return 0
	case r >= 1:
		return math.Nextafter(1, 0)
	}
	return r
}
