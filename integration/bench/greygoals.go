package main

import (
	"fmt"
	"io"
	"time"
)

// The greylisting goals each system is checked against, from the point of
// view of a user who changed no setting: the first message through a
// greylister no slower than Postfix with its defaults (what they would
// otherwise run); later messages close to the greylister's delay (what
// the learned window is for), in few attempts (each refused attempt is a
// connection and an RCPT at the receiver); and learning never making a
// message slower than the first, which knew nothing.
const (
	goalFromPassNear    = 4 // from this message on, within delay × 1.1 + 2 s
	goalFromTwoAttempts = 6 // from this message on, at most 2 attempts
)

// greyGoal is one goal's verdict for one system.
type greyGoal struct {
	met     bool
	unknown bool   // nothing to check against (no reference, too few messages)
	detail  string // the figure the verdict rests on
}

// greyGoals checks g against the goals; ref is the reference for the
// first message (Postfix with its defaults), nil when it was not run.
func greyGoals(delay time.Duration, g, ref *greyResult, messages int) []greyGoal {
	near := delay + delay/10 + 2*time.Second
	out := make([]greyGoal, 0, 4)
	// Message 1 against Postfix with its defaults.
	switch {
	case len(g.took) == 0:
		out = append(out, greyGoal{detail: "message 1 not delivered"})
	case ref == nil || len(ref.took) == 0:
		out = append(out, greyGoal{unknown: true, detail: fmt.Sprintf("%s; no reference (Postfix with its defaults not run)", secs(g.took[0]))})
	default:
		out = append(out, greyGoal{met: g.took[0] <= ref.took[0], detail: fmt.Sprintf("%s vs %s", secs(g.took[0]), secs(ref.took[0]))})
	}
	out = append(out, fromMessage(g, messages, goalFromPassNear, func(k int) (bool, string) {
		return g.took[k] <= near, secs(g.took[k])
	}, fmt.Sprintf("≤ %s", secs(near))))
	out = append(out, fromMessage(g, messages, goalFromTwoAttempts, func(k int) (bool, string) {
		return g.attempts[k] <= 2, fmt.Sprintf("%d attempts", g.attempts[k])
	}, "≤ 2 attempts"))
	out = append(out, fromMessage(g, messages, 2, func(k int) (bool, string) {
		return g.took[k] <= g.took[0], secs(g.took[k])
	}, "≤ message 1"))
	return out
}

// fromMessage checks ok for every message from `from` (1-based) to
// messages; the detail names the first one that fails and how many
// more do, or the bound when all pass.
func fromMessage(g *greyResult, messages, from int, ok func(k int) (bool, string), bound string) greyGoal {
	if messages < from {
		return greyGoal{unknown: true, detail: fmt.Sprintf("not measured (%d messages)", messages)}
	}
	var failed []string
	for k := from - 1; k < messages; k++ {
		if k >= len(g.took) {
			failed = append(failed, fmt.Sprintf("message %d not delivered", k+1))
			break
		}
		if good, fig := ok(k); !good {
			failed = append(failed, fmt.Sprintf("message %d: %s", k+1, fig))
		}
	}
	switch {
	case len(failed) == 1:
		return greyGoal{detail: failed[0]}
	case len(failed) > 1:
		return greyGoal{detail: fmt.Sprintf("%s, and %d more", failed[0], len(failed)-1)}
	case from == messages:
		return greyGoal{met: true, detail: fmt.Sprintf("message %d %s", from, bound)}
	}
	return greyGoal{met: true, detail: fmt.Sprintf("messages %d–%d %s", from, messages, bound)}
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// printGreyGoals writes the goals table, a column per system in greys'
// order.
func printGreyGoals(w io.Writer, delay time.Duration, messages int, greys []greyResult) {
	var ref *greyResult
	if i := greylistIndex("postfix"); i >= 0 && i < len(greys) && !greys[i].skipped {
		ref = &greys[i]
	}
	near := delay + delay/10 + 2*time.Second
	names := []string{
		"message 1 no slower than Postfix with its defaults",
		fmt.Sprintf("from message %d on, each within delay × 1.1 + 2 s (%s)", goalFromPassNear, secs(near)),
		fmt.Sprintf("from message %d on, at most 2 attempts", goalFromTwoAttempts),
		"no later message slower than message 1",
	}
	fmt.Fprintf(w, "\nGoals, per system (\"met\" only when every message counted meets it):\n\n")
	head, rule := "| goal |", "|---|"
	for _, g := range greys {
		head += " " + systemTitle(g.system) + " |"
		rule += "---|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	verdicts := make([][]greyGoal, len(greys))
	for i := range greys {
		if !greys[i].skipped {
			verdicts[i] = greyGoals(delay, &greys[i], ref, messages)
		}
	}
	for j, name := range names {
		row := "| " + name + " |"
		for i, g := range greys {
			switch {
			case g.skipped:
				row += " not run |"
			case j == 0 && &greys[i] == ref:
				row += " (the reference) |"
			case verdicts[i][j].unknown:
				row += " not checked: " + verdicts[i][j].detail + " |"
			case verdicts[i][j].met:
				row += " met: " + verdicts[i][j].detail + " |"
			default:
				row += " **not met**: " + verdicts[i][j].detail + " |"
			}
		}
		fmt.Fprintln(w, row)
	}
}

// systemTitle is how the greylist report names a system.
func systemTitle(system string) string {
	switch system {
	case "greyrelay":
		return "greyrelay (defaults)"
	case "greyrelay-compressed":
		return "greyrelay compressed"
	case "postfix":
		return "Postfix (defaults)"
	case "postfix-tuned":
		return "Postfix tuned"
	}
	return system
}
