package queue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

func TestOperatorActions(t *testing.T) {
	q, _ := newQ(t)
	a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@b.test"))
	b := mustEnqueue(t, q, msg("s@x.test", "r3@b.test"))
	later := t0.Add(time.Hour)

	for _, sel := range []Selector{{}, {ID: a, All: true}, {Domain: "a.test", All: true}} {
		if _, err := q.Retry(sel, t0); !errors.Is(err, ErrInvalid) {
			t.Errorf("Retry(%+v) = %v, want ErrInvalid", sel, err)
		}
	}
	if _, err := q.Hold(Selector{ID: 999}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Hold(missing) = %v", err)
	}
	if _, err := q.Select(Selector{ID: 999}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Select(missing) = %v", err)
	}
	if n, err := q.Hold(Selector{Domain: "B.test"}); err != nil || n != 2 {
		t.Fatalf("Hold domain = %d, %v", n, err)
	}
	if rs, _ := q.Due(later, 0); !reflect.DeepEqual(keysOf(rs), []Key{{a, 0}}) {
		t.Errorf("Due after hold = %v", keysOf(rs))
	}
	if n, _ := q.Hold(Selector{Domain: "b.test"}); n != 0 {
		t.Errorf("Hold twice changed %d", n)
	}
	if n, err := q.Retry(Selector{All: true}, later); err != nil || n != 1 {
		t.Errorf("Retry all = %d, %v (held ones must not count)", n, err)
	}
	if next, _, _ := q.NextDue(); !next.Equal(later) {
		t.Errorf("NextDue after Retry = %v", next)
	}
	if n, err := q.Release(Selector{ID: b}, later); err != nil || n != 1 {
		t.Errorf("Release = %d, %v", n, err)
	}
	if r := rcptOf(t, q, Key{b, 0}); r.Status != Queued || !r.NextAttempt.Equal(later) {
		t.Errorf("released = %+v", r)
	}
	rs, err := q.Select(Selector{Domain: "b.test"})
	if err != nil || !reflect.DeepEqual(keysOf(rs), []Key{{a, 1}, {b, 0}}) {
		t.Errorf("Select = %v, %v", keysOf(rs), err)
	}
	checkStats(t, q)

	// Delete by domain removes only those recipients; b then has none left.
	if n, err := q.Delete(Selector{Domain: "b.test"}); err != nil || n != 2 {
		t.Fatalf("Delete domain = %d, %v", n, err)
	}
	if _, err := q.Body(b); !errors.Is(err, ErrNotFound) {
		t.Errorf("b survived: %v", err)
	}
	if m := mustShow(t, q, a); len(m.Recipients) != 1 {
		t.Errorf("a recipients = %+v", m.Recipients)
	}
	checkStats(t, q)
	if n, err := q.Delete(Selector{ID: a}); err != nil || n != 1 {
		t.Errorf("Delete id = %d, %v", n, err)
	}
	if _, err := q.Message(a); !errors.Is(err, ErrNotFound) {
		t.Errorf("a survived: %v", err)
	}
	mustEnqueue(t, q, msg("s@x.test", "r@c.test"))
	if n, err := q.Delete(Selector{All: true}); err != nil || n != 1 {
		t.Errorf("Delete all = %d, %v", n, err)
	}
	if st, _ := q.Stats(); st.Messages != 0 || st.Recipients != 0 || len(st.ByStatus) != 0 {
		t.Errorf("stats after delete all: %+v", st)
	}
	checkStats(t, q)
}

func TestListFiltersAndPaging(t *testing.T) {
	q, _ := newQ(t)
	var ids []ID
	for i := range 10 {
		m := msg(fmt.Sprintf("s%d@x.test", i%2), "r1@a.test", "r2@b.test")
		m.Arrival = t0.Add(time.Duration(i) * time.Minute)
		if i == 9 {
			m.From = ""
		}
		ids = append(ids, mustEnqueue(t, q, m))
	}
	begin(t, q, t0, Key{ids[0], 0}, Key{ids[1], 0})
	apply(t, q, Update{Results: []Result{
		{Key: Key{ids[0], 0}, Status: Deferred, Reason: "greylisted", End: t0, NextAttempt: t0},
		{Key: Key{ids[1], 0}, Status: Delivered, End: t0},
	}})
	for _, tc := range []struct {
		f    Filter
		want int
	}{
		{Filter{}, 20},
		{Filter{Status: Queued}, 18},
		{Filter{Status: Deferred}, 1},
		{Filter{Status: Delivered}, 1},
		{Filter{Reason: "greylisted"}, 1},
		{Filter{Domain: "A.TEST"}, 10},
		{Filter{Domain: "a.test", Status: Queued}, 8},
		{Filter{Sender: "S1@x.test"}, 8}, // i = 1,3,5,7 (9 is <>)
		{Filter{Sender: "<>"}, 2},
		{Filter{ArrivedBefore: t0.Add(3 * time.Minute)}, 6},
		{Filter{ArrivedBefore: t0}, 0},
		{Filter{Domain: "nowhere.test"}, 0},
	} {
		rows, total, err := q.List(tc.f)
		if err != nil || total != tc.want || len(rows) != tc.want {
			t.Errorf("List(%+v) = %d rows, total %d, %v; want %d", tc.f, len(rows), total, err, tc.want)
		}
	}
	all, _, _ := q.List(Filter{})
	if all[0].Message.ID != ids[0] || all[0].Recipient.Key != (Key{ids[0], 0}) || all[0].Message.Recipients != nil {
		t.Errorf("first row = %+v", all[0])
	}
	var paged []Row
	for off := 0; off < 25; off += 7 {
		rows, total, err := q.List(Filter{Offset: off, Limit: 7})
		if err != nil || total != 20 {
			t.Fatalf("page %d: total %d, %v", off, total, err)
		}
		paged = append(paged, rows...)
	}
	if !reflect.DeepEqual(paged, all) {
		t.Errorf("pages concatenated differ from the full list")
	}
}

