package delivery

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// TestEvictHosts checks which MX address entries the loop forgets after
// hostIdle without use: one that learned nothing, and one whose learning
// is stored, which comes back from the queue with it; not one used
// lately, one holding what is not stored yet, one with a paced start
// still to come, or one whose shared view is being read.
func TestEvictHosts(t *testing.T) {
	q, err := queue.Open(filepath.Join(t.TempDir(), "q.db"), queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	now := time.Unix(1_800_000_000, 0)
	e := &Engine{q: q, hosts: map[string]*host{}, opt: Options{Now: func() time.Time { return now }}}

	e.hostOf("192.0.2.1") // nothing learned

	stored := e.hostOf("192.0.2.2")
	stored.rec.Greylists, stored.rec.LearnedDelay = true, 70*time.Second
	if _, err := q.Apply(queue.Update{Destinations: []queue.Destination{stored.rec}}); err != nil {
		t.Fatal(err)
	}
	stored.stored = cloneDest(stored.rec)

	unstored := e.hostOf("192.0.2.3")
	unstored.rec.Greylists = true // learned; its commit not decided yet

	paced := e.hostOf("192.0.2.4")
	paced.rec.PaceInterval, paced.rec.PaceBase = 30*time.Minute, 30*time.Minute
	paced.stored = cloneDest(paced.rec)
	paced.lastStart = now // the next start is 30 minutes on

	e.hostOf("192.0.2.5").reading = make(chan struct{})

	now = now.Add(hostIdle - time.Minute)
	e.hostOf("192.0.2.6") // used lately

	now = now.Add(2 * time.Minute)
	e.evictHosts(now)
	for addr, want := range map[string]bool{"192.0.2.1": false, "192.0.2.2": false, "192.0.2.3": true,
		"192.0.2.4": true, "192.0.2.5": true, "192.0.2.6": true} {
		if _, kept := e.hosts[addr]; kept != want {
			t.Errorf("%s kept = %v, want %v", addr, kept, want)
		}
	}
	if h := e.hostOf("192.0.2.2"); !h.rec.Greylists || h.rec.LearnedDelay != 70*time.Second {
		t.Errorf("forgotten host read again: %+v, want what was stored", h.rec)
	}

	// At most one walk per hostSweepEvery.
	now = now.Add(hostIdle)
	e.hostsSwept = now.Add(-hostSweepEvery / 2)
	e.evictHosts(now)
	if _, kept := e.hosts["192.0.2.6"]; !kept {
		t.Error("hosts walked again within hostSweepEvery")
	}
	e.evictHosts(now.Add(hostSweepEvery))
	if _, kept := e.hosts["192.0.2.6"]; kept {
		t.Error("an idle host kept after the next sweep")
	}
}
