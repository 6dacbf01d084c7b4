package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
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
//
// Version 2 (recipients and histories; version 1 still decodes) makes them
// smaller, because at 1,000,000 queued recipients their bytes are most of
// the file, and bbolt maps the file into memory: a recipient's Domain is
// not repeated when it is the part of Addr after the last '@'; an IP
// address (source IP, MX address, an MX given as an address) takes its 4 or
// 16 bytes, not its text; and a history stores each attempt against the
// one after it, the newest against its recipient record, writing only the
// fields that differ: a greylisting saga repeats the same route, reason and
// reply. Times stay absolute: a field that grows on a later write makes
// bbolt split a packed page (see setFillPercent).
//
// Version 2 of messages adds the body's CRC-32C. Messages, recipients and
// histories are sealed (seal.go): the version byte's high bit set and a
// CRC-32C of bucket, key and record at the end, checked before decoding.
// Unsealed records of older versions still decode. Version 3 of messages
// adds the tag and the Message-ID.
const (
	codecVersion = 1 // destinations, counters
	msgVersion   = 3
	rcptVersion  = 2
	histVersion  = 3 // 3 adds each attempt's TLS policy
)

var errCorrupt = errors.New("corrupt record")

type enc struct{ b []byte }

func newEnc() *enc { return newEncV(codecVersion) }

func newEncV(version byte) *enc { return &enc{b: []byte{version}} }

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

func (e *enc) t(v time.Time) { e.i(nanos(v)) }

// nanos is how a time is stored: Unix nanoseconds, 0 for the zero time.
func nanos(v time.Time) int64 {
	if v.IsZero() {
		return 0
	}
	return v.UnixNano()
}

// fromNanos inverts nanos.
func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// addr writes s as s does, except an IP address in its canonical text form,
// which takes its 4 or 16 bytes. The length is written doubled; the odd
// values 1 and 3 announce an IPv4 and an IPv6 address.
func (e *enc) addr(s string) {
	var text [64]byte // longer than any address's text: the check allocates nothing
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" && string(a.AppendTo(text[:0])) == s {
		if a.Is4() {
			b := a.As4()
			e.u(1)
			e.b = append(e.b, b[:]...)
			return
		}
		b := a.As16()
		e.u(3)
		e.b = append(e.b, b[:]...)
		return
	}
	e.u(2 * uint64(len(s)))
	e.b = append(e.b, s...)
}

