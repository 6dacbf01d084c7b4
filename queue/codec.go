package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Record encoding.
//
// Every value the queue writes starts with a version byte followed by a
// compact binary body: unsigned varints, zig-zag varints, length-prefixed
// strings and times as Unix nanoseconds (0 = the zero time). Fields are
// written in a fixed order. A decoder is strict: unknown version, bad status
// byte, out-of-range length or trailing bytes are errors, so that garbage is
// detected (and quarantined) rather than half-read. To change a layout, bump
// the version and keep decoding the old one.
//
// Binary rather than JSON because List and the Open scan decode every
// recipient record; this codec does it without reflection.
const codecVersion = 1

var errCorrupt = errors.New("corrupt record")

type enc struct{ b []byte }

func newEnc() *enc { return &enc{b: []byte{codecVersion}} }

func (e *enc) u(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) i(v int64)  { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) s(v string) { e.u(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

func (e *enc) t(v time.Time) {
	if v.IsZero() {
		e.i(0)
		return
	}
	e.i(v.UnixNano())
}

func (e *enc) reply(r Reply) { e.i(int64(r.Code)); e.s(r.Enhanced); e.s(r.Text) }

// dec reads what enc wrote. The first error sticks; later reads return zero
// values, so decoders check d.err once at the end.
type dec struct {
	b   []byte
	err error
}

func newDec(b []byte) *dec {
	d := &dec{b: b}
	if len(b) == 0 {
		d.fail("empty")
	} else if b[0] != codecVersion {
		d.fail(fmt.Sprintf("unknown version %d", b[0]))
	} else {
		d.b = b[1:]
	}
	return d
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errCorrupt, what)
	}
	d.b = nil
}

func (d *dec) u() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) i() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) int() int { return int(d.i()) }

func (d *dec) s() string {
	n := d.u()
	if n > uint64(len(d.b)) {
		d.fail("string length out of range")
		return ""
	}
	v := string(d.b[:n])
	d.b = d.b[n:]
	return v
}

