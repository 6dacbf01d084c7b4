package queue

import (
	"bytes"
	"reflect"
	"testing"
	"time"
)

// takeFresh reads what the queue offered, without waiting.
func takeFresh(q *Queue) []Fresh {
	var out []Fresh
	for {
		select {
		case f := <-q.fresh:
			out = append(out, f)
		default:
			return out
		}
	}
}

// A message is offered once Enqueue returns, with its envelope, its
// recipients as they are inserted and its body; only after Fresh was
// called, and only if it is due at its arrival and not spooled.
func TestFresh_Offered(t *testing.T) {
	q, _ := newQ(t)
	mustEnqueue(t, q, msg("s@x.test", "a@d.test"))
	if got := takeFresh(q); len(got) != 0 {
		t.Fatalf("offered %d messages before Fresh was called", len(got))
	}
	q.Fresh()
	m := msg("s@x.test", "a@d.test", "b@e.test")
	id := mustEnqueue(t, q, m)
	later := msg("s@x.test", "c@d.test")
	later.NextAttempt = t0.Add(time.Hour)
	mustEnqueue(t, q, later)
	got := takeFresh(q)
	if len(got) != 1 {
		t.Fatalf("offered %d messages, want 1 (the one due later is not)", len(got))
	}
	f := got[0]
	if f.Message.ID != id || f.Message.From != "s@x.test" || !f.Message.Arrival.Equal(t0) || !bytes.Equal(f.Body, m.Body) {
		t.Errorf("offered %+v", f)
	}
	if len(f.Recipients) != 2 || f.Recipients[1].Key != (Key{id, 1}) || f.Recipients[1].Addr != "b@e.test" ||
		f.Recipients[1].Status != Queued {
		t.Errorf("recipients %+v", f.Recipients)
	}
	shown := mustShow(t, q, id) // the database holds the same keys
	for i, r := range shown.Recipients {
		if r.Key != f.Recipients[i].Key || r.Addr != f.Recipients[i].Addr || r.Status != Queued {
			t.Errorf("stored recipient %d: %+v, offered %+v", i, r, f.Recipients[i])
		}
	}
}

// An outcome with Starts begins the recipients still Queued or Deferred in
// the same transaction: the attempt is counted and its history entry holds
// the start and the outcome. Recipients held or finished meanwhile are
// left as the operator or an earlier outcome left them.
func TestApply_Starts(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, msg("s@x.test", "a@d.test", "b@h.test", "c@d.test"))
	// b is held, c already delivered by another outcome.
	if _, err := q.Hold(Selector{Domain: "h.test"}); err != nil {
		t.Fatal(err)
	}
	start := Start{Keys: []Key{{id, 0}, {id, 1}, {id, 2}}, Time: t0.Add(time.Second), SourceIP: "192.0.2.1",
		MXHost: "mx.d.test", MXAddr: "192.0.2.25", LeaseUntil: t0.Add(time.Hour)}
	if _, err := q.Apply(Update{Results: []Result{{Key: Key{id, 2}, Status: Delivered, End: t0}}}); err != nil {
		t.Fatal(err)
	}
	end := t0.Add(2 * time.Second)
	u := Update{Starts: []Start{start}}
	for i := range 3 {
		u.Results = append(u.Results, Result{Key: Key{id, i}, Status: Deferred, End: end, NextAttempt: end.Add(time.Minute)})
	}
	if _, err := q.Apply(u); err != nil {
		t.Fatal(err)
	}
	m := mustShow(t, q, id)
	a, b, c := m.Recipients[0], m.Recipients[1], m.Recipients[2]
	if a.Status != Deferred || a.Attempts != 1 || !a.FirstAttempt.Equal(start.Time) || a.MXHost != "mx.d.test" || !a.NextAttempt.Equal(end.Add(time.Minute)) {
		t.Errorf("a: %+v", a)
	}
	if len(a.History) != 1 || !a.History[0].Start.Equal(start.Time) || !a.History[0].End.Equal(end) || a.History[0].Outcome != string(Deferred) {
		t.Errorf("a's history: %+v", a.History)
	}
	if b.Status != Held || b.Attempts != 0 {
		t.Errorf("b (held): %+v", b)
	}
	if c.Status != Delivered || c.Attempts != 0 || len(c.History) != 1 {
		t.Errorf("c (delivered before): %+v", c)
	}
	checkStats(t, q)
}

