package queue

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// The intake journal.
//
// Why: bbolt has one writer, its commits cannot overlap, and each costs two
// fdatasyncs (the pages, then the meta page). When Enqueue waited for a
// bbolt commit, a session's 250 waited on average one and a half commits,
// which also carried the delivery workers' Begin and Apply writes; on two
// cores that capped intake well below what the CPUs allowed (BENCHMARKS.md).
// Now Enqueue appends the new messages to a journal file next to the
// database and returns after one fdatasync of it. The writer inserts them
// into the database afterwards, in journal order, in its next transaction
// (whatever else that transaction carries), and stores in the same
// transaction the number of the last journal record it holds ("applied").
// A message is durable once its record is synced, in the database once
// applied; a crash in between loses nothing, because Open replays every
// record numbered above applied before anything reads the queue (and
// before the spool sweep, which would remove the files they name).
//
// Records: a header (magic, payload length, sequence number, CRC-32C of a
// per-file random salt, the number and the payload) and the payload (the
// messages with their IDs). Reading stops at the first record that fails,
// or whose number does not follow the previous one: behind the last record
// written lie older records or a torn write, which was never acknowledged
// (its fdatasync did not return). The salt keeps a record-shaped message
// body, left behind an older write position, from ever passing for a
// record.
//
// Space: the file is reused in place. It grows in zero-filled steps up to
// Options.JournalSize, so that the fdatasync of a record only flushes data,
// not the file's size; when the next batch does not fit, the journaler
// waits until the database holds every record in the file and starts
// again at the front. A batch too large for the file, and every Enqueue
// after a journal write failed, go to the database directly, as before
// the journal. The record whose write failed is marked applied without
// its messages (their clients were refused, and it may have reached the
// disk all the same), so that no later Open replays it.
//
// Reads: between its Enqueue and the writer's commit (about one commit) a
// message is durable but not yet in the database. The reads a caller may
// make right after Enqueue (Message, Show, Body, OpenBody, Due, List,
// Stats, Select and the operator actions) first wait for that commit
// (settle; for one message only if its ID may still be on its way, so the
// delivery workers never wait). The scheduler's reads (DueCursor, NextDue)
// do not: the commit that inserts a message wakes it.

// DefaultJournalSize is the size the journal file grows to by default.
const DefaultJournalSize = 32 << 20

const (
	journalFileMagic = "GRJF"     // file header: magic, 8-byte salt, 4 reserved
	journalFileHead  = 16         // records start here
	journalMagic     = 0x47524a31 // "GRJ1", each record
	journalRecHead   = 20         // magic, length, sequence, CRC
	journalStep      = 1 << 20    // the file grows by zero-filled steps of this size
	journalVersion   = 2          // payload layout; 2 adds the REQUIRETLS flags
	minJournalSize   = 64 << 10
)

// castagnoli is the CRC-32C table (read-only after package initialisation).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// jrequest is one Enqueue call waiting for the journaler.
type jrequest struct {
	ms    []NewMessage
	size  int
	reply chan jresult // buffered 1: the journaler never blocks on it
}

type jresult struct {
	ids []ID
	err error
}

// insertBatch is journaled messages on their way into the database. The
// writer keeps it until a commit that inserts it succeeds.
type insertBatch struct {
	seq uint64       // the journal record holding them
	ms  []NewMessage // Body points into the record (the caller's buffer is not ours)
	ids []ID
}

// journal is the file and its write position. After Open only the
// journaler goroutine uses it.
type journal struct {
	f    *os.File
	salt [8]byte
	max  int64  // the size the file may grow to
	off  int64  // where the next record goes
	size int64  // zero-filled length of the file
	seq  uint64 // number of the last record written
	bad  error  // a write or sync failed: the journal is not used any more
}

// openJournal opens or creates the journal file at path. A file shorter
// than its header is an interrupted creation and is started again.
func openJournal(path string, max int64) (*journal, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, err
	}
	j := &journal{f: f, max: max, off: journalFileHead, size: fi.Size()}
	if fi.Size() >= journalFileHead {
		var h [journalFileHead]byte
		if _, err := f.ReadAt(h[:], 0); err != nil {
			f.Close()
			return nil, false, err
		}
		if string(h[:4]) != journalFileMagic {
			f.Close()
			return nil, false, fmt.Errorf("%s: not a greyrelay journal (bad magic)", path)
		}
		copy(j.salt[:], h[4:12])
		return j, false, nil
	}
	if err := j.create(); err != nil {
		f.Close()
		return nil, false, err
	}
	return j, true, nil
}

