package queue

import (
	"bytes"
	"fmt"
	"sort"
	"sync"
	"testing"
)

// acceptRecorder is an Options.OnAccept that stores one record per
// message, naming its ID and the first line of the head it was shown.
func acceptRecorder(id ID, m *NewMessage, head []byte) []Event {
	line, _, _ := bytes.Cut(head, []byte("\r\n"))
	return []Event{{Sink: "s", Data: fmt.Appendf(nil, "%v %s", id, line)}}
}

func outboxData(t *testing.T, q *Queue, sink string) []string {
	t.Helper()
	recs, err := q.Outbox(sink, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Data))
	}
	sort.Strings(out)
	return out
}

// The acceptance record of a message is stored by the transaction that
// inserts it, also when that happens at the next Open after a crash that
// came between the journal's sync and the insert: a record exists iff its
// message does, once.
func TestOutbox_AcceptedSurvivesCrash(t *testing.T) {
	for _, inDB := range []int{0, 1} {
		t.Run(fmt.Sprint("inDB=", inDB), func(t *testing.T) {
			q := openAt(t, dbPath(t), Options{OnAccept: acceptRecorder})
			var want []string
			for i := range inDB {
				id := mustEnqueue(t, q, msg("s@x.test", fmt.Sprintf("r%d@a.test", i)))
				want = append(want, fmt.Sprintf("%v Subject: hi", id))
			}
			if err := q.settle(); err != nil {
				t.Fatal(err)
			}
			snap := snapshot(t, q) // holds the first inDB messages and their records only
			id := mustEnqueue(t, q, msg("", "x@b.test"))
			want = append(want, fmt.Sprintf("%v Subject: hi", id))
			id = mustEnqueue(t, q, spooledMsg(t, q, []byte("Message-ID: <big@x>\r\n\r\n"+string(bytes.Repeat([]byte("l\r\n"), 100))), "z@d.test"))
			want = append(want, fmt.Sprintf("%v Message-ID: <big@x>", id))
			sort.Strings(want)
			if err := q.settle(); err != nil {
				t.Fatal(err)
			}
			if got := outboxData(t, q, "s"); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("before the crash: %q, want %q", got, want)
			}
			path := crashCopy(t, q, snap)
			q.Close()
			for round := range 2 { // the second Open replays nothing and adds nothing
				q2 := openAt(t, path, Options{OnAccept: acceptRecorder})
				if got := outboxData(t, q2, "s"); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("round %d after the crash: %q, want %q", round, got, want)
				}
				q2.Close()
			}
		})
	}
}

// A result's records are stored with it, and not at all for a recipient
// that is gone or already final; OnEvents hears of what was stored, and
// OutboxDone removes what a reader has passed on.
func TestOutbox_ResultEvents(t *testing.T) {
	var mu sync.Mutex
	heard := map[string]int{}
	q := openAt(t, dbPath(t), Options{OnEvents: func(added map[string]int) {
		mu.Lock()
		defer mu.Unlock()
		for k, n := range added {
			heard[k] += n
		}
	}})
	id := mustEnqueue(t, q, msg("s@x.test", "a@a.test", "b@a.test"))
	ev := func(s string) []Event { return []Event{{Sink: "w1", Data: []byte(s)}, {Sink: "w2", Data: []byte(s)}} }
	tests := []struct {
		res  Result
		want []string
	}{
		{Result{Key: Key{id, 0}, Status: Deferred, End: t0, Events: ev("a deferred")}, []string{"a deferred"}},
		{Result{Key: Key{id, 0}, Status: Delivered, End: t0, Events: ev("a delivered")}, []string{"a deferred", "a delivered"}},
		{Result{Key: Key{id, 0}, Status: Failed, End: t0, Events: ev("a failed again")}, []string{"a deferred", "a delivered"}},
		{Result{Key: Key{id, 7}, Status: Failed, End: t0, Events: ev("no such recipient")}, []string{"a deferred", "a delivered"}},
	}
	for i, tt := range tests {
		if _, err := q.Apply(Update{Results: []Result{tt.res}}); err != nil {
			t.Fatal(err)
		}
		for _, sink := range []string{"w1", "w2"} {
			if got := outboxData(t, q, sink); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("step %d: sink %s holds %q, want %q", i, sink, got, tt.want)
			}
		}
	}
	mu.Lock()
	if heard["w1"] != 2 || heard["w2"] != 2 {
		t.Errorf("OnEvents heard %v, want 2 for each sink", heard)
	}
	mu.Unlock()
	recs, _ := q.Outbox("w1", 1)
	if len(recs) != 1 {
		t.Fatalf("Outbox limit 1 returned %d", len(recs))
	}
	if err := q.OutboxDone("w1", recs[0].Seq); err != nil {
		t.Fatal(err)
	}
	if got := outboxData(t, q, "w1"); fmt.Sprint(got) != "[a delivered]" {
		t.Errorf("after OutboxDone: %q", got)
	}
	if n, _ := q.OutboxLen("w2"); n != 2 {
		t.Errorf("OutboxLen(w2) = %d, want 2 (another sink's reader does not take them)", n)
	}
	if n, _ := q.OutboxLen("none"); n != 0 {
		t.Errorf("OutboxLen(none) = %d", n)
	}
}

// AddEvents from many sessions at once (recipients refused at RCPT)
// stores every event once and tells OnEvents, through the writer's shared
// transactions, beside intake's own commits.
func TestOutbox_AddEventsConcurrent(t *testing.T) {
	var mu sync.Mutex
	heard := 0
	q := openAt(t, dbPath(t), Options{OnEvents: func(added map[string]int) {
		mu.Lock()
		defer mu.Unlock()
		heard += added["r"]
	}})
	const n = 40
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := q.AddEvents([]Event{{Sink: "r", Data: fmt.Appendf(nil, "refused %02d", i)}}); err != nil {
				t.Error(err)
			}
		}()
	}
	mustEnqueue(t, q, msg("s@x.test", "a@a.test"))
	wg.Wait()
	got := outboxData(t, q, "r")
	if len(got) != n || got[0] != "refused 00" || got[n-1] != fmt.Sprintf("refused %02d", n-1) {
		t.Errorf("outbox holds %d records (%v), want the %d refusals once each", len(got), got, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if heard != n {
		t.Errorf("OnEvents heard %d records, want %d", heard, n)
	}
}
