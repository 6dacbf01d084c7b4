package queue

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// decided reports whether p's commit has been decided, without waiting.
func decided(p *Pending) bool { return p.reply == nil || len(p.reply) == 1 }

// TestApplyAsyncIsApply: ApplyAsync stores what Apply stores (results, a
// DSN, the destination record), and Wait gives Apply's answer, twice.
func TestApplyAsyncIsApply(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test"))
	k0, k1 := Key{id, 0}, Key{id, 1}
	begin(t, q, t0, k0, k1)
	p := q.ApplyAsync(Update{
		Results: []Result{{Key: k0, Status: Delivered, End: t0},
			{Key: k1, Status: Deferred, Reason: "greylisted", End: t0, NextAttempt: t0.Add(time.Hour)}},
		DSNs:         []NewMessage{msg("", "s@x.test")},
		Destinations: []Destination{{Domain: "a.test", LearnedDelay: time.Minute, Updated: t0}},
	})
	ids, err := p.Wait()
	if err != nil || len(ids) != 1 {
		t.Fatalf("Wait = %v, %v; want one DSN ID", ids, err)
	}
	if again, err2 := p.Wait(); err2 != nil || len(again) != 1 || again[0] != ids[0] {
		t.Errorf("second Wait = %v, %v; want %v", again, err2, ids)
	}
	if r := rcptOf(t, q, k0); r.Status != Delivered {
		t.Errorf("k0 = %s, want delivered", r.Status)
	}
	if r := rcptOf(t, q, k1); r.Status != Deferred || !r.NextAttempt.Equal(t0.Add(time.Hour)) {
		t.Errorf("k1 = %s due %v, want deferred for an hour", r.Status, r.NextAttempt)
	}
	if _, err := q.Message(ids[0]); err != nil {
		t.Errorf("DSN %s: %v", ids[0], err)
	}
	if d, ok, err := q.Destination("a.test"); err != nil || !ok || d.LearnedDelay != time.Minute {
		t.Errorf("destination = %+v, %v, %v", d, ok, err)
	}
	checkStats(t, q)
}

// TestApplyAsyncRefusals: an invalid update fails in Wait without reaching
// the writer; after Close, Wait reports ErrClosed, as Apply does.
func TestApplyAsyncRefusals(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, msg("s@x.test", "r@a.test"))
	begin(t, q, t0, Key{id, 0})
	p := q.ApplyAsync(Update{Results: []Result{{Key: Key{id, 0}, Status: Active}}})
	if _, err := p.Wait(); !errors.Is(err, ErrInvalid) {
		t.Errorf("invalid status: %v, want ErrInvalid", err)
	}
	if r := rcptOf(t, q, Key{id, 0}); r.Status != Active {
		t.Errorf("recipient %s after a refused update", r.Status)
	}
	q.Close()
	p = q.ApplyAsync(Update{Results: []Result{{Key: Key{id, 0}, Status: Delivered, End: t0}}})
	if _, err := p.Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// TestApplyAsyncCommitsBeforeLaterCalls: the commit of an ApplyAsync is
// decided before a later Begin returns (the writer commits in order), so a
// worker collecting it after its next Begin never waits; Close commits
// what the writer has taken, and the reopened queue holds it.
func TestApplyAsyncCommitsBeforeLaterCalls(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	const workers, per = 8, 12
	ids := make([][]ID, workers)
	for w := range workers {
		for range per {
			ids[w] = append(ids[w], mustEnqueue(t, q, msg("s@x.test", "r@a.test")))
		}
	}
	var wg sync.WaitGroup
	last := make([]*Pending, workers)
	for w := range workers {
		wg.Go(func() {
			var p *Pending
			for _, id := range ids[w] {
				if err := q.Begin(Start{Keys: []Key{{id, 0}}, Time: t0, LeaseUntil: t0.Add(time.Hour)}); err != nil {
					t.Errorf("Begin: %v", err)
					return
				}
				if p != nil && !decided(p) {
					t.Errorf("the previous ApplyAsync is undecided after a later Begin returned")
				}
				if p != nil {
					if _, err := p.Wait(); err != nil {
						t.Errorf("Wait: %v", err)
					}
				}
				p = q.ApplyAsync(Update{Results: []Result{{Key: Key{id, 0}, Status: Delivered, End: t0}}})
			}
			last[w] = p // never waited for before Close
		})
	}
	wg.Wait()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range last {
		if _, err := p.Wait(); err != nil {
			t.Errorf("ApplyAsync taken before Close: %v", err)
		}
	}
	q = openAt(t, path, Options{})
	if st, err := q.Stats(); err != nil || st.Messages != 0 {
		t.Errorf("after reopening: %+v, %v; want every message delivered and gone", st, err)
	}
	checkStats(t, q)
}

// BenchmarkDeliveryCycle is a delivery worker's queue traffic: Begin, a
// stand-in for the SMTP transaction, the outcome; with Apply, or with
// ApplyAsync collected after the next Begin. Measure only; nothing is
// asserted about time.
// The History variants keep finished records (at most 1000, so that the
// steady state prunes one per message).
func BenchmarkDeliveryCycle(b *testing.B) {
	for _, c := range []struct{ async, history bool }{{false, false}, {true, false}, {true, true}} {
		async := c.async
		name := map[bool]string{false: "Apply", true: "ApplyAsync"}[async]
		opt := Options{}
		if c.history {
			name += "History"
			opt.History = keepWeek
		}
		b.Run(name, func(b *testing.B) {
			q := openAt(b, dbPath(b), opt)
			b.SetParallelism(10)
			b.RunParallel(func(pb *testing.PB) {
				var p *Pending
				for pb.Next() {
					id, err := q.Enqueue(msg("s@x.test", "r@a.test"))
					if err == nil {
						err = q.Begin(Start{Keys: []Key{{id, 0}}, Time: t0, LeaseUntil: t0.Add(time.Hour)})
					}
					if p != nil && err == nil {
						_, err = p.Wait()
						p = nil
					}
					if err != nil {
						b.Error(err)
						return
					}
					time.Sleep(200 * time.Microsecond)
					u := Update{Results: []Result{{Key: Key{id, 0}, Status: Delivered, End: t0}}}
					if async {
						p = q.ApplyAsync(u)
					} else if _, err := q.Apply(u); err != nil {
						b.Error(err)
						return
					}
				}
				if p != nil {
					_, _ = p.Wait()
				}
			})
		})
	}
}