// An outcome with Starts leaves the queue as a Begin followed by an Apply
// of the same results would: the same recipient records, history,
// finished record and counters. The start is written with the outcome,
// not before it, so only the end state can be compared.
func TestApply_StartsAsBeginThenApply(t *testing.T) {
	start := func(keys ...Key) Start {
		return Start{Keys: keys, Time: t0.Add(time.Second), SourceIP: "192.0.2.1", MXHost: "mx.d.test",
			MXAddr: "192.0.2.25", LeaseUntil: t0.Add(time.Hour)}
	}
	end := t0.Add(2 * time.Second)
	res := func(k Key, st Status) Result {
		r := Result{Key: k, Status: st, End: end, Reason: "r", Reply: Reply{Code: 250, Enhanced: "2.0.0", Text: "ok"}, TLS: "opportunistic"}
		if st == Deferred {
			r.NextAttempt, r.GreylistTries = end.Add(time.Minute), 1
		}
		return r
	}
	k := func(i int) Key { return Key{1, i} } // the first message of a new queue
	tests := []struct {
		name    string
		rcpts   int
		earlier []Result // applied before, with a Begin of their keys
		start   Start
		results []Result
	}{
		{"delivered: the message finishes", 1, nil, start(k(0)), []Result{res(k(0), Delivered)}},
		{"deferred", 1, nil, start(k(0)), []Result{res(k(0), Deferred)}},
		{"one failed, one started without an outcome", 2, nil, start(k(0), k(1)), []Result{res(k(0), Failed)}},
		{"a second attempt after a deferral", 1, []Result{res(k(0), Deferred)}, start(k(0)), []Result{res(k(0), Relayed)}},
		{"two outcomes for one key", 1, nil, start(k(0)), []Result{res(k(0), Deferred), res(k(0), Delivered)}},
		{"an outcome for a key not started", 2, nil, start(k(0)), []Result{res(k(0), Delivered), res(k(1), Deferred)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var shown [2]Message
			for i, merged := range []bool{true, false} {
				q := openAt(t, dbPath(t), Options{History: keepWeek})
				addrs := []string{"a@d.test", "b@d.test"}[:tt.rcpts]
				id := mustEnqueue(t, q, msg("s@x.test", addrs...))
				if id != 1 {
					t.Fatalf("first ID %s", id)
				}
				if tt.earlier != nil {
					mustBeginApply(t, q, start(k(0)), tt.earlier)
				}
				if merged {
					if _, err := q.Apply(Update{Starts: []Start{tt.start}, Results: tt.results}); err != nil {
						t.Fatal(err)
					}
				} else {
					mustBeginApply(t, q, tt.start, tt.results)
				}
				shown[i] = mustShow(t, q, id)
				checkStats(t, q)
			}
			if !reflect.DeepEqual(shown[0], shown[1]) {
				t.Errorf("with Starts:\n%+v\nwith Begin, then Apply:\n%+v", shown[0], shown[1])
			}
		})
	}
}

func mustBeginApply(t *testing.T, q *Queue, s Start, rs []Result) {
	t.Helper()
	if err := q.Begin(s); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Apply(Update{Results: rs}); err != nil {
		t.Fatal(err)
	}
}

// The budget of journaled inserts for one transaction always covers the
// batch holding a message the transaction's requests read.
func TestInsertBudget_Needs(t *testing.T) {
	big := make([]NewRecipient, maxBatchRcpts)
	bs := []*insertBatch{
		{ms: []NewMessage{{To: big}}, ids: []ID{1}},
		{ms: []NewMessage{{To: big}}, ids: []ID{2, 3}},
		{ms: []NewMessage{{To: big}}, ids: []ID{4}},
		{ms: []NewMessage{{To: big}}, ids: []ID{5}},
	}
	tests := []struct {
		needs ID
		want  int
	}{{0, 1}, {1, 1}, {2, 2}, {3, 2}, {4, 3}, {5, 4}, {9, 4}}
	for _, tc := range tests {
		if got := insertBudget(bs, tc.needs); got != tc.want {
			t.Errorf("needs %d: budget %d, want %d", tc.needs, got, tc.want)
		}
	}
}

// The envelope a fresh attempt starts from is the one stored, every field
// of it: a REQUIRETLS flag missing from the offered copy would send the
// message without its TLS requirement.
func TestFresh_EnvelopeAsStored(t *testing.T) {
	q, _ := newQ(t)
	q.Fresh()
	m := msg("s@x.test", "a@d.test")
	m.RequireTLS, m.SMTPUTF8, m.EightBit, m.DSN = true, true, true, true
	m.EnvID, m.AuthUser, m.Helo, m.ClientAddr = "env-1", "alice", "client.test", "192.0.2.7"
	id := mustEnqueue(t, q, m)
	got := takeFresh(q)
	if len(got) != 1 {
		t.Fatalf("offered %d messages, want 1", len(got))
	}
	stored, err := q.Message(id)
	if err != nil {
		t.Fatal(err)
	}
	offered := got[0].Message
	offered.bodySum, offered.bodySummed = stored.bodySum, stored.bodySummed
	offered.Recipients, stored.Recipients = nil, nil // offered apart, in Fresh.Recipients
	if !offered.Arrival.Equal(stored.Arrival) {
		t.Errorf("offered arrival %v, stored %v", offered.Arrival, stored.Arrival)
	}
	offered.Arrival = stored.Arrival // the same instant; the stored one has no monotonic reading
	if !reflect.DeepEqual(offered, stored) {
		t.Errorf("offered envelope\n%+v\nstored\n%+v", offered, stored)
	}
	if !offered.RequireTLS {
		t.Error("the offered copy lost REQUIRETLS")
	}
}

// Visible covers every journaled message a read may see: once a message
// can be read from the database, Visible is at least its offer's Seq, and
// offers carry increasing numbers.
func TestFresh_VisibleCoversInserted(t *testing.T) {
	q, _ := newQ(t)
	q.Fresh()
	var last uint64
	for i := range 3 {
		id := mustEnqueue(t, q, msg("s@x.test", "a@d.test"))
		got := takeFresh(q)
		if len(got) != 1 {
			t.Fatalf("message %d: offered %d", i, len(got))
		}
		if got[0].Seq <= last {
			t.Errorf("message %d: Seq %d after %d", i, got[0].Seq, last)
		}
		last = got[0].Seq
		mustShow(t, q, id) // readable now
		if v := q.Visible(); v < got[0].Seq {
			t.Errorf("message %d readable with Visible %d below its Seq %d", i, v, got[0].Seq)
		}
	}
}
