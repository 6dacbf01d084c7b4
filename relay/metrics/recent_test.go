package metrics

import (
	"slices"
	"testing"
	"time"
)

func TestRecent(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	r := NewRecent()
	r.Add("delivered", t0)
	r.Add("relayed", t0.Add(59*time.Second))
	r.Add("deferred", t0.Add(time.Minute))
	r.Add("failed", t0.Add(2*time.Minute))
	r.Add("queued", t0.Add(2*time.Minute)) // not charted
	now := t0.Add(2*time.Minute + 30*time.Second)
	tests := []struct {
		class int
		n     int
		want  []int
	}{
		{RecentDelivered, 4, []int{0, 2, 0, 0}},
		{RecentDeferred, 4, []int{0, 0, 1, 0}},
		{RecentBounced, 4, []int{0, 0, 0, 1}},
		{RecentBounced, 1, []int{1}},
		{99, 2, []int{0, 0}},
	}
	for _, tc := range tests {
		if got := r.Series(tc.class, now, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("Series(%d, %d) = %v, want %v", tc.class, tc.n, got, tc.want)
		}
	}
	// A minute a full ring later reuses the slot: the old counts are gone.
	later := t0.Add(RecentMinutes * time.Minute)
	r.Add("deferred", later)
	if got := r.Series(RecentDelivered, later, RecentMinutes+10); len(got) != RecentMinutes || got[len(got)-1] != 0 || slices.Max(got) != 0 {
		t.Errorf("after a full turn, delivered = max %d, len %d; want all 0", slices.Max(got), len(got))
	}
	if got := r.Series(RecentDeferred, later, 1); got[0] != 1 {
		t.Errorf("deferred now = %v, want [1]", got)
	}
	// Counts older than the ring are dropped, not added to the new minute.
	r.Add("deferred", t0)
	if got := r.Series(RecentDeferred, later, 1); got[0] != 1 {
		t.Errorf("an old outcome changed the current minute: %v", got)
	}
	var nilR *Recent
	nilR.Add("delivered", t0)
	if got := nilR.Series(RecentDelivered, t0, 2); !slices.Equal(got, []int{0, 0}) {
		t.Errorf("nil Recent: %v", got)
	}
}

// The series survive an encoding and a decoding into a new Recent (the
// daemon's restart); First finds the oldest minute with an outcome.
func TestRecentRestored(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	r := NewRecent()
	if !r.First(t0).IsZero() {
		t.Errorf("empty Recent: First = %v", r.First(t0))
	}
	r.Add("delivered", t0)
	r.Add("deferred", t0.Add(90*time.Second))
	r.Add("failed", t0.Add(2*time.Hour))
	b, err := r.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(2*time.Hour + 30*time.Second)
	restored := NewRecent()
	restored.Add("delivered", now) // after the restart, before the restore
	if err := restored.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		class int
		want  []int
	}{
		{RecentDelivered, []int{1, 0, 1}},
		{RecentDeferred, []int{0, 1, 0}},
		{RecentBounced, []int{0, 0, 1}},
	}
	for _, tc := range tests {
		s := restored.Series(tc.class, now, 121)
		if got := []int{s[0], s[1], s[120]}; !slices.Equal(got, tc.want) {
			t.Errorf("class %d after the restore: %v, want %v", tc.class, got, tc.want)
		}
	}
	if got := restored.First(now); !got.Equal(t0) {
		t.Errorf("First = %v, want %v", got, t0)
	}
	if got := restored.First(t0.Add(RecentMinutes * time.Minute)); !got.Equal(t0.Add(time.Minute)) {
		t.Errorf("First, six hours on = %v, want the deferral's minute", got)
	}
	for _, bad := range []string{``, `[]`, `[2]`, `[1,[1,2]]`, `[1,[5,-1,0,0]]`, `{"a":1}`, `[1,"x"]`} {
		if err := NewRecent().UnmarshalBinary([]byte(bad)); err == nil {
			t.Errorf("UnmarshalBinary(%q) took it", bad)
		}
	}
}

// FuzzRecentUnmarshal: any stored value is decoded or refused, never a
// panic, and what is decoded encodes again.
func FuzzRecentUnmarshal(f *testing.F) {
	f.Add([]byte(`[1,[29433600,1,2,3]]`))
	f.Add([]byte(`[1,[-5,1,0,0],[9223372036854775807,0,0,1]]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewRecent()
		if r.UnmarshalBinary(b) != nil {
			return
		}
		if _, err := r.MarshalBinary(); err != nil {
			t.Fatal(err)
		}
	})
}
