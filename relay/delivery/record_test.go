package delivery

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
)

// recorderEngine is an engine with only what the recorder uses; store
// stores held outcomes again.
func recorderEngine(store func(queue.Update) error) *Engine {
	return &Engine{log: zap.NewNop(), claimed: map[queue.Key]bool{}, out: newRecorder(store)}
}

// playLoop runs, until the test ends, what a worker of e has the loop
// run (call), as Run would: for tests that take a worker's steps without
// running the loop. Between calls the test goroutine plays the loop.
func playLoop(t *testing.T, e *Engine) {
	e.ops, e.ended = make(chan op), make(chan struct{})
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case o := <-e.ops:
				e.runOp(o)
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
}

// handed hands over an outcome of a fresh attempt for key, claimed as
// takeFresh claims it (the test goroutine plays the loop), carrying the destination records recs, whose commit
// ends with what commit delivers, and returns it.
func handed(e *Engine, d *dest, key queue.Key, commit <-chan error, recs ...queue.Destination) *pendingOutcome {
	e.claimed[key] = true
	po := &pendingOutcome{d: d, own: len(recs) > 0, decided: make(chan struct{}), wait: func() error { return <-commit },
		u: queue.Update{Starts: []queue.Start{{Keys: []queue.Key{key}}},
			Results: []queue.Result{{Key: key, Status: queue.Delivered}}, Destinations: recs}}
	e.out.hand(po)
	return po
}

// isClaimed reports whether key is claimed, once the loop (played by the
// test goroutine) has read what the recorder told it.
func isClaimed(e *Engine, key queue.Key) bool {
	e.readNotes()
	return e.claimed[key]
}

// locker is a mutex the recorder must not hold while it stores.
type locker interface {
	TryLock() bool
	Unlock()
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Shutdown waits for the commit of every outcome handed over, however
// long it takes, and then for nothing more: no poll, no fixed delay.
func TestRecorderStopWaitsForCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := recorderEngine(func(queue.Update) error { return nil })
		stop := e.record()
		commit := make(chan error)
		key := queue.Key{ID: 1}
		po := handed(e, &dest{name: "a.test"}, key, commit)
		stopped := make(chan struct{})
		go func() { stop(); close(stopped) }()
		time.Sleep(time.Hour) // a commit that takes very long
		synctest.Wait()
		if isClosed(stopped) || isClosed(po.decided) {
			t.Fatal("the recorder stopped before the outcome's commit was decided")
		}
		if !isClaimed(e, key) {
			t.Fatal("the fresh recipient was released before its outcome was stored")
		}
		start := time.Now()
		commit <- nil
		<-stopped
		if waited := time.Since(start); waited != 0 {
			t.Errorf("stop returned %v after the commit, want at once", waited)
		}
		if !isClosed(po.decided) || isClaimed(e, key) {
			t.Error("stopped without collecting the outcome (decided, claim released)")
		}
	})
}

// A failed commit is held and stored again on a backoff timer by the
// recorder, holding no lock of the engine, while the
// outcomes handed over after it are collected at once; the destination
// record it carried is stored again by the next outcome.
func TestRecorderRetriesHeldOutsideLocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dest{name: "a.test", stored: queue.Destination{Domain: "a.test", PaceInterval: time.Second}}
		var e *Engine
		var tries []time.Time
		store := func(u queue.Update) error {
			tries = append(tries, time.Now())
			for name, mu := range map[string]locker{"the recorder's inbox": &e.out.mu, "the loop's mailbox": &e.notes.mu} {
				if !mu.TryLock() {
					t.Errorf("held outcome stored again with %s held", name)
					continue
				}
				mu.Unlock()
			}
			if len(u.Destinations) > 0 || len(u.Starts) != 1 || len(u.Results) != 1 {
				t.Errorf("stored again %+v, want the start and the result without the destination", u)
			}
			if len(tries) < 3 {
				return errors.New("ENOSPC")
			}
			return nil
		}
		e = recorderEngine(store)
		stop := e.record()
		defer stop()
		begin := time.Now()
		failed := make(chan error, 1)
		failed <- errors.New("ENOSPC")
		first := handed(e, d, queue.Key{ID: 1}, failed, queue.Destination{Domain: "a.test", PaceInterval: 2 * time.Second})
		synctest.Wait()
		if !isClosed(first.decided) || e.out.held.len() != 1 {
			t.Fatal("a failed commit is not held at once")
		}
		e.readNotes() // the test goroutine plays the loop, which owns d
		if d.stored.Domain != "" {
			t.Error("the destination record of a failed commit still counts as stored")
		}
		ok := make(chan error, 1)
		ok <- nil
		second := handed(e, d, queue.Key{ID: 2}, ok)
		synctest.Wait()
		if !isClosed(second.decided) || isClaimed(e, second.u.Results[0].Key) {
			t.Error("an outcome handed over after a held one waits for its retry")
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		var gaps []time.Duration
		for _, at := range tries {
			gaps = append(gaps, at.Sub(begin))
			begin = at
		}
		want := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}
		if len(gaps) != len(want) || gaps[0] != want[0] || gaps[1] != want[1] || gaps[2] != want[2] {
			t.Errorf("held outcome stored again after %v, want after %v", gaps, want)
		}
		if e.out.held.len() != 0 || isClaimed(e, first.u.Results[0].Key) {
			t.Error("the held outcome was not stored, or its fresh recipient is still claimed")
		}
	})
}

