package backoff

import (
	"strings"
	"testing"
	"time"
)

// TestWindowProbe checks which first retries probe: inside a wide window
// (its middle in the goal's measure), from the top while nothing is known
// to be refused, never inside a narrow one or past the budget, and below
// a narrow window at most once per CheckAfter.
func TestWindowProbe(t *testing.T) {
	const s = time.Second
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name   string
		w      Window
		want   time.Duration // 0: no probe
		checks bool          // the probe is a check below Low
	}{
		{"nothing learned", Window{}, 0, false},
		{"wide window: split", Window{Low: 20 * s, High: 30 * s, Checked: now}, split(20*s, 30*s), false},
		{"no lower bound: from the top", Window{High: 340 * s, Checked: now}, narrowBelow(340 * s), false},
		{"no lower bound, top-down spent: split from zero", Window{High: 340 * s, Probes: topDown, Checked: now}, split(0, 340*s), false},
		{"narrow: no probe", Window{Low: 24500 * time.Millisecond, High: 25500 * time.Millisecond, Checked: now}, 0, false},
		{"narrow, checked an hour ago: check", Window{Low: 24 * s, High: 25 * s, Checked: now.Add(-CheckAfter)}, 12 * s, true},
		{"budget spent, checked lately: no probe", Window{Low: 20 * s, High: 40 * s, Probes: ProbeBudget, Checked: now.Add(-time.Minute)}, 0, false},
		{"probe under way", Window{Low: 20 * s, High: 30 * s, ProbeUntil: now.Add(s), Checked: now}, 0, false},
		{"never checked: the clock starts", Window{Low: 24 * s, High: 25 * s}, 0, false},
	} {
		at, w := c.w.Probe(now)
		if at != c.want {
			t.Errorf("%s: probe at %v, want %v", c.name, at, c.want)
		}
		if at > 0 && (w.Probes != c.w.Probes+1 || !w.ProbeUntil.After(now)) {
			t.Errorf("%s: window after the probe %+v, want it counted and under way", c.name, w)
		}
		if got := w.Checked.Equal(now) && !c.w.Checked.Equal(now); got != (c.checks || (c.w.Checked.IsZero() && c.w.High > 0)) {
			t.Errorf("%s: Checked %v, want it set to now only for a check (or the first look)", c.name, w.Checked)
		}
	}
}

// TestWindowSplitHalvesTheGoalMeasure checks that probes at split narrow
// a window of a factor of two in four answers, whatever they are, and
// that narrowBelow's refusal leaves a narrow window.
func TestWindowSplitHalvesTheGoalMeasure(t *testing.T) {
	for _, high := range []time.Duration{10 * time.Second, 30 * time.Second, 5 * time.Minute, time.Hour} {
		for answers := range 16 {
			w := Window{Low: high / 2, High: high}
			for k := range 4 {
				p := split(w.Low, w.High)
				if answers&(1<<k) != 0 {
					w.High = p
				} else {
					w.Low = p
				}
			}
			if !w.Narrow() {
				t.Errorf("window %v..%v after four probes (answers %04b): not narrow", w.Low, w.High, answers)
			}
		}
		if w := (Window{Low: narrowBelow(high), High: high}); !w.Narrow() {
			t.Errorf("a refusal at narrowBelow(%v) = %v leaves %v..%v, not narrow", high, narrowBelow(high), w.Low, w.High)
		}
	}
}

// TestWindowRefused checks what a refusal teaches: inside the window it
// raises Low; at High, within a greylister's clock resolution, it moves
// High a second past it (the pass at High came by a second's edge) and
// keeps what was learned; further past High the delay grew, and the
// window starts again from the refusal.
func TestWindowRefused(t *testing.T) {
	const s, ms = time.Second, time.Millisecond
	w := Window{Low: 20 * s, High: 25 * s, Probes: 3}
	for _, c := range []struct {
		name    string
		elapsed time.Duration
		want    Window
	}{
		{"a probe inside", 22 * s, Window{Low: 22 * s, High: 25 * s, Probes: 3}},
		{"at High, a second's edge", 25300 * ms, Window{Low: 25300 * ms, High: 26300 * ms, Probes: 3}},
		{"at High, a second's edge, again: the delay grew", 26300 * ms, Window{Low: 26300 * ms}},
		{"past High: the delay grew", 26500 * ms, Window{Low: 26500 * ms}},
		{"nothing measured", 0, w},
	} {
		from := w
		if strings.HasSuffix(c.name, "again: the delay grew") {
			from = w.Refused(25300 * ms)
		}
		if got := from.Refused(c.elapsed); got != c.want {
			t.Errorf("%s: Refused(%v) = %+v, want %+v", c.name, c.elapsed, got, c.want)
		}
	}
}