// create writes a new file header with a fresh salt and syncs it.
func (j *journal) create() error {
	if _, err := rand.Read(j.salt[:]); err != nil {
		return err
	}
	var h [journalFileHead]byte
	copy(h[:], journalFileMagic)
	copy(h[4:], j.salt[:])
	if err := j.f.Truncate(0); err != nil {
		return err
	}
	if _, err := j.f.WriteAt(h[:], 0); err != nil {
		return err
	}
	j.size = journalFileHead
	return j.f.Sync()
}

// scanJournal walks the run of consecutive records from the front of a
// journal file r of size octets and returns the number of the last one (or
// applied). A record numbered up to applied is only stepped over: the
// database holds it, so its payload is neither read nor checked, and a
// restart after a clean stop reads a header per record, not the file. Every
// later record must pass its CRC and is handed to fn. The walk stops at
// the first record that is not whole, not valid, or not numbered one above
// the previous.
func scanJournal(r io.ReaderAt, size int64, salt [8]byte, applied uint64, fn func(seq uint64, payload []byte) error) (uint64, error) {
	var h [journalRecHead]byte
	last := applied
	for off, prev := int64(journalFileHead), uint64(0); off+journalRecHead <= size; {
		if _, err := r.ReadAt(h[:], off); err != nil {
			return last, err
		}
		n := int64(binary.BigEndian.Uint32(h[4:]))
		seq := binary.BigEndian.Uint64(h[8:])
		if binary.BigEndian.Uint32(h[:]) != journalMagic || n > size-off-journalRecHead ||
			(off > journalFileHead && seq != prev+1) {
			break
		}
		if seq > applied {
			payload := make([]byte, n)
			if _, err := r.ReadAt(payload, off+journalRecHead); err != nil {
				return last, err
			}
			if binary.BigEndian.Uint32(h[16:]) != recordCRC(salt, seq, payload) {
				break
			}
			if err := fn(seq, payload); err != nil {
				return last, err
			}
		}
		prev, last = seq, max(last, seq)
		off += journalRecHead + n
	}
	return last, nil
}

func recordCRC(salt [8]byte, seq uint64, payload []byte) uint32 {
	var h [16]byte
	copy(h[:], salt[:])
	binary.BigEndian.PutUint64(h[8:], seq)
	return crc32.Update(crc32.Checksum(h[:], castagnoli), castagnoli, payload)
}

// append writes one record (built by encodeRecord) at the write position
// and syncs it. The caller has made sure it fits below max.
func (j *journal) append(rec []byte) error {
	end := j.off + int64(len(rec))
	if end > j.size {
		if err := j.grow(end); err != nil {
			return &growError{err}
		}
	}
	if _, err := j.f.WriteAt(rec, j.off); err != nil {
		return err
	}
	if err := fdatasync(j.f); err != nil {
		return err
	}
	j.off = end
	return nil
}

// growError is a failure to make the file larger (typically ENOSPC). It
// leaves the file as it was, so the journal stays usable within its size.
type growError struct{ err error }

func (e *growError) Error() string { return "growing the journal: " + e.err.Error() }
func (e *growError) Unwrap() error { return e.err }

// grow zero-fills the file up to the next step at or above end, so that
// the writes that follow overwrite allocated blocks: their fdatasync then
// has no file metadata to flush. The record's own sync makes this durable.
func (j *journal) grow(end int64) error {
	n := min(j.max, (end+journalStep-1)/journalStep*journalStep)
	zeros := make([]byte, 64<<10)
	for off := j.size; off < n; off += int64(len(zeros)) {
		if _, err := j.f.WriteAt(zeros[:min(int64(len(zeros)), n-off)], off); err != nil {
			return err
		}
	}
	j.size = n
	return nil
}

// encodeRecord builds the record numbered seq for ms with their ids, and
// returns the messages as the writer will insert them: bodies point into
// the record, recipients are copied (the caller may reuse its slices once
// Enqueue returns).
func encodeRecord(salt [8]byte, seq uint64, ms []NewMessage, ids []ID) ([]byte, []NewMessage) {
	e := &enc{b: make([]byte, journalRecHead, journalRecHead+64+journalSize(ms))}
	e.b = append(e.b, journalVersion)
	e.u(uint64(len(ms)))
	bodyAt := make([]int, len(ms))
	for i := range ms {
		e.u(uint64(ids[i]))
		bodyAt[i] = encodeNew(e, &ms[i])
	}
	rec := e.b
	payload := rec[journalRecHead:]
	binary.BigEndian.PutUint32(rec, journalMagic)
	binary.BigEndian.PutUint32(rec[4:], uint32(len(payload)))
	binary.BigEndian.PutUint64(rec[8:], seq)
	binary.BigEndian.PutUint32(rec[16:], recordCRC(salt, seq, payload))
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