// A destination whose record is on its way into the queue is not
// forgotten: read again from the queue, it would be the record before.
func TestEvictKeepsRecordOnItsWay(t *testing.T) {
	e := recorderEngine(nil)
	d := &dest{name: "a.test", recording: 1}
	e.dests = map[string]*dest{d.name: d}
	e.order = []string{d.name}
	e.readNotes() // the test goroutine plays the loop
	e.evict(time.Now())
	if e.dests[d.name] != d {
		t.Fatal("destination forgotten while its record was being committed")
	}
	e.recorded(d)
	e.readNotes() // the test goroutine plays the loop
	e.evict(time.Now())
	if _, ok := e.dests[d.name]; ok || len(e.order) != 0 {
		t.Fatal("destination kept after its record was committed")
	}
}

// A paced destination is not forgotten before its next start may come:
// read again from the queue, it would have no last start, and the next
// message after an idle moment would go at once (TestRateLimited saw
// transactions 12 ms apart under a 1 s pace on a loaded machine).
func TestEvictKeepsPacedStart(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := t0
	e := recorderEngine(nil)
	e.opt.Now = func() time.Time { return now }
	playLoop(t, e)
	d := &dest{name: "paced.test", rec: queue.Destination{Domain: "paced.test", PaceInterval: time.Second, PaceRefusals: 1}}
	e.dests = map[string]*dest{d.name: d}
	e.order = []string{d.name}
	if _, _, ok := e.paceWait(context.Background(), d, func() {}); !ok {
		t.Fatal("paceWait: the first start waits")
	}
	for _, c := range []struct {
		at   time.Duration
		kept bool
	}{{0, true}, {999 * time.Millisecond, true}, {time.Second, false}} {
		e.readNotes() // the test goroutine plays the loop
		e.evict(t0.Add(c.at))
		kept := e.dests[d.name] == d
		if kept != c.kept {
			t.Errorf("at +%v: kept %v, want %v (pace interval 1s from the start at +0)", c.at, kept, c.kept)
		}
	}
	// The pace the record holds now counts: a refusal's longer gap keeps d longer.
	d2 := &dest{name: "refused.test", lastStart: t0}
	e.dests[d2.name], e.order = d2, append(e.order, d2.name)
	e.adopt(d2, queue.Destination{Domain: d2.name, PaceInterval: time.Second, PaceRefusals: 3}) // gap 4 s
	e.readNotes()                                                                               // the test goroutine plays the loop
	e.evict(t0.Add(3 * time.Second))
	kept := e.dests[d2.name] == d2
	if !kept {
		t.Error("forgot a destination 3 s into a 4 s gap")
	}
}

// TestSameDestEveryField sets each field of a destination record in turn
// and checks that sameDest notices it, except the three it leaves out on
// purpose (Updated and the run of accepted messages): a field added to
// queue.Destination and not compared by sameDest fails here, where it
// would otherwise go unstored.
func TestSameDestEveryField(t *testing.T) {
	ignored := map[string]bool{"Updated": true, "PaceRun": true, "PaceRunStart": true}
	base := queue.Destination{Domain: "example.com"}
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		f := typ.Field(i)
		t.Run(f.Name, func(t *testing.T) {
			changed := base
			v := reflect.ValueOf(&changed).Elem().Field(i)
			switch v.Kind() {
			case reflect.String:
				v.SetString("changed")
			case reflect.Bool:
				v.SetBool(true)
			case reflect.Int, reflect.Int64: // ints and time.Duration
				v.SetInt(7)
			case reflect.Map:
				v.Set(reflect.ValueOf(map[string]time.Time{"mx.example.com": time.Unix(1e9, 0)}))
			case reflect.Struct:
				switch f.Type {
				case reflect.TypeOf(time.Time{}):
					v.Set(reflect.ValueOf(time.Unix(1e9, 0)))
				case reflect.TypeOf(queue.Reply{}):
					v.Set(reflect.ValueOf(queue.Reply{Code: 451}))
				default:
					t.Fatalf("field %s: type %s not handled by this test", f.Name, f.Type)
				}
			default:
				t.Fatalf("field %s: kind %s not handled by this test", f.Name, v.Kind())
			}
			if got, want := sameDest(base, changed), ignored[f.Name]; got != want {
				t.Errorf("sameDest with %s changed = %v, want %v", f.Name, got, want)
			}
		})
	}
	t.Run("same instant, other location", func(t *testing.T) {
		a, b := base, base
		a.ThrottledUntil = time.Unix(1e9, 0).UTC()
		b.ThrottledUntil = time.Unix(1e9, 0).In(time.FixedZone("x", 3600))
		a.DeadHosts = map[string]time.Time{}
		if !sameDest(a, b) {
			t.Error("an instant in another location, or an empty map for nil, counted as a change")
		}
	})
}
