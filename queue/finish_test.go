package queue

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// dumpDB renders every bucket's keys, values and sequence, but the
// journal's salt.
func dumpDB(t *testing.T, q *Queue) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(path string, b *bolt.Bucket) error
	walk = func(path string, b *bolt.Bucket) error {
		out[path+" seq"] = fmt.Sprint(b.Sequence())
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(path+"/"+string(k), b.Bucket(k))
			}
			if path == BucketJournal && string(k) == string(keySalt) {
				return nil // random, per journal file
			}
			out[fmt.Sprintf("%s/%x", path, k)] = fmt.Sprintf("%x", v)
			return nil
		})
	}
	if err := q.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(string(name), b) })
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// A journaled message held by the transaction that inserts it and
// finishes it leaves the database as inserting it, then applying the
// outcome, would: the same finished record, outbox events, counters, ID
// sequence and applied journal number, and none of the message's records.
// A message held but not finished after all is stored as it stands.
func TestFinishHeld_AsInsertThenApply(t *testing.T) {
	end := t0.Add(2 * time.Second)
	start := func(keys ...Key) Start {
		return Start{Keys: keys, Time: t0.Add(time.Second), SourceIP: "192.0.2.1", MXHost: "mx.d.test",
			MXAddr: "192.0.2.25", LeaseUntil: t0.Add(time.Hour)}
	}
	res := func(k Key, st Status) Result {
		r := Result{Key: k, Status: st, End: end, Reason: "r", Reply: Reply{Code: 250, Enhanced: "2.0.0", Text: "ok"},
			TLS: "opportunistic", Events: []Event{{Sink: "s", Data: []byte(fmt.Sprint(k, st))}}}
		if st == Deferred {
			r.NextAttempt = end.Add(time.Minute)
		}
		return r
	}
	const id = ID(1) // the first message of a new queue
	k := func(i int) Key { return Key{id, i} }
	tests := []struct {
		name    string
		rcpts   int
		history HistoryOptions
		u       Update
	}{
		{"delivered", 1, keepWeek, Update{Starts: []Start{start(k(0))}, Results: []Result{res(k(0), Delivered)}}},
		{"delivered, no history kept", 1, HistoryOptions{}, Update{Starts: []Start{start(k(0))}, Results: []Result{res(k(0), Delivered)}}},
		{"failed with a DSN, relayed", 2, keepWeek, Update{Starts: []Start{start(k(0), k(1))},
			Results: []Result{res(k(0), Failed), res(k(1), Relayed)}, DSNs: []NewMessage{msg("", "s@x.test")}}},
		{"deferred, then delivered", 1, keepWeek, Update{Starts: []Start{start(k(0))},
			Results: []Result{res(k(0), Deferred), res(k(0), Delivered)}}},
		{"not finished: stored as it stands", 2, keepWeek, Update{Starts: []Start{start(k(0), k(1))},
			Results: []Result{res(k(0), Delivered), res(k(1), Deferred)}}},
		{"not finished: a recipient not started", 2, keepWeek, Update{Starts: []Start{start(k(0))},
			Results: []Result{res(k(0), Deferred)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dumps [2]map[string]string
			for i, held := range []bool{true, false} {
				q := openAt(t, dbPath(t), Options{History: tt.history, OnAccept: acceptRecorder})
				m := msg("s@x.test", []string{"a@d.test", "b@e.test"}[:tt.rcpts]...)
				b := &insertBatch{seq: 7, ms: []NewMessage{m}, ids: []ID{q.newID()}}
				if b.ids[0] != id {
					t.Fatalf("first ID %s", b.ids[0])
				}
				err := q.update(func(w *wtx) error {
					if held {
						w.finish = map[ID]bool{id: true}
					}
					if err := w.insertJournaled([]*insertBatch{b}); err != nil {
						return err
					}
					if _, err := w.applyUpdate(&tt.u); err != nil {
						return err
					}
					return w.storeHeld()
				})
				if err != nil {
					t.Fatal(err)
				}
				dumps[i] = dumpDB(t, q)
				checkStats(t, q)
			}
			if !reflect.DeepEqual(dumps[0], dumps[1]) {
				for key, v := range dumps[1] {
					if dumps[0][key] != v {
						t.Errorf("%s: held %q, inserted %q", key, dumps[0][key], v)
					}
				}
				for key, v := range dumps[0] {
					if _, ok := dumps[1][key]; !ok {
						t.Errorf("%s: held %q, inserted: none", key, v)
					}
				}
			}
		})
	}
}

// Only a batch of nothing but outcomes (ApplyAsync) holds messages, and
// only those one Update starts and finishes whole.
func TestFinishedInBatch(t *testing.T) {
	m1, m2 := msg("s@x.test", "a@d.test"), msg("s@x.test", "a@d.test", "b@e.test")
	spooled := msg("s@x.test", "a@d.test")
	spooled.Body, spooled.File = nil, &BodyFile{}
	pending := []*insertBatch{{ms: []NewMessage{m1, m2}, ids: []ID{1, 2}}, {ms: []NewMessage{spooled}, ids: []ID{3}}}
	st := func(keys ...Key) Start { return Start{Keys: keys} }
	rs := func(s Status, keys ...Key) []Result {
		var out []Result
		for _, k := range keys {
			out = append(out, Result{Key: k, Status: s})
		}
		return out
	}
	up := func(u Update) request { return request{upd: &u} }
	tests := []struct {
		name  string
		batch []request
		want  map[ID]bool
	}{
		{"one message", []request{up(Update{Starts: []Start{st(Key{1, 0})}, Results: rs(Delivered, Key{1, 0})})}, map[ID]bool{1: true}},
		{"both recipients, two starts", []request{up(Update{Starts: []Start{st(Key{2, 0}), st(Key{2, 1})},
			Results: append(rs(Failed, Key{2, 0}), rs(Relayed, Key{2, 1})...)})}, map[ID]bool{2: true}},
		{"one recipient of two", []request{up(Update{Starts: []Start{st(Key{2, 0})}, Results: rs(Delivered, Key{2, 0})})}, nil},
		{"not final", []request{up(Update{Starts: []Start{st(Key{1, 0})}, Results: rs(Deferred, Key{1, 0})})}, nil},
		{"not started", []request{up(Update{Results: rs(Delivered, Key{1, 0})})}, nil},
		{"a key out of range", []request{up(Update{Starts: []Start{st(Key{1, 0}, Key{1, 1})}, Results: rs(Delivered, Key{1, 0})})}, nil},
		{"spooled", []request{up(Update{Starts: []Start{st(Key{3, 0})}, Results: rs(Delivered, Key{3, 0})})}, nil},
		{"named by two updates", []request{
			up(Update{Starts: []Start{st(Key{2, 0})}, Results: rs(Delivered, Key{2, 0})}),
			up(Update{Starts: []Start{st(Key{2, 1}), st(Key{1, 0})}, Results: rs(Delivered, Key{2, 1}, Key{1, 0})}),
		}, map[ID]bool{1: true}},
		{"another request in the batch", []request{
			up(Update{Starts: []Start{st(Key{1, 0})}, Results: rs(Delivered, Key{1, 0})}),
			{fn: func(*wtx) error { return nil }},
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := finishedInBatch(pending, tt.batch); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// Fresh outcomes handed over right after their Enqueue, with a commit
// delay as the relay's, so that most share the commit of their message's
// insert: every message ends finished, with its history, its events and
// the counters right, also after reopening.
func TestFreshOutcomesWithTheirInserts(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{History: keepWeek, OnAccept: acceptRecorder, CommitDelay: 5 * time.Millisecond})
	const workers, each = 8, 40
	var (
		mu  sync.Mutex
		ids []ID
		wg  sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ps []*Pending
			for range each {
				id, err := q.Enqueue(msg("s@x.test", "a@d.test", "b@e.test"))
				if err != nil {
					t.Error(err)
					return
				}
				ks := []Key{{id, 0}, {id, 1}}
				u := Update{Starts: []Start{{Keys: ks, Time: t0, MXHost: "mx.d.test", LeaseUntil: t0.Add(time.Hour)}}}
				for _, k := range ks {
					u.Results = append(u.Results, Result{Key: k, Status: Delivered, End: t0.Add(time.Second),
						Events: []Event{{Sink: "s", Data: []byte(fmt.Sprint("done ", k))}}})
				}
				ps = append(ps, q.ApplyAsync(u))
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
			for _, p := range ps {
				if _, err := p.Wait(); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	check := func(q *Queue) {
		t.Helper()
		if st, err := q.Stats(); err != nil || st.Messages != 0 || st.Recipients != 0 {
			t.Errorf("Stats %+v, %v; want every message finished", st, err)
		}
		checkStats(t, q)
		for _, id := range ids {
			m := mustShow(t, q, id)
			if m.Finished.IsZero() || len(m.Recipients) != 2 {
				t.Fatalf("message %s: %+v", id, m)
			}
			for _, r := range m.Recipients {
				if r.Status != Delivered || r.Attempts != 1 || len(r.History) != 1 || r.History[0].Outcome != string(Delivered) {
					t.Errorf("recipient %s: %+v", r.Key, r)
				}
			}
		}
		if n, err := q.OutboxLen("s"); err != nil || n != 3*len(ids) {
			t.Errorf("outbox: %d records, %v; want %d (accepted, and one per recipient)", n, err, 3*len(ids))
		}
	}
	check(q)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	check(openAt(t, path, Options{History: keepWeek, OnAccept: acceptRecorder}))
}
