package delivery

import (
	"testing"
	"time"
)

// The scheduler's pause after failed Begins doubles from storagePauseMin
// to storagePauseMax, is not lengthened by the failures of workers
// claimed before it began, and ends with a Begin that succeeds.
func TestStoragePause(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	type step struct {
		at       time.Duration
		op       string // "fail", "ok" or "" (only look)
		wantLeft time.Duration
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"no failure, no pause", []step{{0, "", 0}}},
		{"doubles up to the cap", []step{
			{0, "fail", time.Second},
			{time.Second, "fail", 2 * time.Second},
			{3 * time.Second, "fail", 4 * time.Second},
			{7 * time.Second, "fail", 8 * time.Second},
			{15 * time.Second, "fail", 8 * time.Second},
		}},
		{"failures during the pause do not lengthen it", []step{
			{0, "fail", time.Second},
			{500 * time.Millisecond, "fail", 500 * time.Millisecond},
			{time.Second, "", 0},
		}},
		{"a success ends it", []step{
			{0, "fail", time.Second},
			{time.Second, "fail", 2 * time.Second},
			{time.Second, "ok", 0},
			{2 * time.Second, "fail", time.Second},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p storagePause
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				switch s.op {
				case "fail":
					p.failed(now)
				case "ok":
					p.ok()
				}
				left, paused := p.left(now)
				if left != s.wantLeft || paused != (s.wantLeft > 0) {
					t.Fatalf("step %d (%s at %v): left %v, %v; want %v", i, s.op, s.at, left, paused, s.wantLeft)
				}
			}
		})
	}
}
