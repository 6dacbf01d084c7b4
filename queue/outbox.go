package queue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
)

// The outbox holds records the caller wants delivered elsewhere (the
// relay's delivery events for applications), written in the same
// transaction as the change they describe, so that a record exists iff
// its change was stored, and survives a crash as the change does:
//
//	outbox     sink name → nested bucket: seq(8) → opaque record
//
// The queue does not read the records. Each sink (a webhook, the event
// file) has its own nested bucket, numbered by its own sequence; its reader
// takes the oldest records (Outbox) and removes them once it has passed them
// on (OutboxDone). The bucket is created by the first write that needs it,
// so a database without events is left as it was.
var bOutbox = []byte("outbox")

// headLimit is how much of a body OnAccept sees: enough for any sane
// header section.
const headLimit = 64 << 10

// Event is one outbox record for one sink.
type Event struct {
	Sink string
	Data []byte
}

// OutboxRecord is a stored Event as its sink's reader sees it.
type OutboxRecord struct {
	Seq  uint64
	Data []byte
}

// eventTx is what one write transaction adds to the outbox.
type eventTx struct {
	accept func(id ID, m *NewMessage, head []byte) []Event
	spool  string         // the spool directory, to read a spooled body's head
	added  map[string]int // records put, by sink
}

// accepted runs Options.OnAccept for message id, inserted by this
// transaction from intake (directly or from the journal, also when Open
// replays it), and stores what it returns.
func (w *wtx) accepted(id ID, m *NewMessage) error {
	if w.events.accept == nil {
		return nil
	}
	head := m.Body
	if m.File != nil {
		head = readHead(filepath.Join(w.events.spool, m.File.name))
	}
	if len(head) > headLimit {
		head = head[:headLimit]
	}
	return w.putEvents(w.events.accept(id, m, head))
}

// messageHead returns message id and the start of its body (at most
// headLimit octets); ok is false if its record cannot be read.
func (w *wtx) messageHead(id ID) (m Message, head []byte, ok bool) {
	var ps []problem
	m, err := getMessage(w.tx, id, &ps)
	if err != nil {
		return Message{}, nil, false
	}
	if name := w.b(bSpool).Get(idKey(m.ID)); name != nil {
		head = readHead(filepath.Join(w.events.spool, string(name)))
	} else {
		head = w.b(bBodies).Get(idKey(m.ID))
	}
	if len(head) > headLimit {
		head = head[:headLimit]
	}
	return m, head, true
}

// readHead reads the start of a spooled body. A file that cannot be read
// gives no head: the events then lack what the header would have told,
// which is no reason to refuse the message.
func readHead(path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	b := make([]byte, headLimit)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	return b[:n]
}

// putEvents appends es to their sinks' buckets.
func (w *wtx) putEvents(es []Event) error {
	if len(es) == 0 {
		return nil
	}
	root, err := w.tx.CreateBucketIfNotExists(bOutbox)
	if err != nil {
		return err
	}
	for _, e := range es {
		b, err := root.CreateBucketIfNotExists([]byte(e.Sink))
		if err != nil {
			return err
		}
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		b.FillPercent = 1 // keys only grow
		if err := b.Put(binary.BigEndian.AppendUint64(nil, seq), e.Data); err != nil {
			return err
		}
		if w.events.added == nil {
			w.events.added = map[string]int{}
		}
		w.events.added[e.Sink]++
	}
	return nil
}

// eventsStored tells Options.OnEvents what a committed transaction added.
func (q *Queue) eventsStored(added map[string]int) {
	if len(added) > 0 && q.opt.OnEvents != nil {
		q.opt.OnEvents(added)
	}
}

// Outbox returns up to limit of sink's oldest records.
func (q *Queue) Outbox(sink string, limit int) ([]OutboxRecord, error) {
	var out []OutboxRecord
	err := q.view(func(tx *bolt.Tx) error {
		b := sinkBucket(tx, sink)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.First(); k != nil && len(out) < limit; k, v = c.Next() {
			if len(k) == 8 {
				out = append(out, OutboxRecord{Seq: binary.BigEndian.Uint64(k), Data: bytes.Clone(v)})
			}
		}
		return nil
	})
	return out, err
}

// OutboxLen returns how many records sink holds.
func (q *Queue) OutboxLen(sink string) (int, error) {
	n := 0
	err := q.view(func(tx *bolt.Tx) error {
		if b := sinkBucket(tx, sink); b != nil {
			n = b.Stats().KeyN
		}
		return nil
	})
	return n, err
}

// OutboxDone removes sink's records numbered up to and including seq.
func (q *Queue) OutboxDone(sink string, seq uint64) error {
	return q.update(func(w *wtx) error {
		b := sinkBucket(w.tx, sink)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, _ := c.First(); k != nil && (len(k) != 8 || binary.BigEndian.Uint64(k) <= seq); k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

func sinkBucket(tx *bolt.Tx, sink string) *bolt.Bucket {
	root := tx.Bucket(bOutbox)
	if root == nil {
		return nil
	}
	return root.Bucket([]byte(sink))
}

// AddEvents stores es in the outbox alone, for an event whose cause
// changes nothing in the queue (a recipient refused at RCPT). It goes
// through the writer like intake's and delivery's commits, so a burst of
// refusals shares their transactions and syncs instead of making one
// transaction and one sync of its own per refused recipient.
func (q *Queue) AddEvents(es []Event) error {
	if len(es) == 0 {
		return nil
	}
	return q.submit(len(es), 0, func(w *wtx) error { return w.putEvents(es) })
}
