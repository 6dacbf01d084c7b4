package queue

import (
	"encoding/binary"
	"fmt"

	"github.com/greyrelay/greyrelay/queue/journal"
)

// This file is what the queue writes in the intake journal's records
// (queue/journal): the new messages of one or more Enqueue calls, with
// their IDs, in the queue's own encoding (codec.go).

// journalVersion is the payload layout; 2 adds the REQUIRETLS flags, 3
// the tag and the Message-ID.
const journalVersion = 3

// encodeRecord builds the record numbered seq for ms with their ids, and
// returns the messages as the writer will insert them: bodies point into
// the record, recipients are copied (the caller may reuse its slices once
// Enqueue returns).
func encodeRecord(salt [8]byte, seq uint64, ms []NewMessage, ids []ID) ([]byte, []NewMessage) {
	e := &enc{b: make([]byte, journal.RecordHead, journal.RecordHead+64+journalSize(ms))}
	e.b = append(e.b, journalVersion)
	e.u(uint64(len(ms)))
	bodyAt := make([]int, len(ms))
	for i := range ms {
		e.u(uint64(ids[i]))
		bodyAt[i] = encodeNew(e, &ms[i])
	}
	rec := e.b
	journal.Seal(rec, salt, seq)
	out := make([]NewMessage, len(ms))
	for i, m := range ms {
		m.To = append([]NewRecipient(nil), m.To...)
		if m.File == nil {
			m.Body = rec[bodyAt[i] : bodyAt[i]+len(m.Body) : bodyAt[i]+len(m.Body)]
		}
		out[i] = m
	}
	return rec, out
}

// journalSize is about how many bytes ms take in a record.
func journalSize(ms []NewMessage) int {
	n := 0
	for i := range ms {
		n += len(ms[i].Body) + 128*len(ms[i].To) + 256
	}
	return n
}

// encodeNew appends m and returns the offset of its body in e.b.
func encodeNew(e *enc, m *NewMessage) int {
	e.s(m.From)
	e.t(m.Arrival)
	e.s(m.ClientAddr)
	e.s(m.AuthUser)
	e.s(m.Helo)
	e.s(m.RET)
	e.s(m.EnvID)
	e.bool(m.SMTPUTF8)
	e.bool(m.EightBit)
	e.bool(m.DSN)
	e.bool(m.RequireTLS)
	e.bool(m.TLSOptional)
	e.s(m.Tag)
	e.s(m.MessageID)
	e.t(m.NextAttempt)
	e.u(uint64(len(m.To)))
	for _, r := range m.To {
		e.s(r.Addr)
		e.s(r.Domain)
		e.s(r.Notify)
		e.s(r.ORCPT)
	}
	if m.File != nil {
		// Kind 2 carries the file's checksum (seal.go); kind 1, without
		// it, is still read.
		e.u(2)
		e.s(m.File.name)
		e.i(m.File.n)
		e.b = binary.BigEndian.AppendUint32(e.b, m.File.sum)
		return 0
	}
	e.u(0)
	e.u(uint64(len(m.Body)))
	at := len(e.b)
	e.b = append(e.b, m.Body...)
	return at
}

// decodeRecord reads a record's payload back into messages and their IDs.
func decodeRecord(payload []byte) ([]NewMessage, []ID, error) {
	d, v := newDecV(payload, journalVersion)
	n := d.count()
	ms := make([]NewMessage, 0, n)
	ids := make([]ID, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		ids = append(ids, ID(d.u()))
		ms = append(ms, decodeNew(d, v))
	}
	if err := d.done(); err != nil {
		return nil, nil, fmt.Errorf("journal record: %w", err)
	}
	return ms, ids, nil
}

func decodeNew(d *dec, version byte) NewMessage {
	m := NewMessage{From: d.s(), Arrival: d.t(), ClientAddr: d.s(), AuthUser: d.s(), Helo: d.s(),
		RET: d.s(), EnvID: d.s(), SMTPUTF8: d.bool(), EightBit: d.bool(), DSN: d.bool()}
	if version >= 2 { // version 2 adds the REQUIRETLS flags
		m.RequireTLS, m.TLSOptional = d.bool(), d.bool()
	}
	if version >= 3 {
		m.Tag, m.MessageID = d.s(), d.s()
	}
	m.NextAttempt = d.t()
	n := d.count()
	for i := 0; i < n && d.err == nil; i++ {
		m.To = append(m.To, NewRecipient{Addr: d.s(), Domain: d.s(), Notify: d.s(), ORCPT: d.s()})
	}
	switch d.u() {
	case 0:
		m.Body = d.bytes(d.u())
	case 1:
		m.File = &BodyFile{name: d.s(), n: d.i()}
	case 2:
		m.File = &BodyFile{name: d.s(), n: d.i(), summed: true}
		if s := d.bytes(4); s != nil {
			m.File.sum = binary.BigEndian.Uint32(s)
		}
	default:
		d.fail("bad body kind")
	}
	return m
}
