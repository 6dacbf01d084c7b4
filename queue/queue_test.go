package queue

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestIDAndKeyStrings(t *testing.T) {
	id := ID(42)
	if got := id.String(); got != "000000000000002a" {
		t.Errorf("String = %q", got)
	}
	if got := (Key{id, 3}).String(); got != "000000000000002a/3" {
		t.Errorf("Key.String = %q", got)
	}
	for _, tc := range []struct {
		in   string
		want ID
		ok   bool
	}{{"000000000000002a", 42, true}, {"2a", 42, true}, {"ffffffffffffffff", ^ID(0), true},
		{"", 0, false}, {"0000000000000002a", 0, false}, {"xyz", 0, false}, {"-1", 0, false}} {
		got, err := ParseID(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseID(%q) = %v, %v", tc.in, got, err)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	q, _ := newQ(t)
	in := NewMessage{From: "alice@example.org", Body: []byte("Received: x\r\n\r\nhello\r\n"),
		Arrival: t0, ClientAddr: "127.0.0.1:1234", AuthUser: "alice", Helo: "client.test",
		RET: "HDRS", EnvID: "env-1", SMTPUTF8: true, EightBit: true,
		To: []NewRecipient{
			{Addr: "bob@example.net", Domain: "example.net", Notify: "SUCCESS,FAILURE", ORCPT: "rfc822;bob@example.net"},
			{Addr: "carol@example.com", Domain: "example.com", Notify: "NEVER"},
		}}
	id := mustEnqueue(t, q, in)
	m := mustShow(t, q, id)
	want := Message{ID: id, From: in.From, Arrival: t0, Size: int64(len(in.Body)),
		ClientAddr: in.ClientAddr, AuthUser: in.AuthUser, Helo: in.Helo, RET: "HDRS",
		EnvID: "env-1", SMTPUTF8: true, EightBit: true}
	rs := m.Recipients
	m.Recipients = nil
	if !m.Arrival.Equal(t0) {
		t.Errorf("Arrival = %v", m.Arrival)
	}
	m.Arrival = t0
	if !reflect.DeepEqual(m, want) {
		t.Errorf("Show = %+v\nwant %+v", m, want)
	}
	if len(rs) != 2 || rs[0].Key != (Key{id, 0}) || rs[1].Key != (Key{id, 1}) {
		t.Fatalf("recipients = %+v", rs)
	}
	r := rs[0]
	if r.Addr != "bob@example.net" || r.Domain != "example.net" || r.Notify != "SUCCESS,FAILURE" ||
		r.ORCPT != "rfc822;bob@example.net" || r.Status != Queued || !r.NextAttempt.Equal(t0) || r.Attempts != 0 {
		t.Errorf("recipient = %+v", r)
	}
	env, err := q.Message(id)
	if err != nil || env.From != in.From || env.Recipients != nil {
		t.Errorf("Message = %+v, %v", env, err)
	}
	body, err := q.Body(id)
	if err != nil || !bytes.Equal(body, in.Body) {
		t.Errorf("Body = %q, %v", body, err)
	}
	for _, f := range []func() error{
		func() error { _, err := q.Message(id + 1); return err },
		func() error { _, err := q.Show(id + 1); return err },
		func() error { _, err := q.Body(id + 1); return err },
	} {
		if err := f(); !errors.Is(err, ErrNotFound) {
			t.Errorf("missing id: err = %v, want ErrNotFound", err)
		}
	}
}

func TestEnqueueRejectsInvalid(t *testing.T) {
	q, _ := newQ(t)
	for _, m := range []NewMessage{
		{Body: []byte("x")},
		{To: []NewRecipient{{Addr: "", Domain: "d"}}},
		{To: []NewRecipient{{Addr: "a@d", Domain: ""}}},
	} {
		if _, err := q.Enqueue(m); !errors.Is(err, ErrInvalid) {
			t.Errorf("Enqueue(%+v) err = %v, want ErrInvalid", m, err)
		}
	}
	if _, err := q.EnqueueBatch(nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("EnqueueBatch(nil) err = %v", err)
	}
}

func TestReopenRetainsEverything(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@b.test"))
	b := mustEnqueue(t, q, msg("", "r3@a.test"))
	if err := q.Begin(Start{Keys: []Key{{a, 0}}, Time: t0, SourceIP: "127.0.0.2", MXHost: "mx.a.test",
		MXAddr: "127.0.0.3", LeaseUntil: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	dest := Destination{Domain: "a.test", Greylists: true, GreylistSeen: 2, LearnedDelay: 5 * time.Minute,
		DeadHosts: map[string]time.Time{"mx2.a.test": t0.Add(time.Hour)}, Updated: t0}
	if _, err := q.Apply(Update{Results: []Result{{Key: Key{a, 0}, Status: Deferred, Reason: "greylisted",
		Reply: Reply{451, "4.7.1", "try later"}, Stage: "rcpt", End: t0.Add(time.Second),
		NextAttempt: t0.Add(6 * time.Minute), FirstGreylisted: t0, GreylistTries: 1}},
		Destinations: []Destination{dest}}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Hold(Selector{ID: b}); err != nil {
		t.Fatal(err)
	}
	before := []Message{mustShow(t, q, a), mustShow(t, q, b)}
	stats, _ := q.Stats()
	dests, _ := q.Destinations()
	next, _, _ := q.NextDue()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v, want ErrClosed", err)
	}
	if _, err := q.Enqueue(msg("", "x@y.test")); !errors.Is(err, ErrClosed) {
		t.Errorf("Enqueue after Close = %v, want ErrClosed", err)
	}
	if _, err := q.Show(a); !errors.Is(err, ErrClosed) {
		t.Errorf("Show after Close = %v, want ErrClosed", err)
	}

	q2 := openAt(t, path, Options{})
	after := []Message{mustShow(t, q2, a), mustShow(t, q2, b)}
	if !reflect.DeepEqual(before, after) {
		t.Errorf("after reopen:\n%+v\nbefore:\n%+v", after, before)
	}
	stats2, _ := q2.Stats()
	if !reflect.DeepEqual(stats, stats2) {
		t.Errorf("stats after reopen %+v, before %+v", stats2, stats)
	}
	dests2, _ := q2.Destinations()
	if !reflect.DeepEqual(dests, dests2) || len(dests2) != 1 || dests2[0].LearnedDelay != 5*time.Minute {
		t.Errorf("destinations after reopen %+v, before %+v", dests2, dests)
	}
	if next2, _, _ := q2.NextDue(); !next2.Equal(next) {
		t.Errorf("NextDue after reopen %v, before %v", next2, next)
	}
	if id := mustEnqueue(t, q2, msg("", "z@c.test")); id <= b {
		t.Errorf("new ID %v not above %v", id, b)
	}
	checkStats(t, q2)
}

func TestDueOrdering(t *testing.T) {
	q, _ := newQ(t)
	if _, ok, err := q.NextDue(); ok || err != nil {
		t.Fatalf("empty NextDue ok=%v err=%v", ok, err)
	}
	offsets := []time.Duration{30, 10, 20, 40, 0} // minutes after t0
	ids := make([]ID, len(offsets))
	for i, off := range offsets {
		m := msg("s@x.test", "r@a.test")
		m.NextAttempt = t0.Add(off * time.Minute)
		ids[i] = mustEnqueue(t, q, m)
	}
	due := func(now time.Time, limit int) []ID {
		rs, err := q.Due(now, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []ID
		for _, r := range rs {
			out = append(out, r.Key.ID)
		}
		return out
	}
	if got, want := due(t0.Add(25*time.Minute), 0), []ID{ids[4], ids[1], ids[2]}; !reflect.DeepEqual(got, want) {
		t.Errorf("Due = %v, want %v", got, want)
	}
	if got, want := due(t0.Add(time.Hour), 2), []ID{ids[4], ids[1]}; !reflect.DeepEqual(got, want) {
		t.Errorf("Due limit 2 = %v, want %v", got, want)
	}
	if got := due(t0.Add(-time.Minute), 0); len(got) != 0 {
		t.Errorf("Due before all = %v", got)
	}
	if got, want := due(t0.Add(10*time.Minute), 0), []ID{ids[4], ids[1]}; !reflect.DeepEqual(got, want) {
		t.Errorf("Due is inclusive of now: %v, want %v", got, want)
	}
	// Held and Active recipients are not due; NextDue skips leases.
	if _, err := q.Hold(Selector{ID: ids[4]}); err != nil {
		t.Fatal(err)
	}
	if err := q.Begin(Start{Keys: []Key{{ids[1], 0}}, Time: t0, LeaseUntil: t0.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if got, want := due(t0.Add(time.Hour), 0), []ID{ids[2], ids[0], ids[3]}; !reflect.DeepEqual(got, want) {
		t.Errorf("Due with held+active = %v, want %v", got, want)
	}
	if next, ok, _ := q.NextDue(); !ok || !next.Equal(t0.Add(20*time.Minute)) {
		t.Errorf("NextDue = %v %v, want t0+20m", next, ok)
	}
	checkStats(t, q)
}

func TestBeginThenRecover(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	id := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test"))
	k0, k1 := Key{id, 0}, Key{id, 1}
	start := Start{Keys: []Key{k0}, Time: t0.Add(time.Minute), SourceIP: "127.0.0.9",
		MXHost: "mx.a.test", MXAddr: "127.0.0.10", LeaseUntil: t0.Add(time.Hour)}
	if err := q.Begin(start); err != nil {
		t.Fatal(err)
	}
	r := rcptOf(t, q, k0)
	if r.Status != Active || r.Attempts != 1 || !r.LastAttempt.Equal(start.Time) || !r.FirstAttempt.Equal(start.Time) ||
		r.SourceIP != "127.0.0.9" || r.MXHost != "mx.a.test" || r.MXAddr != "127.0.0.10" || !r.NextAttempt.Equal(start.LeaseUntil) {
		t.Errorf("after Begin: %+v", r)
	}
	if len(r.History) != 1 || r.History[0].Outcome != outcomeInProgress || r.History[0].MXHost != "mx.a.test" {
		t.Errorf("history after Begin: %+v", r.History)
	}
	if err := q.Begin(start); !errors.Is(err, ErrState) {
		t.Errorf("Begin on Active = %v, want ErrState", err)
	}
	// All-or-nothing: k1 is fine but k0 is Active, so k1 must stay Queued.
	if err := q.Begin(Start{Keys: []Key{k1, k0}, Time: t0, LeaseUntil: t0.Add(time.Hour)}); !errors.Is(err, ErrState) {
		t.Errorf("Begin mixed = %v", err)
	}
	if s := rcptOf(t, q, k1).Status; s != Queued {
		t.Errorf("k1 status %s after failed Begin", s)
	}
	if err := q.Begin(Start{Keys: []Key{{id, 7}}, Time: t0, LeaseUntil: t0}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Begin missing = %v", err)
	}
	if rs, _ := q.Due(t0.Add(2*time.Hour), 0); !reflect.DeepEqual(keysOf(rs), []Key{k1}) {
		t.Errorf("Due during lease = %v (an Active lease must not be returned)", keysOf(rs))
	}
	q.Close() // the "crash": the attempt never reported back

	q = openAt(t, path, Options{})
	now := t0.Add(10 * time.Minute)
	n, err := q.Recover(now)
	if err != nil || n != 1 {
		t.Fatalf("Recover = %d, %v", n, err)
	}
	r = rcptOf(t, q, k0)
	if r.Status != Deferred || !r.NextAttempt.Equal(now) || r.Attempts != 1 || r.SourceIP != "127.0.0.9" {
		t.Errorf("after Recover: %+v", r)
	}
	if h := r.History; len(h) != 1 || h[0].Outcome != outcomeInterrupted {
		t.Errorf("history after Recover: %+v", h)
	}
	if rs, _ := q.Due(now, 0); !reflect.DeepEqual(keysOf(rs), []Key{k1, k0}) {
		t.Errorf("Due after Recover = %v", keysOf(rs))
	}
	if n, _ := q.Recover(now); n != 0 {
		t.Errorf("second Recover = %d", n)
	}
	select {
	case <-q.Wake():
	default:
		t.Error("no wake after Recover")
	}
	checkStats(t, q)
}

// begin starts an attempt for keys at at, failing the test on error.
func begin(t testing.TB, q *Queue, at time.Time, keys ...Key) {
	t.Helper()
	if err := q.Begin(Start{Keys: keys, Time: at, SourceIP: "127.0.0.2", LeaseUntil: at.Add(time.Hour)}); err != nil {
		t.Fatalf("Begin: %v", err)
	}
}

func apply(t testing.TB, q *Queue, u Update) []ID {
	t.Helper()
	ids, err := q.Apply(u)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return ids
}

func TestApplyFinalDeletesBodyAfterLastRecipient(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@b.test"))
	k0, k1 := Key{id, 0}, Key{id, 1}
	begin(t, q, t0, k0, k1)
	apply(t, q, Update{Results: []Result{
		{Key: k0, Status: Delivered, Reply: Reply{250, "2.0.0", "ok"}, Stage: "data", End: t0.Add(time.Second)},
		{Key: k1, Status: Deferred, Reason: "greylisted", Reply: Reply{450, "4.2.0", "greylisted"}, Stage: "rcpt",
			End: t0.Add(time.Second), NextAttempt: t0.Add(5 * time.Minute), GreylistTries: 1, FirstGreylisted: t0},
	}})
	if _, err := q.Body(id); err != nil {
		t.Fatalf("body gone while a recipient is deferred: %v", err)
	}
	m := mustShow(t, q, id)
	r0, r1 := m.Recipients[0], m.Recipients[1]
	if r0.Status != Delivered || r0.Reply.Code != 250 || !r0.NextAttempt.IsZero() {
		t.Errorf("r0 = %+v", r0)
	}
	if h := r0.History; len(h) != 1 || h[0].Outcome != "delivered" || h[0].Stage != "data" || !h[0].End.Equal(t0.Add(time.Second)) {
		t.Errorf("r0 history = %+v", h)
	}
	if r1.Status != Deferred || r1.Reason != "greylisted" || r1.GreylistTries != 1 || !r1.NextAttempt.Equal(t0.Add(5*time.Minute)) {
		t.Errorf("r1 = %+v", r1)
	}
	checkStats(t, q)
	begin(t, q, t0.Add(5*time.Minute), k1)
	apply(t, q, Update{Results: []Result{{Key: k1, Status: Failed, Reply: Reply{550, "5.1.1", "no such user"},
		End: t0.Add(6 * time.Minute)}}})
	if _, err := q.Body(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("Body after last final = %v, want ErrNotFound", err)
	}
	if _, err := q.Message(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("Message after last final = %v", err)
	}
	// A late result for a finished message is ignored, not an error.
	apply(t, q, Update{Results: []Result{{Key: k1, Status: Deferred, End: t0}}})
	if st, _ := q.Stats(); st.Messages != 0 || st.Recipients != 0 {
		t.Errorf("stats after completion: %+v", st)
	}
	checkStats(t, q)
}

func TestApplyWithDSNsIsAtomic(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test"))
	k0, k1 := Key{id, 0}, Key{id, 1}
	begin(t, q, t0, k0, k1)
	bounce := msg("", "s@x.test")
	bounce.DSN = true
	dest := Destination{Domain: "A.test", ThrottleLevel: 2, ThrottledUntil: t0.Add(time.Hour)}

	// Invalid update: nothing at all may change.
	bad := Update{Results: []Result{{Key: k0, Status: Failed, End: t0}, {Key: k1, Status: Active}},
		DSNs: []NewMessage{bounce}, Destinations: []Destination{dest}}
	if _, err := q.Apply(bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad Apply = %v", err)
	}
	if s := rcptOf(t, q, k0).Status; s != Active {
		t.Errorf("k0 changed by failed Apply: %s", s)
	}
	if st, _ := q.Stats(); st.Messages != 1 {
		t.Errorf("failed Apply enqueued something: %+v", st)
	}
	if _, ok, _ := q.Destination("a.test"); ok {
		t.Error("failed Apply stored a destination")
	}

	ids := apply(t, q, Update{Results: []Result{{Key: k0, Status: Failed, Reason: "user unknown", End: t0}},
		DSNs: []NewMessage{bounce}, Destinations: []Destination{dest}})
	if len(ids) != 1 || ids[0] <= id {
		t.Fatalf("DSN ids = %v", ids)
	}
	d := mustShow(t, q, ids[0])
	if !d.DSN || d.From != "" || len(d.Recipients) != 1 || d.Recipients[0].Status != Queued {
		t.Errorf("DSN message = %+v", d)
	}
	if s := rcptOf(t, q, k0).Status; s != Failed {
		t.Errorf("k0 = %s", s)
	}
	got, ok, err := q.Destination("a.TEST")
	if err != nil || !ok || got.ThrottleLevel != 2 || !got.ThrottledUntil.Equal(dest.ThrottledUntil) {
		t.Errorf("Destination = %+v %v %v", got, ok, err)
	}
	select {
	case <-q.Wake():
	default:
		t.Error("no wake after a DSN was enqueued")
	}
	checkStats(t, q)
}

func TestApplyKeepsOperatorHold(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, msg("s@x.test", "r1@a.test", "r2@a.test"))
	begin(t, q, t0, Key{id, 0}, Key{id, 1})
	if n, err := q.Hold(Selector{Domain: "A.TEST"}); err != nil || n != 2 {
		t.Fatalf("Hold = %d, %v", n, err)
	}
	apply(t, q, Update{Results: []Result{
		{Key: Key{id, 0}, Status: Deferred, End: t0, NextAttempt: t0.Add(time.Minute)},
		{Key: Key{id, 1}, Status: Delivered, End: t0},
	}})
	m := mustShow(t, q, id)
	if m.Recipients[0].Status != Held || m.Recipients[1].Status != Delivered {
		t.Errorf("statuses %s %s", m.Recipients[0].Status, m.Recipients[1].Status)
	}
	if rs, _ := q.Due(t0.Add(time.Hour), 0); len(rs) != 0 {
		t.Errorf("held recipient due: %v", keysOf(rs))
	}
	if n, _ := q.Recover(t0); n != 0 {
		t.Errorf("Recover touched a held recipient")
	}
	checkStats(t, q)
}

func TestHistoryIsCapped(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, msg("s@x.test", "r@a.test"))
	k := Key{id, 0}
	const n = 30
	for i := 1; i <= n; i++ {
		at := t0.Add(time.Duration(i) * time.Minute)
		begin(t, q, at, k)
		apply(t, q, Update{Results: []Result{{Key: k, Status: Deferred, Reason: "try", End: at, NextAttempt: at}}})
	}
	r := rcptOf(t, q, k)
	if r.Attempts != n || len(r.History) != historyFirst+historyLast {
		t.Fatalf("attempts %d, history %d", r.Attempts, len(r.History))
	}
	for i, want := range []int{1, 2, 3, n - historyLast + 1} {
		if got := r.History[i].Start; !got.Equal(t0.Add(time.Duration(want) * time.Minute)) {
			t.Errorf("History[%d].Start = %v, want attempt %d", i, got, want)
		}
	}
	if last := r.History[len(r.History)-1]; !last.Start.Equal(t0.Add(n*time.Minute)) || last.Outcome != "deferred" {
		t.Errorf("last = %+v", last)
	}
	if !r.FirstAttempt.Equal(t0.Add(time.Minute)) {
		t.Errorf("FirstAttempt = %v", r.FirstAttempt)
	}
}

func TestGroupCommitConcurrent(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	const workers, per = 50, 4
	var mu sync.Mutex
	bodies := map[ID]string{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				m := msg("s@x.test", "r@a.test")
				m.Body = []byte("body " + string(rune('A'+w%26)) + string(rune('a'+i)) + "\r\n")
				id, err := q.Enqueue(m)
				if err != nil {
					t.Errorf("Enqueue: %v", err)
					return
				}
				mu.Lock()
				if _, dup := bodies[id]; dup {
					t.Errorf("duplicate ID %v", id)
				}
				bodies[id] = string(m.Body)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(bodies) != workers*per {
		t.Fatalf("%d IDs, want %d", len(bodies), workers*per)
	}
	q.Close()
	q = openAt(t, path, Options{})
	for id, want := range bodies {
		if got, err := q.Body(id); err != nil || string(got) != want {
			t.Errorf("Body(%v) = %q, %v; want %q", id, got, err, want)
		}
	}
	checkStats(t, q)
}

// TestCloseNeverPretendsSuccess races Close against enqueuers: every
// Enqueue that returned an ID must be on disk, every other one must fail.
func TestCloseNeverPretendsSuccess(t *testing.T) {
	path := dbPath(t)
	q, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ok []ID
	var wg sync.WaitGroup
	started := make(chan struct{}, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				id, err := q.Enqueue(msg("s@x.test", "r@a.test"))
				if i == 0 {
					started <- struct{}{}
				}
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Errorf("Enqueue during Close: %v", err)
					}
					return
				}
				mu.Lock()
				ok = append(ok, id)
				mu.Unlock()
			}
		}()
	}
	for range 20 {
		<-started
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	q = openAt(t, path, Options{})
	for _, id := range ok {
		if _, err := q.Message(id); err != nil {
			t.Errorf("acknowledged %v lost: %v", id, err)
		}
	}
	if st, _ := q.Stats(); st.Messages != len(ok) {
		t.Errorf("%d messages on disk, %d acknowledged", st.Messages, len(ok))
	}
}

func TestSecondOpenIsLocked(t *testing.T) {
	path := dbPath(t)
	openAt(t, path, Options{})
	start := time.Now()
	q2, err := Open(path, Options{LockTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		if q2 != nil {
			q2.Close()
		}
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	// Not a performance assertion: it only proves Open does not wait forever.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("second Open took %v", d)
	}
}

func TestWakeCoalesces(t *testing.T) {
	q, _ := newQ(t)
	mustEnqueue(t, q, msg("s@x.test", "r@a.test"))
	mustEnqueue(t, q, msg("s@x.test", "r@a.test"))
	// The wake comes with the commit that puts them in the database.
	if err := q.settle(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-q.Wake():
	default:
		t.Fatal("no wake after Enqueue")
	}
	select {
	case <-q.Wake():
		t.Fatal("wake not coalesced")
	default:
	}
}

// DueSkip passes over entries by domain and key without decoding them, so
// a busy destination's backlog costs the scheduler little.
func TestDueSkip(t *testing.T) {
	q, _ := newQ(t)
	now := t0
	var busy, healthy []ID
	for i := 0; i < 5; i++ {
		id, err := q.Enqueue(NewMessage{From: "a@x.test", To: []NewRecipient{{Addr: "u@Dead.test", Domain: "Dead.test"}}, Body: []byte("x\r\n"), Arrival: now, NextAttempt: now})
		if err != nil {
			t.Fatal(err)
		}
		busy = append(busy, id)
		id, err = q.Enqueue(NewMessage{From: "a@x.test", To: []NewRecipient{{Addr: "u@ok.test", Domain: "ok.test"}}, Body: []byte("x\r\n"), Arrival: now, NextAttempt: now})
		if err != nil {
			t.Fatal(err)
		}
		healthy = append(healthy, id)
	}
	var seen []string
	rs, err := q.DueSkip(now, 3, func(domain string, k Key) bool {
		seen = append(seen, domain)
		return domain == "dead.test" || k.ID == healthy[0]
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(rs); !reflect.DeepEqual(got, []Key{{healthy[1], 0}, {healthy[2], 0}, {healthy[3], 0}}) {
		t.Errorf("DueSkip = %v, want healthy[1..3]", got)
	}
	for _, k := range keysOf(rs) {
		if slices.Contains(busy, k.ID) {
			t.Errorf("DueSkip returned %v of the skipped domain", k)
		}
	}
	if len(seen) == 0 || seen[0] != "dead.test" {
		t.Errorf("skip saw domains %v, want lower-cased dead.test first", seen)
	}
}
