package admin

import (
	"testing"
	"time"
)

func TestFormat(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"}, {500 * time.Millisecond, "0s"}, {45 * time.Second, "45s"}, {250 * time.Second, "4m10s"},
		{2*time.Hour + 13*time.Minute + 5*time.Second, "2h13m"}, {2*time.Hour + 5*time.Second, "2h"},
		{76 * time.Hour, "3d4h"}, {-90 * time.Second, "1m30s"},
	} {
		if got := HumanDuration(tt.d); got != tt.want {
			t.Errorf("HumanDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
	now := testNow
	for _, tt := range []struct {
		t    time.Time
		want string
	}{
		{time.Time{}, "-"}, {now, "now"}, {now.Add(4 * time.Minute), "in 4m"}, {now.Add(-3 * time.Hour), "3h ago"},
	} {
		if got := RelTime(tt.t, now); got != tt.want {
			t.Errorf("RelTime(%v) = %q, want %q", tt.t, got, tt.want)
		}
	}
	for _, tt := range []struct {
		status string
		t      time.Time
		want   string
	}{
		{"deferred", now.Add(time.Minute), "in 1m"}, {"queued", now.Add(-time.Hour), "due"},
		{"held", now.Add(time.Minute), "-"}, {"active", now.Add(time.Minute), "running"},
		{"failed", now, "-"}, {"deferred", time.Time{}, "-"},
	} {
		if got := NextText(tt.status, tt.t, now); got != tt.want {
			t.Errorf("NextText(%s, %v) = %q, want %q", tt.status, tt.t, got, tt.want)
		}
	}
	if got := Cell("a\tb\x1b[31mc\nd", 0); got != "a b [31mc d" {
		t.Errorf("cell = %q", got)
	}
	if got := Cell("abcdef", 3); got != "abc…" {
		t.Errorf("cell cut = %q", got)
	}
	if got := Cell("", 0); got != "-" {
		t.Errorf("cell empty = %q", got)
	}
	if got := HumanBytes(3 << 20); got != "3.0 MiB" {
		t.Errorf("humanBytes = %q", got)
	}
}