// code writes s as the index of a known value, or as text: the doubled
// length trick of addr, with odd values 2i+1 for known[i].
func (e *enc) code(s string, known []string) {
	for i, k := range known {
		if k == s {
			e.u(2*uint64(i) + 1)
			return
		}
	}
	e.u(2 * uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *enc) reply(r Reply) { e.i(int64(r.Code)); e.s(r.Enhanced); e.s(r.Text) }

// dec reads what enc wrote. The first error sticks; later reads return zero
// values, so decoders check d.err once at the end.
type dec struct {
	b   []byte
	err error
}

func newDec(b []byte) *dec {
	d, _ := newDecV(b, codecVersion)
	return d
}

// newDecV accepts versions 1 to max and returns the one found.
func newDecV(b []byte, max byte) (*dec, byte) {
	d := &dec{b: b}
	if len(b) == 0 {
		d.fail("empty")
		return d, 0
	}
	v := b[0] &^ sealedFlag
	if v < 1 || v > max {
		d.fail(fmt.Sprintf("unknown version %d", b[0]))
		return d, 0
	}
	d.b = b[1:]
	return d, v
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

func (d *dec) t() time.Time { return fromNanos(d.i()) }

// bytes returns the next n bytes.
func (d *dec) bytes(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail("length out of range")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) addr() string {
	switch n := d.u(); {
	case n == 1:
		if b := d.bytes(4); b != nil {
			return netip.AddrFrom4([4]byte(b)).String()
		}
	case n == 3:
		if b := d.bytes(16); b != nil {
			return netip.AddrFrom16([16]byte(b)).String()
		}
	case n%2 == 1:
		d.fail("bad address tag")
	default:
		return string(d.bytes(n / 2))
	}
	return ""
}

func (d *dec) code(known []string) string {
	n := d.u()
	if n%2 == 1 {
		if i := n / 2; i < uint64(len(known)) {
			return known[i]
		}
		d.fail("unknown code")
		return ""
	}
	return string(d.bytes(n / 2))
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
	flagRequireTLS
	flagTLSOptional
	flagMask = flagSMTPUTF8 | flagEightBit | flagDSN | flagRequireTLS | flagTLSOptional
)

func encodeMessage(m *Message) []byte {
	e := newEncV(msgVersion)
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
	if m.RequireTLS {
		f |= flagRequireTLS
	}
	if m.TLSOptional {
		f |= flagTLSOptional
	}
	e.u(f)
	if m.bodySummed {
		e.u(1)
		e.b = binary.BigEndian.AppendUint32(e.b, m.bodySum)
	} else {
		e.u(0)
	}
	e.s(m.Tag)
	e.s(m.MessageID)
	return seal(bMsgs, idKey(m.ID), e.b)
}

// decodeMessage decodes a message record as callers see it (without the
// body's checksum).
func decodeMessage(id ID, b []byte) (Message, error) {
	m, err := decodeMessageRec(id, b)
	m.bodySum, m.bodySummed = 0, false
	return m, err
}

// decodeMessageRec decodes a message record with its body's checksum.
func decodeMessageRec(id ID, b []byte) (Message, error) {
	b, err := unseal(bMsgs, idKey(id), b)
	if err != nil {
		return Message{ID: id}, err
	}
	d, v := newDecV(b, msgVersion)
	m := Message{ID: id, From: d.s(), Arrival: d.t(), Size: d.i(),
		ClientAddr: d.s(), AuthUser: d.s(), Helo: d.s(), RET: d.s(), EnvID: d.s()}
	f := d.u()
	if f&^flagMask != 0 {
		d.fail("unknown flags")
	}
	m.SMTPUTF8, m.EightBit, m.DSN = f&flagSMTPUTF8 != 0, f&flagEightBit != 0, f&flagDSN != 0
	m.RequireTLS, m.TLSOptional = f&flagRequireTLS != 0, f&flagTLSOptional != 0
	if v >= 2 {
		switch d.u() {
		case 0:
		case 1:
			if s := d.bytes(4); s != nil {
				m.bodySum, m.bodySummed = binary.BigEndian.Uint32(s), true
			}
		default:
			d.fail("bad body checksum kind")
		}
	}
	if v >= 3 {
		m.Tag, m.MessageID = d.s(), d.s()
	}
	return m, d.done()
}

// encodeRecipient writes r without Key (it is the bbolt key) and History
// (stored separately so List and Due never decode it). Status and Reason come
// first so cheap scans could stop early.
func encodeRecipient(r *Recipient) []byte {
	e := newEncV(rcptVersion)
	e.b = append(e.b, statusByte(r.Status))
	e.s(r.Reason)
	e.s(r.Addr)
	if domainOf(r.Addr) == r.Domain && strings.Contains(r.Addr, "@") {
		e.u(1) // as in Addr
	} else {
		e.u(2 * uint64(len(r.Domain)))
		e.b = append(e.b, r.Domain...)
	}
	e.s(r.Notify)
	e.s(r.ORCPT)
	e.reply(r.Reply)
	e.i(int64(r.Attempts))
	e.t(r.NextAttempt)
	e.t(r.FirstAttempt)
	e.t(r.LastAttempt)
	e.t(r.FirstGreylisted)
	e.i(int64(r.GreylistTries))
	e.addr(r.SourceIP)
	e.addr(r.MXHost)
	e.addr(r.MXAddr)
	e.i(int64(r.DelayWarnings))
	return seal(bRcpts, rcptKey(r.Key), e.b)
}

// domainOf returns the part of addr after its last '@'.
func domainOf(addr string) string { return addr[strings.LastIndexByte(addr, '@')+1:] }

func decodeRecipient(k Key, b []byte) (Recipient, error) {
	b, err := unseal(bRcpts, rcptKey(k), b)
	if err != nil {
		return Recipient{Key: k}, err
	}
	d, v := newDecV(b, rcptVersion)
	if v == 1 {
		return decodeRecipientV1(k, d)
	}
	r := Recipient{Key: k, Status: d.status(), Reason: d.s(), Addr: d.s()}
	switch n := d.u(); {
	case n == 1 && strings.Contains(r.Addr, "@"):
		r.Domain = domainOf(r.Addr)
	case n%2 == 1:
		d.fail("bad domain")
	default:
		r.Domain = string(d.bytes(n / 2))
	}
	r.Notify, r.ORCPT, r.Reply = d.s(), d.s(), d.reply()
	r.Attempts, r.NextAttempt, r.FirstAttempt, r.LastAttempt = d.int(), d.t(), d.t(), d.t()
	r.FirstGreylisted, r.GreylistTries = d.t(), d.int()
	r.SourceIP, r.MXHost, r.MXAddr, r.DelayWarnings = d.addr(), d.addr(), d.addr(), d.int()
	return r, d.done()
}

func decodeRecipientV1(k Key, d *dec) (Recipient, error) {
	r := Recipient{Key: k, Status: d.status(), Reason: d.s(),
		Addr: d.s(), Domain: d.s(), Notify: d.s(), ORCPT: d.s(), Reply: d.reply(),
		Attempts: d.int(), NextAttempt: d.t(), FirstAttempt: d.t(), LastAttempt: d.t(),
		FirstGreylisted: d.t(), GreylistTries: d.int(),
		SourceIP: d.s(), MXHost: d.s(), MXAddr: d.s(), DelayWarnings: d.int()}
	return r, d.done()
}

// History fields an attempt can share with its reference (see
// encodeHistory), as bits of the mask written before each attempt.
const (
	sameStart = 1 << iota
	sameSourceIP
	sameMXHost
	sameMXAddr
	sameStage
	sameReason
	sameReply
	zeroEnd
	newTLS  // version 3: TLS differs from the reference's (set rarely, so the mask stays one byte)
	maskAll = 1<<iota - 1
)

// outcomes are the usual Attempt.Outcome values, stored as small codes.
var outcomes = []string{outcomeInProgress, outcomeInterrupted, string(Queued), string(Deferred),
	string(Active), string(Held), string(Delivered), string(Relayed), string(Failed)}

// historyRef is what the newest attempt of r's history is stored against:
// the recipient record holds the start, route, reason and reply of its last
// attempt. Only Begin and Apply change these fields, and both rewrite the
// history in the same transaction (putRcpt sees to it).
func historyRef(r *Recipient) Attempt {
	if r == nil {
		return Attempt{}
	}
	return Attempt{Start: r.LastAttempt, SourceIP: r.SourceIP, MXHost: r.MXHost, MXAddr: r.MXAddr,
		Reason: r.Reason, Reply: r.Reply}
}

// encodeHistory writes h newest first, each attempt against a reference:
// the attempt after it, or ref for the newest. A mask says which fields
// equal the reference's and are left out. decodeHistory needs the same ref.
func encodeHistory(k Key, h []Attempt, ref Attempt) []byte {
	e := newEncV(histVersion)
	e.u(uint64(len(h)))
	for i := len(h) - 1; i >= 0; i-- {
		a := &h[i]
		m := sameMask(a, &ref)
		e.u(uint64(m))
		if m&sameStart == 0 {
			e.t(a.Start)
		}
		if m&zeroEnd == 0 {
			e.i(nanos(a.End) - nanos(a.Start)) // wraps and unwraps exactly
		}
		if m&sameSourceIP == 0 {
			e.addr(a.SourceIP)
		}
		if m&sameMXHost == 0 {
			e.addr(a.MXHost)
		}
		if m&sameMXAddr == 0 {
			e.addr(a.MXAddr)
		}
		if m&sameStage == 0 {
			e.s(a.Stage)
		}
		e.code(a.Outcome, outcomes)
		if m&sameReason == 0 {
			e.s(a.Reason)
		}
		if m&sameReply == 0 {
			e.reply(a.Reply)
		}
		if m&newTLS != 0 {
			e.s(a.TLS)
		}
		ref = *a
	}
	return seal(bHist, rcptKey(k), e.b)
}

func sameMask(a, ref *Attempt) int {
	m := 0
	set := func(bit int, same bool) {
		if same {
			m |= bit
		}
	}
	set(sameStart, nanos(a.Start) == nanos(ref.Start))
	set(sameSourceIP, a.SourceIP == ref.SourceIP)
	set(sameMXHost, a.MXHost == ref.MXHost)
	set(sameMXAddr, a.MXAddr == ref.MXAddr)
	set(sameStage, a.Stage == ref.Stage)
	set(sameReason, a.Reason == ref.Reason)
	set(sameReply, a.Reply == ref.Reply)
	set(zeroEnd, a.End.IsZero())
	set(newTLS, a.TLS != ref.TLS)
	return m
}

func decodeHistory(k Key, b []byte, ref Attempt) ([]Attempt, error) {
	b, err := unseal(bHist, rcptKey(k), b)
	if err != nil {
		return nil, err
	}
	d, v := newDecV(b, histVersion)
	if v == 1 {
		return decodeHistoryV1(d)
	}
	n := d.count()
	var h []Attempt
	if n > 0 {
		h = make([]Attempt, n)
	}
	for i := n - 1; i >= 0 && d.err == nil; i-- {
		h[i] = decodeAttempt(d, &ref, v)
		ref = h[i]
	}
	if d.err != nil {
		return nil, d.err
	}
	return h, d.done()
}

func decodeAttempt(d *dec, ref *Attempt, version byte) Attempt {
	m := d.u()
	if m&^maskAll != 0 || (version < 3 && m&newTLS != 0) {
		d.fail("bad history mask")
		return Attempt{}
	}
	var a Attempt
	pick := func(bit uint64, same string, read func() string) string {
		if m&bit != 0 {
			return same
		}
		return read()
	}
	if m&sameStart != 0 {
		a.Start = fromNanos(nanos(ref.Start))
	} else {
		a.Start = d.t()
	}
	if m&zeroEnd == 0 {
		a.End = fromNanos(nanos(a.Start) + d.i())
	}
	a.SourceIP = pick(sameSourceIP, ref.SourceIP, d.addr)
	a.MXHost = pick(sameMXHost, ref.MXHost, d.addr)
	a.MXAddr = pick(sameMXAddr, ref.MXAddr, d.addr)
	a.Stage = pick(sameStage, ref.Stage, d.s)
	a.Outcome = d.code(outcomes)
	a.Reason = pick(sameReason, ref.Reason, d.s)
	if m&sameReply != 0 {
		a.Reply = ref.Reply
	} else {
		a.Reply = d.reply()
	}
	switch {
	case version < 3:
	case m&newTLS == 0:
		a.TLS = ref.TLS
	default:
		a.TLS = d.s()
	}
	return a
}

func decodeHistoryV1(d *dec) ([]Attempt, error) {
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
	// Added later; older records end here and decode with zero values.
	e.i(int64(x.GreylistLow))
	e.i(int64(x.GreylistProbes))
	e.t(x.GreylistProbe)
	e.i(int64(x.PaceInterval))
	e.i(int64(x.PaceBase))
	e.i(int64(x.PaceRefusals))
	e.t(x.GreylistChecked)
	e.i(int64(x.PaceRun))
	e.t(x.PaceRunStart)
	e.s(x.GreyLike)
	e.i(int64(x.GreyLikePassed))
	e.i(int64(x.GreyLikeRefused))
	e.t(x.PaceRefused)
	e.t(x.GreylistLearned)
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
	if len(d.b) > 0 {
		x.GreylistLow, x.GreylistProbes, x.GreylistProbe = time.Duration(d.i()), d.int(), d.t()
		x.PaceInterval, x.PaceBase, x.PaceRefusals = time.Duration(d.i()), time.Duration(d.i()), d.int()
	}
	if len(d.b) > 0 {
		x.GreylistChecked = d.t()
		x.PaceRun, x.PaceRunStart = d.int(), d.t()
	}
	if len(d.b) > 0 {
		x.GreyLike, x.GreyLikePassed, x.GreyLikeRefused = d.s(), d.int(), d.int()
	}
	if len(d.b) > 0 {
		x.PaceRefused = d.t()
	}
	if len(d.b) > 0 {
		x.GreylistLearned = d.t()
	}
	return x, d.done()
}
