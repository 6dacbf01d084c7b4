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
