package logtime

import (
	"testing"
	"time"
)

func TestAppend(t *testing.T) {
	zones := []*time.Location{time.UTC, time.FixedZone("east", 5*3600+30*60), time.FixedZone("west", -8*3600),
		time.FixedZone("odd", -(3*3600 + 25*60 + 17))}
	times := []time.Time{
		time.Date(2026, 12, 6, 3, 4, 5, 6_789_000, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-5, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(0, 0),
		{},
	}
	for _, base := range times {
		for _, z := range zones {
			tm := base.In(z)
			if got, want := string(Append(nil, tm)), tm.Format(layout); got != want {
				t.Errorf("Append(%v) = %q, want %q", tm, got, want)
			}
		}
	}
}

// FuzzISO8601 checks Append against the layout for any instant and zone
// offset.
func FuzzISO8601(f *testing.F) {
	f.Add(int64(1_796_000_000), int64(123_456_789), 0)
	f.Add(int64(-62_135_596_800), int64(0), -3600)
	f.Add(int64(253_402_300_799), int64(999_999_999), 86399)
	f.Fuzz(func(t *testing.T, sec, nsec int64, offset int) {
		offset %= 200 * 3600
		tm := time.Unix(sec, nsec).In(time.FixedZone("z", offset))
		if got, want := string(Append(nil, tm)), tm.Format(layout); got != want {
			t.Errorf("Append(%v) = %q, want %q", tm, got, want)
		}
	})
}