// TestStatsMatchFullScan runs random operation sequences and checks after
// every step that the in-memory counters (and the due index) agree with a
// full scan, and that a reopen rebuilds the same counters.
func TestStatsMatchFullScan(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			path := dbPath(t)
			q := openAt(t, path, Options{})
			rnd := rand.New(rand.NewPCG(seed, 1))
			now := t0
			for step := range 150 {
				now = now.Add(time.Duration(rnd.IntN(10)) * time.Minute)
				op := randomOp(t, q, rnd, now)
				c := fullScan(t, q)
				if got, _ := q.Stats(); got.Messages != c.msgs || got.Recipients != c.rcpts ||
					!reflect.DeepEqual(got.ByStatus, c.byStatus) || !reflect.DeepEqual(got.ByReason, c.byReason) {
					t.Fatalf("step %d (%s): Stats %+v, scan %+v", step, op, got, c)
				}
			}
			before, _ := q.Stats()
			q.Close()
			q = openAt(t, path, Options{})
			after, _ := q.Stats()
			if !reflect.DeepEqual(before, after) {
				t.Errorf("reopen: %+v, before %+v", after, before)
			}
		})
	}
}

var domains = []string{"a.test", "b.test", "c.test"}

func randomOp(t *testing.T, q *Queue, rnd *rand.Rand, now time.Time) string {
	t.Helper()
	sel := func() Selector {
		switch rnd.IntN(3) {
		case 0:
			return Selector{All: true}
		case 1:
			return Selector{Domain: domains[rnd.IntN(len(domains))]}
		}
		rows, _, _ := q.List(Filter{})
		if len(rows) == 0 {
			return Selector{All: true}
		}
		return Selector{ID: rows[rnd.IntN(len(rows))].Message.ID}
	}
	var err error
	op := ""
	switch k := rnd.IntN(20); {
	case k < 6:
		op = "enqueue"
		var to []string
		for i := range 1 + rnd.IntN(3) {
			to = append(to, fmt.Sprintf("r%d@%s", i, domains[rnd.IntN(len(domains))]))
		}
		m := msg("s@x.test", to...)
		m.NextAttempt = now
		_, err = q.Enqueue(m)
	case k < 14:
		op = "attempt"
		err = randomAttempt(q, rnd, now)
	case k == 14:
		op = "hold"
		_, err = q.Hold(sel())
	case k == 15:
		op = "release"
		_, err = q.Release(sel(), now)
	case k == 16:
		op = "retry"
		_, err = q.Retry(sel(), now)
	case k == 17:
		op = "delete"
		_, err = q.Delete(sel())
	default:
		op = "recover"
		_, err = q.Recover(now)
	}
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	return op
}

// randomAttempt begins an attempt for some due recipients and applies
// random outcomes (sometimes with a DSN), or leaves it in flight.
func randomAttempt(q *Queue, rnd *rand.Rand, now time.Time) error {
	rs, err := q.Due(now, 1+rnd.IntN(4))
	if err != nil || len(rs) == 0 {
		return err
	}
	if err := q.Begin(Start{Keys: keysOf(rs), Time: now, LeaseUntil: now.Add(time.Hour)}); err != nil {
		return err
	}
	if rnd.IntN(5) == 0 {
		return nil // in flight; a later Recover ends it
	}
	var u Update
	statuses := []Status{Deferred, Deferred, Delivered, Relayed, Failed, Queued}
	reasons := []string{"", "greylisted", "timeout", "refused"}
	for _, r := range rs {
		st := statuses[rnd.IntN(len(statuses))]
		u.Results = append(u.Results, Result{Key: r.Key, Status: st, Reason: reasons[rnd.IntN(len(reasons))],
			End: now, NextAttempt: now.Add(time.Duration(rnd.IntN(30)) * time.Minute)})
		if st == Failed {
			u.DSNs = append(u.DSNs, msg("", "s@x.test"))
		}
	}
	_, err = q.Apply(u)
	return err
}
