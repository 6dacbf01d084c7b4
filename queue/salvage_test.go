package queue_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/queue/salvage"
)

// The tests of queue/salvage that hold the salvaged file to the queue's
// own invariants (its counters and due index, its raw buckets): they
// need the queue's test helpers (export_test.go), so they live beside
// the queue, in package queue_test, which may import queue/salvage.

func salvageAt(t *testing.T, path string) *salvage.Report {
	t.Helper()
	rep, err := salvage.Salvage(path, queue.T0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rep.DamagedPath); err != nil {
		t.Fatalf("damaged file not kept: %v", err)
	}
	t.Logf("salvage: %d messages, %d recipients; %d damage notes, %d lost", rep.Messages, rep.Recipients,
		len(rep.Damage), len(rep.Lost))
	return rep
}

func TestSalvage(t *testing.T) {
	all := func(queue.ID) bool { return true }
	cases := []struct {
		name   string
		damage func(t *testing.T, path string)
		want   func(queue.ID) bool // messages that must come back
	}{
		{"undamaged", func(*testing.T, string) {}, all},
		{"recipients branch page", func(t *testing.T, p string) { queue.SmashBranch(t, p, queue.BRcpts) }, all},
		{"messages branch page", func(t *testing.T, p string) { queue.SmashBranch(t, p, queue.BMsgs) }, all},
		{"bodies branch page", func(t *testing.T, p string) { queue.SmashBranch(t, p, queue.BBodies) }, all},
		{"meta page 0 zeroed", func(t *testing.T, p string) { queue.ZeroMeta(t, p, 0) }, all},
		{"both meta pages zeroed", func(t *testing.T, p string) { queue.ZeroMeta(t, p, 0); queue.ZeroMeta(t, p, 1) }, all},
		{"truncated", func(t *testing.T, p string) {
			fi, _ := os.Stat(p)
			if err := os.Truncate(p, fi.Size()*6/10); err != nil {
				t.Fatal(err)
			}
		}, func(queue.ID) bool { return false }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, acc := queue.FillDamageQueue(t, queue.DBPath(t), 400)
			path := q.Path()
			q.Close()
			c.damage(t, path)
			rep := salvageAt(t, path)
			if rep.Messages == 0 {
				t.Fatal("nothing recovered")
			}
			queue.CheckSalvaged(t, path, acc, c.want)
		})
	}
}

// Salvage keeps what it can besides the messages: the quarantine (the
// records an operator may still want to look at) and the events outbox
// (events not yet passed on would otherwise never reach the application),
// with the outbox's sequence, so that the next event does not take the
// key of one kept; and the stores (the MTA-STS policies and the TLS
// reporting state).
func TestSalvageKeepsQuarantineAndOutbox(t *testing.T) {
	path := queue.DBPath(t)
	accept := func(id queue.ID, _ *queue.NewMessage, _ []byte) []queue.Event {
		return []queue.Event{{Sink: "hook", Data: fmt.Appendf(nil, "accepted %s", id)}}
	}
	q := queue.OpenAt(t, path, queue.Options{OnAccept: accept})
	for i := range 3 {
		queue.MustEnqueue(t, q, queue.Msg("s@src.test", fmt.Sprintf("r%d@d.test", i)))
	}
	if err := q.Settle(); err != nil {
		t.Fatal(err)
	}
	quarantined := []byte("a record that did not decode")
	if err := q.PutQuarantined(queue.BRcpts, []byte("0123456789ab"), quarantined); err != nil {
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

	salvageAt(t, path)

	q = queue.OpenAt(t, path, queue.Options{OnAccept: accept})
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
	queue.MustEnqueue(t, q, queue.Msg("s@src.test", "later@d.test"))
	if err := q.Settle(); err != nil {
		t.Fatal(err)
	}
	if all, _ := q.Outbox("hook", 10); len(all) != 4 || all[3].Seq <= before[2].Seq {
		t.Errorf("the next event after salvage: %+v, want a fourth record after the kept ones", all)
	}
	got, err := q.Quarantined(queue.BRcpts, []byte("0123456789ab"))
	if err != nil {
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
			q, acc := queue.FillDamageQueue(t, queue.DBPath(t), 400)
			path := q.Path()
			q.Close()
			if smashed {
				queue.SmashBranch(t, path, queue.BRcpts)
			}
			salvageAt(t, path)
			q = queue.OpenAt(t, path, queue.Options{})
			marked, shown := 0, 0
			var one queue.Key
			for _, id := range acc.IDs() {
				m, err := q.Show(id)
				if err != nil {
					continue // not recovered, or delivered
				}
				for _, r := range m.Recipients {
					shown++
					if !r.Salvaged.IsZero() {
						marked++
						one = r.Key
						if !r.Salvaged.Equal(queue.T0) {
							t.Fatalf("recipient %s: salvaged at %v, want the salvage's time %v", r.Key, r.Salvaged, queue.T0)
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
			if _, err := q.Delete(queue.Selector{ID: one.ID}); err != nil {
				t.Fatal(err)
			}
			if v, err := q.SalvagedMarkOf(one); err != nil || v != nil {
				t.Errorf("the mark of deleted recipient %s stays (%v)", one, err)
			}
		})
	}
}
