package queue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
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

// TestOperateInFlight: the operator's hold and delete of a recipient whose
// attempt is in flight (Active) take effect at once and leave its
// in-progress attempt to the attempt's own outcome (Apply): a held one
// stays Held with that attempt ended, a deleted one's outcome is ignored.
// Operate stores the results and the events its decide returns, and
// writes no history of its own.
func TestOperateInFlight(t *testing.T) {
	q, _ := newQ(t)
	h := mustEnqueue(t, q, msg("s@x.test", "r@h.test"))
	d := mustEnqueue(t, q, msg("s@x.test", "r@d.test"))
	hk, dk := Key{h, 0}, Key{d, 0}
	if err := q.Begin(Start{Keys: []Key{hk, dk}, Time: t0, MXHost: "mx", LeaseUntil: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	var decided []string
	decide := func(status Status) Decide {
		return func(action string, m *Message, r Recipient, head []byte) Result {
			if m.ID != r.Key.ID || !strings.HasPrefix(string(head), "Subject: hi") {
				t.Errorf("%s of %s: message %s, head %q", action, r.Key, m.ID, head)
			}
			decided = append(decided, action)
			return Result{Key: r.Key, Status: status, Reason: "why-" + action, NextAttempt: t0.Add(time.Minute),
				Events: []Event{{Sink: "s", Data: []byte(action)}}}
		}
	}
	if n, err := q.Operate(ReasonHeld, Selector{Domain: "h.test"}, t0, decide(Held)); n != 1 || err != nil {
		t.Fatalf("hold = %d, %v", n, err)
	}
	r := rcptOf(t, q, hk)
	if r.Status != Held || r.Reason != "why-held" || len(r.History) != 1 || r.History[0].Outcome != outcomeInProgress {
		t.Errorf("held in flight: %s, %q, history %+v", r.Status, r.Reason, r.History)
	}
	if n, err := q.Operate(ReasonDeleted, Selector{Domain: "d.test"}, t0, decide(Failed)); n != 1 || err != nil {
		t.Fatalf("delete = %d, %v", n, err)
	}
	end := t0.Add(time.Second)
	if _, err := q.Apply(Update{Results: []Result{
		{Key: hk, Status: Deferred, Reason: "greylisted", Stage: "rcpt", End: end, NextAttempt: end.Add(time.Minute)},
		{Key: dk, Status: Failed, Reason: "no-such-user", Stage: "rcpt", End: end},
	}}); err != nil {
		t.Fatal(err)
	}
	r = rcptOf(t, q, hk)
	if r.Status != Held || r.Reason != "greylisted" || len(r.History) != 1 || r.History[0].Outcome != string(Deferred) {
		t.Errorf("held, then deferred: %s, %q, history %+v", r.Status, r.Reason, r.History)
	}
	if _, err := q.Message(d); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted in flight, then failed: %v", err)
	}
	if rs, _ := q.Due(end.Add(time.Hour), 0); len(rs) != 0 {
		t.Errorf("due: %v", keysOf(rs))
	}
	if _, err := q.Operate(ReasonReleased, Selector{ID: h}, end, decide(Failed)); !errors.Is(err, ErrInvalid) {
		t.Errorf("release to failed: %v, want ErrInvalid", err)
	}
	if n, err := q.Operate(ReasonReleased, Selector{ID: h}, end, decide(Deferred)); n != 1 || err != nil {
		t.Fatalf("release = %d, %v", n, err)
	}
	r = rcptOf(t, q, hk)
	if r.Status != Deferred || r.Reason != "why-released" || !r.NextAttempt.Equal(t0.Add(time.Minute)) || len(r.History) != 1 {
		t.Errorf("released: %s, %q, next %v, history %+v", r.Status, r.Reason, r.NextAttempt, r.History)
	}
	var got []string
	recs, err := q.Outbox("s", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		got = append(got, string(rec.Data))
	}
	if want := []string{"held", "deleted", "released"}; !reflect.DeepEqual(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if _, err := q.Operate("bounced", Selector{ID: h}, end, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown action: %v", err)
	}
	checkStats(t, q)
}
