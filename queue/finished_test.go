package queue

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

var keepWeek = HistoryOptions{Retention: 7 * 24 * time.Hour, MaxMessages: 1000}

// finish makes one attempt for keys at t and stores status for all of them.
func finish(t testing.TB, q *Queue, at time.Time, status Status, reason string, keys ...Key) {
	t.Helper()
	if err := q.Begin(Start{Keys: keys, Time: at, SourceIP: "192.0.2.1", MXHost: "mx.example.net",
		MXAddr: "198.51.100.2", LeaseUntil: at.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	var u Update
	for _, k := range keys {
		u.Results = append(u.Results, Result{Key: k, Status: status, Reason: reason, Stage: "rcpt",
			Reply: Reply{Code: 250, Enhanced: "2.0.0", Text: "ok " + k.String()}, End: at.Add(time.Second)})
	}
	if _, err := q.Apply(u); err != nil {
		t.Fatal(err)
	}
}

func TestFinishedMessageIsShownAndListed(t *testing.T) {
	q := openAt(t, dbPath(t), Options{History: keepWeek})
	id := mustEnqueue(t, q, msg("a@src.test", "b@dst.test", "c@dst.test"))
	k0, k1 := Key{id, 0}, Key{id, 1}
	deferAt := t0.Add(time.Minute)
	if err := q.Begin(Start{Keys: []Key{k1}, Time: deferAt, LeaseUntil: deferAt.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Apply(Update{Results: []Result{{Key: k1, Status: Deferred, Reason: "greylisted",
		Reply: Reply{Code: 451, Enhanced: "4.7.1", Text: "greylisted"}, End: deferAt}}}); err != nil {
		t.Fatal(err)
	}
	finish(t, q, t0.Add(5*time.Minute), Delivered, "", k0)
	finish(t, q, t0.Add(10*time.Minute), Failed, "no-such-user", k1)

	if rows, total, _ := q.List(Filter{}); total != 0 {
		t.Fatalf("the queue still lists %d recipients: %+v", total, rows)
	}
	m := mustShow(t, q, id)
	if want := t0.Add(10*time.Minute + time.Second); !m.Finished.Equal(want) {
		t.Errorf("Finished = %v, want %v (the last outcome)", m.Finished, want)
	}
	if m.From != "a@src.test" || len(m.Recipients) != 2 {
		t.Fatalf("finished message = %+v", m)
	}
	r0, r1 := m.Recipients[0], m.Recipients[1]
	if r0.Status != Delivered || r0.Addr != "b@dst.test" || r0.MXHost != "mx.example.net" || len(r0.History) != 1 {
		t.Errorf("recipient 0 = %+v", r0)
	}
	if r1.Status != Failed || r1.Reason != "no-such-user" || r1.Attempts != 2 || len(r1.History) != 2 ||
		r1.History[0].Reason != "greylisted" || r1.History[1].Outcome != string(Failed) {
		t.Errorf("recipient 1 = %+v", r1)
	}
	if _, err := q.Body(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("Body of a finished message: %v, want ErrNotFound (bodies are not kept)", err)
	}
	for _, st := range []Status{Delivered, Failed} {
		rows, total, err := q.List(Filter{Status: st})
		if err != nil || total != 1 || len(rows) != 1 || rows[0].Recipient.Status != st || rows[0].Message.Finished.IsZero() {
			t.Errorf("List(%s) = %+v, %d, %v", st, rows, total, err)
		}
	}
	if n, _ := q.Finished(); n != 1 {
		t.Errorf("Finished() = %d, want 1", n)
	}
	checkStats(t, q)
}

func TestFinishedNotKeptByDefault(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, msg("a@src.test", "b@dst.test"))
	finish(t, q, t0, Delivered, "", Key{id, 0})
	if _, err := q.Show(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("Show: %v, want ErrNotFound without Options.History", err)
	}
	if _, total, _ := q.List(Filter{Status: Delivered}); total != 0 {
		t.Errorf("List(delivered) = %d rows, want 0", total)
	}
}

// List with a final status lists the queued messages' final recipients,
// then the finished messages in the order they finished, so paging works
// across both and the last page holds the latest.
func TestFinishedListedAfterQueued(t *testing.T) {
	q := openAt(t, dbPath(t), Options{History: keepWeek})
	var ids []ID
	for i := range 5 {
		ids = append(ids, mustEnqueue(t, q, msg("a@src.test", fmt.Sprintf("r%d@dst.test", i), fmt.Sprintf("s%d@dst.test", i))))
	}
	// Messages 0, 2, 4 finish (both recipients delivered; 4 first); 1 and
	// 3 keep a live recipient next to a delivered one.
	for i, at := range []time.Duration{3, 5, 2, 5, 1} {
		id := ids[i]
		if i%2 == 0 {
			finish(t, q, t0.Add(at*time.Minute), Delivered, "", Key{id, 0}, Key{id, 1})
		} else {
			finish(t, q, t0.Add(at*time.Minute), Delivered, "", Key{id, 0})
		}
	}
	rows, total, err := q.List(Filter{Status: Delivered})
	if err != nil || total != 8 || len(rows) != 8 {
		t.Fatalf("List = %d rows of %d, %v", len(rows), total, err)
	}
	want := []string{"r1", "r3", "r4", "s4", "r2", "s2", "r0", "s0"}
	for i, r := range rows {
		if r.Recipient.Addr[:2] != want[i] {
			t.Errorf("row %d = %s, want %s@…", i, r.Recipient.Addr, want[i])
		}
		if finished := !r.Message.Finished.IsZero(); finished != (i >= 2) {
			t.Errorf("row %d (%s): Finished = %v", i, r.Recipient.Addr, r.Message.Finished)
		}
	}
	page, total, _ := q.List(Filter{Status: Delivered, Offset: 3, Limit: 2})
	if total != 8 || len(page) != 2 || page[0].Recipient.Addr != "s4@dst.test" || page[1].Recipient.Addr != "r2@dst.test" {
		t.Errorf("page = %+v, total %d", page, total)
	}
	if _, total, _ := q.List(Filter{Status: Delivered, Domain: "other.test"}); total != 0 {
		t.Errorf("domain filter: %d rows, want 0", total)
	}
	if _, total, _ := q.List(Filter{Status: Delivered, Sender: "<>"}); total != 0 {
		t.Errorf("sender filter: %d rows, want 0", total)
	}
}

// Records past either bound go in batches of pruneStep, oldest first.
func TestFinishedPruned(t *testing.T) {
	tests := []struct {
		name string
		opt  HistoryOptions
		gap  time.Duration // between one finished message and the next
		keep int           // of 40
	}{
		// The 16 oldest go once 16 are past the bound: at the 21st
		// message and the 37th, leaving 5+3.
		{"by number", HistoryOptions{Retention: 24 * time.Hour, MaxMessages: 5}, time.Minute, 8},
		// The newest and six more fit in the hour; the 23rd finds 16
		// older ones, the 39th the next 16.
		{"by age", HistoryOptions{Retention: time.Hour, MaxMessages: 1000}, 10 * time.Minute, 8},
		{"neither", HistoryOptions{Retention: 24 * time.Hour, MaxMessages: 100}, time.Minute, 40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := openAt(t, dbPath(t), Options{History: tc.opt})
			var ids []ID
			for i := range 40 {
				id := mustEnqueue(t, q, msg("a@src.test", "b@dst.test"))
				ids = append(ids, id)
				finish(t, q, t0.Add(time.Duration(i)*tc.gap), Delivered, "", Key{id, 0})
			}
			if n, _ := q.Finished(); n != tc.keep {
				t.Errorf("Finished() = %d, want %d", n, tc.keep)
			}
			for i, id := range ids {
				_, err := q.Show(id)
				if kept := i >= len(ids)-tc.keep; kept != (err == nil) {
					t.Errorf("message %d: Show error %v, want kept=%v", i, err, kept)
				}
			}
			if _, total, _ := q.List(Filter{Status: Delivered}); total != tc.keep {
				t.Errorf("List(delivered) = %d, want %d", total, tc.keep)
			}
		})
	}
}

// A backlog (a retention shortened between two starts) drains pruneMax
// records per transaction, never all at once.
func TestFinishedBacklogDrains(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{History: HistoryOptions{Retention: 24 * time.Hour}})
	for range 100 {
		id := mustEnqueue(t, q, msg("a@src.test", "b@dst.test"))
		finish(t, q, t0, Delivered, "", Key{id, 0})
	}
	q.Close()
	q = openAt(t, path, Options{History: HistoryOptions{Retention: time.Hour}})
	if n, _ := q.Finished(); n != 100 {
		t.Fatalf("after reopening: %d kept, want 100", n)
	}
	later := t0.Add(2 * time.Hour)
	for i, want := range []int{101 - pruneMax, 2} {
		id := mustEnqueue(t, q, msg("a@src.test", "b@dst.test"))
		finish(t, q, later, Delivered, "", Key{id, 0})
		if n, _ := q.Finished(); n != want {
			t.Errorf("after %d new records: %d kept, want %d", i+1, n, want)
		}
	}
}

func TestWalk(t *testing.T) {
	q := openAt(t, dbPath(t), Options{History: keepWeek})
	a := mustEnqueue(t, q, msg("a@src.test", "b@one.test", "c@two.test", "e@one.test"))
	b := mustEnqueue(t, q, msg("a@src.test", "d@one.test"))
	finish(t, q, t0, Delivered, "", Key{b, 0}) // finished: walked for a final status only
	walk := func(f Filter, max int) []string {
		var got []string
		err := q.Walk(f, func(m *Message, r *Recipient) bool {
			got = append(got, m.ID.String()+" "+r.Addr)
			return len(got) < max
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	tests := []struct {
		f    Filter
		max  int
		want []string
	}{
		{Filter{Domain: "ONE.test", Limit: 1, Offset: 5}, 10, []string{a.String() + " b@one.test", a.String() + " e@one.test"}},
		{Filter{}, 2, []string{a.String() + " b@one.test", a.String() + " c@two.test"}}, // stopped early
		{Filter{Status: Delivered}, 10, []string{b.String() + " d@one.test"}},
		{Filter{Status: Deferred}, 10, nil},
	}
	for _, tc := range tests {
		if got := walk(tc.f, tc.max); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("Walk(%+v) = %v, want %v", tc.f, got, tc.want)
		}
	}
}

// FuzzDecodeFinished: a finished record that does not decode is an error
// wrapping errCorrupt, never a panic.
func FuzzDecodeFinished(f *testing.F) {
	q := openAt(f, dbPath(f), Options{History: keepWeek})
	id := mustEnqueue(f, q, msg("a@src.test", "b@dst.test", "c@dst.test"))
	finish(f, q, t0, Failed, "no-such-user", Key{id, 0}, Key{id, 1})
	err := q.view(func(tx *bolt.Tx) error {
		_, v := tx.Bucket(bFinished).Cursor().First()
		f.Add(bytes.Clone(v))
		return nil
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte{})
	f.Add([]byte{finishedVersion})
	f.Add([]byte{2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := decodeFinished(1, b, true); err != nil && !errors.Is(err, errCorrupt) {
			t.Fatalf("error %v does not wrap errCorrupt", err)
		}
	})
}

// TestListByApplicationIDs: a message is found by its tag, ENVID or
// Message-ID (with or without angle brackets) while queued and, kept in
// the history, after it left the queue.
func TestListByApplicationIDs(t *testing.T) {
	q := openAt(t, dbPath(t), Options{History: keepWeek})
	a := msg("a@src.test", "b@dst.test")
	a.Tag, a.EnvID, a.MessageID = "welcome", "env-a", "<a1@src.test>"
	b := msg("a@src.test", "c@dst.test", "d@dst.test")
	b.Tag, b.EnvID, b.MessageID = "reset", "env-b", "<b1@src.test>"
	idA, idB := mustEnqueue(t, q, a), mustEnqueue(t, q, b)
	check := func(when string, want map[string]ID) {
		t.Helper()
		for _, tc := range []struct {
			f    Filter
			name string
		}{
			{Filter{Tag: "welcome"}, "a"}, {Filter{EnvID: "env-a"}, "a"}, {Filter{MessageID: "a1@src.test"}, "a"},
			{Filter{Tag: "reset"}, "b"}, {Filter{MessageID: "<b1@src.test>"}, "b"}, {Filter{EnvID: "env-b", Tag: "reset"}, "b"},
			{Filter{Tag: "Welcome"}, ""}, {Filter{EnvID: "env-a", Tag: "reset"}, ""},
		} {
			rows, total, err := q.List(tc.f)
			id, found := want[tc.name]
			if err != nil || found != (total > 0) {
				t.Errorf("%s: List(%+v) = %d rows, %v", when, tc.f, total, err)
				continue
			}
			for _, r := range rows {
				if r.Message.ID != id || r.Message.Tag == "" || r.Message.MessageID == "" {
					t.Errorf("%s: List(%+v) listed %+v", when, tc.f, r.Message)
				}
			}
		}
	}
	check("queued", map[string]ID{"a": idA, "b": idB})
	finish(t, q, t0.Add(time.Minute), Delivered, "", Key{idA, 0})
	check("a delivered", map[string]ID{"a": idA, "b": idB})
	if rows, _, _ := q.List(Filter{Tag: "welcome"}); len(rows) != 1 || rows[0].Message.Finished.IsZero() {
		t.Errorf("the delivered message is not listed from the history: %+v", rows)
	}
	if _, total, _ := q.List(Filter{Tag: "welcome", Status: Queued}); total != 0 {
		t.Errorf("a live status still lists the finished message")
	}
}
