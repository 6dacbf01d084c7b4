package delivery

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/relaytest"
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
			name: "a window learned here later stays against a newer record unaware of it",
			local: queue.Destination{Domain: "d", Greylists: true, LearnedDelay: 5 * time.Minute, GreylistLow: 4 * time.Minute,
				GreylistLearned: recent, Updated: recent},
			sh: queue.Destination{Greylists: true, LearnedDelay: 10 * time.Minute, GreylistLearned: old, Updated: now},
			want: queue.Destination{Domain: "d", Greylists: true, LearnedDelay: 5 * time.Minute, GreylistLow: 4 * time.Minute,
				GreylistLearned: recent, Updated: recent},
		},
		{
			name: "a window learned later elsewhere wins, whatever the record's age",
			local: queue.Destination{Domain: "d", Greylists: true, LearnedDelay: 10 * time.Minute,
				GreylistLearned: old, Updated: recent},
			sh: queue.Destination{Greylists: true, LearnedDelay: 5 * time.Minute, GreylistLow: 4 * time.Minute,
				GreylistLearned: old.Add(time.Second), Updated: old.Add(time.Second)},
			want: queue.Destination{Domain: "d", Greylists: true, LearnedDelay: 5 * time.Minute, GreylistLow: 4 * time.Minute,
				GreylistLearned: old.Add(time.Second), Updated: recent},
		},
		{
			name: "a pace slowed by a later refusal wins over a newer record unaware of it",
			local: queue.Destination{Domain: "d", PaceInterval: 900 * time.Millisecond, PaceBase: time.Second,
				PaceRefused: old, Updated: recent},
			sh: queue.Destination{PaceInterval: 1200 * time.Millisecond, PaceBase: 1200 * time.Millisecond, PaceRefusals: 1,
				PaceRefused: old.Add(time.Second), Updated: old.Add(time.Second)},
			want: queue.Destination{Domain: "d", PaceInterval: 1200 * time.Millisecond, PaceBase: 1200 * time.Millisecond,
				PaceRefusals: 1, PaceRefused: old.Add(time.Second), Updated: recent},
		},
		{
			name: "a newer record unaware of the local refusal does not undo it",
			local: queue.Destination{Domain: "d", PaceInterval: 1200 * time.Millisecond, PaceBase: 1200 * time.Millisecond,
				PaceRefusals: 1, PaceRefused: recent, Updated: recent},
			sh:   queue.Destination{PaceInterval: 900 * time.Millisecond, PaceBase: time.Second, PaceRefused: old, Updated: now},
			want: queue.Destination{Domain: "d", PaceInterval: 1200 * time.Millisecond, PaceBase: 1200 * time.Millisecond, PaceRefusals: 1, PaceRefused: recent, Updated: recent},
		},
		{
			name: "the same refusal known: the newer record's pace wins",
			local: queue.Destination{Domain: "d", PaceInterval: 1200 * time.Millisecond, PaceBase: 1200 * time.Millisecond,
				PaceRefusals: 1, PaceRefused: old, Updated: old},
			sh: queue.Destination{PaceInterval: 1100 * time.Millisecond, PaceBase: 1200 * time.Millisecond,
				PaceRefused: old, Updated: recent},
			want: queue.Destination{Domain: "d", PaceInterval: 1100 * time.Millisecond, PaceBase: 1200 * time.Millisecond,
				PaceRefused: old, Updated: old},
		},
		{
			name: "a throttle level raised by a later refusal stays against a newer record unaware of it",
			local: queue.Destination{Domain: "d", ThrottleLevel: 1, PaceInterval: time.Second, PaceBase: time.Second,
				PaceRefusals: 1, PaceRefused: recent, Updated: recent},
			sh:   queue.Destination{PaceInterval: 800 * time.Millisecond, PaceBase: time.Second, PaceRefused: old, Updated: now},
			want: queue.Destination{Domain: "d", ThrottleLevel: 1, PaceInterval: time.Second, PaceBase: time.Second, PaceRefusals: 1, PaceRefused: recent, Updated: recent},
		},
		{
			name: "a throttle level relaxed by a record that knew the refusal is adopted",
			local: queue.Destination{Domain: "d", ThrottleLevel: 1, PaceInterval: time.Second, PaceBase: time.Second,
				PaceRefusals: 1, PaceRefused: old, Updated: old},
			sh: queue.Destination{PaceInterval: 900 * time.Millisecond, PaceBase: time.Second, PaceRefused: old, Updated: recent},
			want: queue.Destination{Domain: "d", PaceInterval: 900 * time.Millisecond, PaceBase: time.Second,
				PaceRefused: old, Updated: old},
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

// loadOnly is a Shared whose store holds one record for every domain and
// grants every slot; its pace is never available, so the nodes pace on
// their own.
type loadOnly struct{ rec queue.Destination }

func (s loadOnly) Load(string) (queue.Destination, bool)             { return s.rec, true }
func (loadOnly) Publish(queue.Destination)                           {}
func (loadOnly) Acquire(string, int) (func(), <-chan struct{}, bool) { return func() {}, nil, true }
func (loadOnly) Freed() <-chan string                                { return nil }
func (loadOnly) Pace(string, time.Duration, time.Duration) (time.Duration, bool) {
	return 0, false
}

// A pace adopted from another node keeps a destination as one learned
// here does (TestEvictKeepsPacedStart): forgotten before its next start
// may come, it would be read again from the queue without its last start,
// and the next message after an idle moment would go at once.
func TestEvictKeepsSharedPacedStart(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	old, recent := t0.Add(-time.Hour), t0.Add(-time.Minute)
	type check struct {
		at   time.Duration
		kept bool
	}
	tests := []struct {
		name      string
		local, sh queue.Destination
		checks    []check
	}{
		{
			name:   "unpaced here, paced elsewhere: kept for the shared gap",
			local:  queue.Destination{Updated: old},
			sh:     queue.Destination{PaceInterval: 4 * time.Second, PaceBase: 4 * time.Second, Updated: recent},
			checks: []check{{0, true}, {3999 * time.Millisecond, true}, {4 * time.Second, false}},
		},
		{
			name:   "a newer, slower shared pace: kept for its gap, not the local one",
			local:  queue.Destination{PaceInterval: time.Second, PaceBase: time.Second, Updated: old},
			sh:     queue.Destination{PaceInterval: 4 * time.Second, PaceBase: 4 * time.Second, Updated: recent},
			checks: []check{{time.Second, true}, {3999 * time.Millisecond, true}, {4 * time.Second, false}},
		},
		{
			name:   "a shared pace refused twice since its last success: kept for four times its interval (past the opening, each refusal doubles the gap)",
			local:  queue.Destination{PaceInterval: time.Second, PaceBase: time.Second, Updated: old},
			sh:     queue.Destination{PaceInterval: 2 * time.Second, PaceBase: 2 * time.Second, PaceRefusals: 2, Updated: recent},
			checks: []check{{7999 * time.Millisecond, true}, {8 * time.Second, false}},
		},
		{
			name:   "an older shared pace is not adopted: the local gap stands",
			local:  queue.Destination{PaceInterval: time.Second, PaceBase: time.Second, Updated: recent},
			sh:     queue.Destination{PaceInterval: 4 * time.Second, PaceBase: 4 * time.Second, Updated: old},
			checks: []check{{999 * time.Millisecond, true}, {time.Second, false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := recorderEngine(nil)
			e.opt.Now = func() time.Time { return t0 }
			playLoop(t, e)
			tt.local.Domain, tt.sh.Domain = "paced.test", "paced.test"
			e.opt.Shared = loadOnly{rec: tt.sh}
			d := &dest{name: "paced.test", rec: tt.local}
			e.dests = map[string]*dest{d.name: d}
			e.order = []string{d.name}
			if _, _, ok := e.paceWait(context.Background(), d, func() {}); !ok {
				t.Fatal("paceWait: the first start waits")
			}
			e.loadShared(d) // as a worker's takeSlot does before its next transaction
			for _, c := range tt.checks {
				e.readNotes() // the test goroutine plays the loop
				e.evict(t0.Add(c.at))
				kept := e.dests[d.name] == d
				if kept != c.kept {
					t.Errorf("at +%v: kept %v, want %v (last start at +0)", c.at, kept, c.kept)
				}
			}
		})
	}
}

// stalledShared is a shared store whose Load waits until open is closed,
// like Redis behind a stalled network; started reports each Load.
type stalledShared struct {
	*memShared
	open    chan struct{}
	started chan string
}

func (s stalledShared) Load(name string) (queue.Destination, bool) {
	select {
	case s.started <- name:
	default:
	}
	<-s.open
	return s.memShared.Load(name)
}

// TestSharedStoreOffLoop: the loop never waits on the shared store. While
// reading what the other nodes know about a newly due destination hangs,
// the loop still answers (an operator's change runs at once); once the
// store answers, the message is delivered.
func TestSharedStoreOffLoop(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ip := relaytest.Loopback(t)
	h.dns.MX("stall.test", 10, "mx.stall.test").A("mx.stall.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{})
	sh := stalledShared{memShared: &memShared{recs: map[string]queue.Destination{}},
		open: make(chan struct{}), started: make(chan string, 16)}
	opened := false
	defer func() {
		if !opened {
			close(sh.open)
		}
	}()
	id := h.enqueue("s@sender.test", "r@stall.test")
	h.start(func(o *Options) { o.Shared = sh })
	select {
	case <-sh.started:
	case <-time.After(wait):
		t.Fatal("the shared store was never read")
	}
	answered := make(chan struct{})
	go func() {
		h.eng.inLoop(func() {})
		close(answered)
	}()
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Error("the loop did not answer while the shared store hung")
	}
	close(sh.open)
	opened = true
	<-answered
	eventually(t, wait, "delivered once the store answers", func() bool { return h.gone(id) })
}

// TestLaterRefusal: another node's refusal moves this node's last one
// forward, never back, and never past now (the nodes' clocks differ).
func TestLaterRefusal(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	last := now.Add(-time.Minute)
	for _, c := range []struct {
		name     string
		at, want time.Time
	}{
		{"another node's later refusal", now.Add(-time.Second), now.Add(-time.Second)},
		{"an older one", now.Add(-time.Hour), last},
		{"none", time.Time{}, last},
		{"ahead of this node's clock", now.Add(time.Second), now},
	} {
		if got := laterRefusal(last, c.at, now); !got.Equal(c.want) {
			t.Errorf("%s: laterRefusal = %v, want %v", c.name, got, c.want)
		}
	}
}
