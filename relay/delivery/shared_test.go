package delivery

import (
	"reflect"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

func TestAdoptShared(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	old, recent := now.Add(-time.Hour), now.Add(-time.Minute)
	tests := []struct {
		name      string
		local, sh queue.Destination
		want      queue.Destination
	}{
		{
			name:  "nothing known locally: the shared delay and greylisting",
			local: queue.Destination{Domain: "d"},
			sh:    queue.Destination{Greylists: true, LearnedDelay: 5 * time.Minute, Updated: recent},
			want:  queue.Destination{Domain: "d", Greylists: true, LearnedDelay: 5 * time.Minute},
		},
		{
			name:  "an older shared record does not replace a newer local delay",
			local: queue.Destination{Domain: "d", Greylists: true, LearnedDelay: time.Minute, Updated: recent},
			sh:    queue.Destination{Greylists: true, LearnedDelay: 9 * time.Minute, Updated: old},
			want:  queue.Destination{Domain: "d", Greylists: true, LearnedDelay: time.Minute, Updated: recent},
		},
		{
			name:  "a newer shared delay wins; local counters stay",
			local: queue.Destination{Domain: "d", Greylists: true, GreylistSeen: 4, LearnedDelay: time.Minute, Updated: old},
			sh:    queue.Destination{Greylists: true, LearnedDelay: 3 * time.Minute, Updated: recent},
			want:  queue.Destination{Domain: "d", Greylists: true, GreylistSeen: 4, LearnedDelay: 3 * time.Minute, Updated: old},
		},
		{
			name:  "a newer shared greylisting window and pace win",
			local: queue.Destination{Domain: "d", LearnedDelay: time.Minute, GreylistLow: 30 * time.Second, Updated: old},
			sh: queue.Destination{LearnedDelay: 5 * time.Minute, GreylistLow: 4 * time.Minute,
				PaceInterval: 2 * time.Second, PaceBase: time.Second, Updated: recent},
			want: queue.Destination{Domain: "d", LearnedDelay: 5 * time.Minute, GreylistLow: 4 * time.Minute,
				PaceInterval: 2 * time.Second, PaceBase: time.Second, Updated: old},
		},
		{
			name:  "a running pause elsewhere pauses here, whatever the age",
			local: queue.Destination{Domain: "d", Updated: recent},
			sh:    queue.Destination{ThrottleLevel: 2, ThrottledUntil: now.Add(time.Minute), Updated: old},
			want:  queue.Destination{Domain: "d", ThrottleLevel: 2, ThrottledUntil: now.Add(time.Minute), Updated: recent},
		},
		{
			name:  "a pause that is over is not adopted",
			local: queue.Destination{Domain: "d", Updated: recent},
			sh:    queue.Destination{ThrottleLevel: 2, ThrottledUntil: now.Add(-time.Second), Updated: old},
			want:  queue.Destination{Domain: "d", Updated: recent},
		},
		{
			name: "dead hosts: the union, the later time, nothing expired",
			local: queue.Destination{Domain: "d", Updated: recent, DeadHosts: map[string]time.Time{
				"192.0.2.1": now.Add(time.Minute), "192.0.2.2": now.Add(5 * time.Minute)}},
			sh: queue.Destination{Updated: old, DeadHosts: map[string]time.Time{
				"192.0.2.1": now.Add(3 * time.Minute), "192.0.2.2": now.Add(time.Minute), "192.0.2.3": now.Add(-time.Second), "192.0.2.4": now.Add(time.Minute)}},
			want: queue.Destination{Domain: "d", Updated: recent, DeadHosts: map[string]time.Time{
				"192.0.2.1": now.Add(3 * time.Minute), "192.0.2.2": now.Add(5 * time.Minute), "192.0.2.4": now.Add(time.Minute)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := cloneDest(tt.local)
			adoptShared(&got, tt.sh, now)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
