package smtpd

import (
	"errors"
	"testing"
	"time"
)

// TestFreeSpaceReuse checks when a free-space measurement is reused: only
// while it is younger than roomFresh and at least roomMargin above the
// need; a failed measurement is never reused.
func TestFreeSpaceReuse(t *testing.T) {
	const need = 1 << 20
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		after   time.Duration // since base
		free    uint64        // what statfs reports if asked
		err     error
		measure bool // whether statfs must be asked
		want    uint64
		noReuse bool // a caller that does not allow reuse
	}
	plenty := uint64(need + roomMargin)
	cases := []struct {
		name  string
		steps []step
	}{
		{"young and plenty: reused", []step{
			{0, plenty, nil, true, plenty, false},
			{roomFresh - 1, 5, nil, false, plenty, false},
		}},
		{"old: measured", []step{
			{0, plenty, nil, true, plenty, false},
			{roomFresh, 5, nil, true, 5, false},
		}},
		{"near the need: measured every time", []step{
			{0, plenty - 1, nil, true, plenty - 1, false},
			{time.Millisecond, 7, nil, true, 7, false},
			{2 * time.Millisecond, 6, nil, true, 6, false},
		}},
		{"clock went back: measured", []step{
			{time.Second, plenty, nil, true, plenty, false},
			{0, 5, nil, true, 5, false},
		}},
		{"reuse not allowed: measured", []step{
			{0, plenty, nil, true, plenty, false},
			{time.Millisecond, 5, nil, true, 5, true},
		}},
		{"failure: not reused", []step{
			{0, 0, errors.New("EIO"), true, 0, false},
			{time.Millisecond, plenty, nil, true, plenty, false},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var now time.Time
			var cur step
			asked := false
			s := &Server{now: func() time.Time { return now }, diskFree: func(string) (uint64, error) {
				asked = true
				return cur.free, cur.err
			}}
			dir := t.TempDir()
			s.qdir.Store(&dir)
			for i, st := range tc.steps {
				now, cur, asked = base.Add(st.after), st, false
				got, err := s.freeSpace(need, !st.noReuse)
				if asked != st.measure || got != st.want || (err != nil) != (st.err != nil) {
					t.Fatalf("step %d: freeSpace = %d, %v (measured %v); want %d (measured %v)", i, got, err, asked, st.want, st.measure)
				}
			}
		})
	}
}