func (d *dec) byte() byte {
	if len(d.b) == 0 {
		d.fail("short")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) bool() bool {
	switch d.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail("bad bool")
	return false
}

func (d *dec) t() time.Time {
	n := d.i()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func (d *dec) reply() Reply {
	return Reply{Code: d.int(), Enhanced: d.s(), Text: d.s()}
}

// count reads a element count; every element takes at least one byte, which
// bounds allocations made for corrupt input.
func (d *dec) count() int {
	n := d.u()
	if n > uint64(len(d.b)) {
		d.fail("count out of range")
		return 0
	}
	return int(n)
}

// done returns the sticky error, or an error if bytes are left over.
func (d *dec) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	return d.err
}

var statusCodes = []Status{"", Queued, Deferred, Active, Held, Delivered, Relayed, Failed}

func statusByte(s Status) byte {
	for i, v := range statusCodes {
		if v == s && i > 0 {
			return byte(i)
		}
	}
	panic("queue: unknown status " + string(s)) // callers validate first
}

func (d *dec) status() Status {
	b := d.byte()
	if b == 0 || int(b) >= len(statusCodes) {
		d.fail("bad status")
		return ""
	}
	return statusCodes[b]
}

const (
	flagSMTPUTF8 = 1 << iota
	flagEightBit
	flagDSN
	flagMask = flagSMTPUTF8 | flagEightBit | flagDSN
)

func encodeMessage(m *Message) []byte {
	e := newEnc()
	e.s(m.From)
	e.t(m.Arrival)
	e.i(m.Size)
	e.s(m.ClientAddr)
	e.s(m.AuthUser)
	e.s(m.Helo)
	e.s(m.RET)
	e.s(m.EnvID)
	var f uint64
	if m.SMTPUTF8 {
		f |= flagSMTPUTF8
	}
	if m.EightBit {
		f |= flagEightBit
	}
	if m.DSN {
		f |= flagDSN
	}
	e.u(f)
	return e.b
}

func decodeMessage(id ID, b []byte) (Message, error) {
	d := newDec(b)
	m := Message{ID: id, From: d.s(), Arrival: d.t(), Size: d.i(),
		ClientAddr: d.s(), AuthUser: d.s(), Helo: d.s(), RET: d.s(), EnvID: d.s()}
	f := d.u()
	if f&^flagMask != 0 {
		d.fail("unknown flags")
	}
	m.SMTPUTF8, m.EightBit, m.DSN = f&flagSMTPUTF8 != 0, f&flagEightBit != 0, f&flagDSN != 0
	return m, d.done()
}

// encodeRecipient writes r without Key (it is the bbolt key) and History
// (stored separately so List and Due never decode it). Status and Reason come
// first so cheap scans could stop early.
func encodeRecipient(r *Recipient) []byte {
	e := newEnc()
	e.b = append(e.b, statusByte(r.Status))
	e.s(r.Reason)
	e.s(r.Addr)
	e.s(r.Domain)
	e.s(r.Notify)
	e.s(r.ORCPT)
	e.reply(r.Reply)
	e.i(int64(r.Attempts))
	e.t(r.NextAttempt)
	e.t(r.FirstAttempt)
	e.t(r.LastAttempt)
	e.t(r.FirstGreylisted)
	e.i(int64(r.GreylistTries))
	e.s(r.SourceIP)
	e.s(r.MXHost)
	e.s(r.MXAddr)
	e.i(int64(r.DelayWarnings))
	return e.b
}

func decodeRecipient(k Key, b []byte) (Recipient, error) {
	d := newDec(b)
	r := Recipient{Key: k, Status: d.status(), Reason: d.s(),
		Addr: d.s(), Domain: d.s(), Notify: d.s(), ORCPT: d.s(), Reply: d.reply(),
		Attempts: d.int(), NextAttempt: d.t(), FirstAttempt: d.t(), LastAttempt: d.t(),
		FirstGreylisted: d.t(), GreylistTries: d.int(),
		SourceIP: d.s(), MXHost: d.s(), MXAddr: d.s(), DelayWarnings: d.int()}
	return r, d.done()
}

func encodeHistory(h []Attempt) []byte {
	e := newEnc()
	e.u(uint64(len(h)))
	for i := range h {
		a := &h[i]
		e.t(a.Start)
		e.t(a.End)
		e.s(a.SourceIP)
		e.s(a.MXHost)
		e.s(a.MXAddr)
		e.s(a.Stage)
		e.s(a.Outcome)
		e.s(a.Reason)
		e.reply(a.Reply)
	}
	return e.b
}

func decodeHistory(b []byte) ([]Attempt, error) {
	d := newDec(b)
	n := d.count()
	var h []Attempt
	for i := 0; i < n && d.err == nil; i++ {
		h = append(h, Attempt{Start: d.t(), End: d.t(), SourceIP: d.s(), MXHost: d.s(),
			MXAddr: d.s(), Stage: d.s(), Outcome: d.s(), Reason: d.s(), Reply: d.reply()})
	}
	return h, d.done()
}

func encodeDestination(x *Destination) []byte {
	e := newEnc()
	e.s(x.Domain)
	e.bool(x.Greylists)
	e.i(int64(x.GreylistSeen))
	e.i(int64(x.GreylistPassed))
	e.i(int64(x.LearnedDelay))
	e.t(x.LastGreylisted)
	e.i(int64(x.ThrottleLevel))
	e.t(x.ThrottledUntil)
	hosts := make([]string, 0, len(x.DeadHosts))
	for h := range x.DeadHosts {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts) // deterministic bytes
	e.u(uint64(len(hosts)))
	for _, h := range hosts {
		e.s(h)
		e.t(x.DeadHosts[h])
	}
	e.reply(x.LastReply)
	e.t(x.Updated)
	return e.b
}

func decodeDestination(b []byte) (Destination, error) {
	d := newDec(b)
	x := Destination{Domain: d.s(), Greylists: d.bool(), GreylistSeen: d.int(),
		GreylistPassed: d.int(), LearnedDelay: time.Duration(d.i()), LastGreylisted: d.t(),
		ThrottleLevel: d.int(), ThrottledUntil: d.t()}
	if n := d.count(); n > 0 {
		x.DeadHosts = make(map[string]time.Time, n)
		for i := 0; i < n && d.err == nil; i++ {
			h := d.s()
			x.DeadHosts[h] = d.t()
		}
	}
	x.LastReply = d.reply()
	x.Updated = d.t()
	return x, d.done()
}
