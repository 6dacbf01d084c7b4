package delivery

import (
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/emersion/go-smtp"

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

// TestGreylistPerHostAfterEviction: what a greylisting MX host taught
// outlives its entry in memory. Six messages to x1.test teach the host
// its window; after hostIdle without mail to it, a message to another
// MX wakes the loop, whose sweep forgets the entry; the first message to
// x2.test, behind the same host, then still passes within the learned
// delay (the entry is read again from the queue), as it does with the
// entry kept (TestGreylistPerHost).
func TestGreylistPerHostAfterEviction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 25 * time.Second
		routes := map[string]string{"x1.test": "127.0.0.26:25", "x2.test": "127.0.0.26:25", "other.test": "127.0.0.27:25"}
		g := &postgreyFake{delay: delay, first: map[string]time.Time{}}
		p := startPipeMX(func(host, from, to string, now time.Time) *smtp.SMTPError {
			if strings.HasPrefix(host, "127.0.0.27") {
				return nil // no greylisting there
			}
			return g.rcpt(host, from, to, now)
		})
		t.Cleanup(p.close)
		pe := startPipeEngine(t, p, routes, func() float64 { return 0.5 }, nil)
		t.Cleanup(func() { pe.stop(t) })
		known := func() bool {
			var ok bool
			pe.eng.inLoop(func() { _, ok = pe.eng.hosts["127.0.0.26"] })
			return ok
		}
		sendOneByOne(t, pe, p, "x1.test", 1, 6)
		if !known() {
			t.Fatal("no entry for the greylisting host after its messages")
		}
		time.Sleep(hostIdle + hostSweepEvery)
		sendOneByOne(t, pe, p, "other.test", 1, 1)
		if known() {
			t.Errorf("the greylisting host's entry kept after %v unused", hostIdle+hostSweepEvery)
		}
		goal := delay + delay/10 + 2*time.Second
		if m := sendOneByOne(t, pe, p, "x2.test", 1, 1)[0]; m.took > goal || m.attempts > 2 {
			t.Errorf("first message to x2.test after the entry was forgotten: %d attempts, %v; want at most 2 within %v", m.attempts, m.took, goal)
		}
	})
}
