package queue

import (
	"fmt"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// Salvage keeps what it can besides the messages: the quarantine (the
// records an operator may still want to look at) and the events outbox
// (events not yet passed on would otherwise never reach the application),
// with the outbox's sequence, so that the next event does not take the
// key of one kept; and the stores (the MTA-STS policies and the TLS
// reporting state).
func TestSalvageKeepsQuarantineAndOutbox(t *testing.T) {
	path := dbPath(t)
	accept := func(id ID, _ *NewMessage, _ []byte) []Event {
		return []Event{{Sink: "hook", Data: fmt.Appendf(nil, "accepted %s", id)}}
	}
	q := openAt(t, path, Options{OnAccept: accept})
	for i := range 3 {
		mustEnqueue(t, q, msg("s@src.test", fmt.Sprintf("r%d@d.test", i)))
	}
	if err := q.settle(); err != nil {
		t.Fatal(err)
	}
	quarantined := []byte("a record that did not decode")
	if err := q.update(func(w *wtx) error {
		b, err := w.b(bQuarantine).CreateBucketIfNotExists(bRcpts)
		if err != nil {
			return err
		}
		return b.Put([]byte("0123456789ab"), quarantined)
	}); err != nil {
		t.Fatal(err)
	}
	stored := map[string]string{"tlspolicy": `{"policy":1}`, "tlsreport": `[2]`}
	for name, v := range stored {
		if err := q.Store(name).Put("k", []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	before, err := q.Outbox("hook", 10)
	if err != nil || len(before) != 3 {
		t.Fatalf("outbox before: %d records, %v", len(before), err)
	}
	q.Close()

	salvage(t, path)

	q = openAt(t, path, Options{OnAccept: accept})
	after, err := q.Outbox("hook", 10)
	if err != nil || len(after) != len(before) {
		t.Fatalf("outbox after salvage: %d records, %v; want the %d not passed on", len(after), err, len(before))
	}
	for i := range after {
		if after[i].Seq != before[i].Seq || string(after[i].Data) != string(before[i].Data) {
			t.Errorf("outbox record %d: %d %q, want %d %q", i, after[i].Seq, after[i].Data, before[i].Seq, before[i].Data)
		}
	}
	for name, want := range stored {
		if v, err := q.Store(name).Get("k"); err != nil || string(v) != want {
			t.Errorf("store %s after salvage: %q, %v; want %q", name, v, err, want)
		}
	}
	mustEnqueue(t, q, msg("s@src.test", "later@d.test"))
	if err := q.settle(); err != nil {
		t.Fatal(err)
	}
	if all, _ := q.Outbox("hook", 10); len(all) != 4 || all[3].Seq <= before[2].Seq {
		t.Errorf("the next event after salvage: %+v, want a fourth record after the kept ones", all)
	}
	var got []byte
	if err := q.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bQuarantine).Bucket(bRcpts); b != nil {
			got = b.Get([]byte("0123456789ab"))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(quarantined) {
		t.Errorf("quarantined record after salvage: %q, want %q", got, quarantined)
	}
}

// A recipient Salvage took from an older copy of its record (its current
// one was on a lost page) may already have been delivered: Show says so,
// and a recipient whose current record was read says nothing. The mark
// goes with the recipient.
func TestSalvageMarksOlderCopies(t *testing.T) {
	for _, smashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("recipients branch page lost=%v", smashed), func(t *testing.T) {
			q, acc := fillDamageQueue(t, dbPath(t), 400)
			path := q.path
			q.Close()
			if smashed {
				smashBranch(t, path, bRcpts)
			}
			salvage(t, path)
			q = openAt(t, path, Options{})
			marked, shown := 0, 0
			var one Key
			for id := range acc.bodies {
				m, err := q.Show(id)
				if err != nil {
					continue // not recovered, or delivered
				}
				for _, r := range m.Recipients {
					shown++
					if !r.Salvaged.IsZero() {
						marked++
						one = r.Key
						if !r.Salvaged.Equal(t0) {
							t.Fatalf("recipient %s: salvaged at %v, want the salvage's time %v", r.Key, r.Salvaged, t0)
						}
					}
				}
			}
			switch {
			case shown == 0:
				t.Fatal("no recipient recovered")
			case smashed && marked == 0:
				t.Fatalf("none of %d recipients recovered from the page scan is marked", shown)
			case !smashed && marked != 0:
				t.Fatalf("%d of %d recipients read from the tree are marked", marked, shown)
			case !smashed:
				return
			}
			if _, err := q.Delete(Selector{ID: one.ID}); err != nil {
				t.Fatal(err)
			}
			if err := q.view(func(tx *bolt.Tx) error {
				if v := tx.Bucket(bSalvaged).Get(rcptKey(one)); v != nil {
					return fmt.Errorf("the mark of deleted recipient %s stays", one)
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
		})
	}
}
