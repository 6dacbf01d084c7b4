package main

import (
	"strings"
	"testing"
	"time"
)

// grey builds a greylisting result from attempts and seconds per message.
func grey(system string, attempts []int, seconds ...float64) greyResult {
	g := greyResult{system: system, attempts: attempts}
	for _, s := range seconds {
		g.took = append(g.took, time.Duration(s*float64(time.Second)))
	}
	return g
}

func TestGreyGoals(t *testing.T) {
	const delay = 25 * time.Second // near = 29.5 s
	ref := grey("postfix", []int{2, 2, 2, 2, 2, 2}, 300.2, 300, 300, 300, 300, 300)
	tests := []struct {
		name string
		g    greyResult
		ref  *greyResult
		want []string // per goal: "met" or the start of the failure detail
	}{
		{"all met", grey("greyrelay", []int{2, 3, 3, 2, 2, 2}, 30.4, 28, 27, 29.5, 27, 26.9), &ref,
			[]string{"met", "met", "met", "met"}},
		{"slower than the reference, later too slow, too many attempts, slower than message 1",
			grey("greyrelay", []int{4, 3, 3, 2, 2, 3}, 301, 28, 27, 29.6, 302, 27), &ref,
			[]string{"301.0 s vs 300.2 s", "message 4: 29.6 s, and 1 more", "message 6: 3 attempts", "message 5: 302.0 s"}},
		{"stopped early", grey("greyrelay", []int{2, 2, 2}, 30, 28, 27), &ref,
			[]string{"met", "message 4 not delivered", "message 6 not delivered", "message 4 not delivered"}},
		{"no reference", grey("greyrelay", []int{2, 2, 2, 2, 2, 2}, 30, 28, 27, 27, 27, 27), nil,
			[]string{"30.0 s; no reference", "met", "met", "met"}},
		{"nothing delivered", grey("greyrelay", nil), &ref,
			[]string{"message 1 not delivered", "message 4 not delivered", "message 6 not delivered", "message 2 not delivered"}},
	}
	for _, tc := range tests {
		got := greyGoals(delay, &tc.g, tc.ref, 6)
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %d goals, want %d", tc.name, len(got), len(tc.want))
		}
		for i, w := range tc.want {
			if w == "met" {
				if !got[i].met {
					t.Errorf("%s: goal %d not met: %s", tc.name, i+1, got[i].detail)
				}
				continue
			}
			if got[i].met || !strings.HasPrefix(got[i].detail, w) {
				t.Errorf("%s: goal %d = %v %q, want not met %q", tc.name, i+1, got[i].met, got[i].detail, w)
			}
		}
	}
}

// Fewer messages than a goal counts from: not measured, never met.
func TestGreyGoalsTooFewMessages(t *testing.T) {
	g := grey("greyrelay", []int{2, 2, 2}, 30, 28, 27)
	got := greyGoals(25*time.Second, &g, nil, 3)
	if got[0].met || !got[0].unknown || got[1].met || !got[1].unknown || got[1].detail != "not measured (3 messages)" ||
		!got[2].unknown || !got[3].met {
		t.Errorf("got %+v", got)
	}
}

func TestPrintGreyGoals(t *testing.T) {
	greys := []greyResult{
		grey("greyrelay", []int{2, 2, 2, 2, 2, 2}, 30, 28, 27, 27, 27, 27),
		{system: "greyrelay-compressed", skipped: true},
		grey("postfix", []int{2, 2, 2, 2, 2, 2}, 300, 300, 300, 300, 300, 300),
		grey("postfix-tuned", []int{4, 4, 4, 4, 4, 4}, 40, 40, 40, 40, 40, 40),
	}
	var b strings.Builder
	printGreyGoals(&b, 25*time.Second, 6, greys)
	for _, want := range []string{
		"| goal | greyrelay (defaults) | greyrelay compressed | Postfix (defaults) | Postfix tuned |",
		"| message 1 no slower than Postfix with its defaults | met: 30.0 s vs 300.0 s | not run | (the reference) | met: 40.0 s vs 300.0 s |",
		"| from message 4 on, each within delay × 1.1 + 2 s (29.5 s) | met: messages 4–6 ≤ 29.5 s | not run | **not met**: message 4: 300.0 s, and 2 more |",
		"| from message 6 on, at most 2 attempts | met: message 6 ≤ 2 attempts | not run | met: message 6 ≤ 2 attempts | **not met**: message 6: 4 attempts |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
}
