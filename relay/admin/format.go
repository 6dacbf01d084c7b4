package admin

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"unicode/utf8"

	"github.com/greyrelay/greyrelay/internal/safetext"
	"github.com/greyrelay/greyrelay/queue"
)

// Human-readable forms shared by the status page and the CLI tables.

// HumanDuration renders |d| with its two largest units, rounded down to
// seconds: "45s", "4m10s", "2h13m", "3d4h", "2h" (for 2h0m5s).
func HumanDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	n := [4]int64{int64(d / (24 * time.Hour)), int64(d % (24 * time.Hour) / time.Hour),
		int64(d % time.Hour / time.Minute), int64(d % time.Minute / time.Second)}
	units := [4]string{"d", "h", "m", "s"}
	for i := range n {
		if n[i] == 0 {
			continue
		}
		out := strconv.FormatInt(n[i], 10) + units[i]
		if i+1 < len(n) && n[i+1] != 0 {
			out += strconv.FormatInt(n[i+1], 10) + units[i+1]
		}
		return out
	}
	return "0s"
}

// RelTime renders t relative to now: "in 4m", "3h ago", "now"; "-" for zero.
func RelTime(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	switch {
	case d > -time.Second && d < time.Second:
		return "now"
	case d > 0:
		return "in " + HumanDuration(d)
	}
	return HumanDuration(d) + " ago"
}

// NextText renders when a recipient is next attempted: "in 4m", "due"
// (waiting for a worker), "running" (an attempt is in flight; NextAttempt
// is then only its lease), or "-" (held or final: never).
func NextText(status string, t, now time.Time) string {
	switch {
	case status == "active":
		return "running"
	case status == "held" || t.IsZero() || queue.Status(status).Final():
		return "-"
	case !t.After(now):
		return "due"
	}
	return RelTime(t, now)
}

// ReplyText renders a reply as an SMTP line: "451 4.7.1 Greylisted, ...".
func ReplyText(r *Reply) string {
	if r == nil {
		return ""
	}
	var parts []string
	if r.Code != 0 {
		parts = append(parts, strconv.Itoa(r.Code))
	}
	if r.Enhanced != "" {
		parts = append(parts, r.Enhanced)
	}
	if r.Text != "" {
		parts = append(parts, r.Text)
	}
	return strings.Join(parts, " ")
}

// Sender renders an envelope sender; "" is the null sender.
func Sender(s string) string {
	if s == "" {
		return "<>"
	}
	return s
}

// Clean replaces control characters (escape sequences, tabs, newlines, C1
// controls) and invalid UTF-8 with spaces: replies come from remote servers
// and must not drive a terminal or break a table.
func Clean(s string) string { return safetext.Replace(s, ' ') }

// Cell makes a value safe for a terminal table (see Clean), cuts it to max
// runes (0: no cut), and shows an empty value as "-".
func Cell(s string, max int) string {
	s = Clean(s)
	if s == "" {
		return "-"
	}
	if max > 0 && utf8.RuneCountInString(s) > max {
		s = string([]rune(s)[:max]) + "…"
	}
	return s
}

// HumanBytes renders a size in binary units: "12.0 MiB".
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
