package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"5m30s", 5*time.Minute + 30*time.Second, true},
		{"0", 0, true},
		{"7d", 7 * 24 * time.Hour, true},
		{"1d12h", 36 * time.Hour, true},
		{"1.5d", 36 * time.Hour, true},
		{" 2h ", 2 * time.Hour, true},
		{"-1h", -time.Hour, true},
		{"5 minutes", 0, false},
		{"5 m", 0, false},
		{"300", 0, false},
		{"", 0, false},
		{"d", 0, false},
		{"1x", 0, false},
		{"99999999999d", 0, false},
	}
	for _, tc := range cases {
		got, err := ParseDuration(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "e.g. 90s, 5m, 1h30m or 2d") {
			t.Errorf("ParseDuration(%q): error %q does not say how to write a duration", tc.in, err)
		}
	}
}

// FuzzParseDuration: never a panic; without a d it agrees with Go's own
// parser; a result prints back to the same duration.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"5m30s", "7d", "1.5d12h", "5 minutes", "300", "-2d", ".5d", "1e3d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			return
		}
		if !strings.Contains(s, "d") {
			if g, gerr := time.ParseDuration(strings.TrimSpace(s)); gerr != nil || g != d {
				t.Fatalf("ParseDuration(%q) = %v, time.ParseDuration = %v, %v", s, d, g, gerr)
			}
		}
		if back, err := ParseDuration(d.String()); err != nil || back != d {
			t.Fatalf("ParseDuration(%q) = %v, which reads back as %v, %v", s, d, back, err)
		}
	})
}
