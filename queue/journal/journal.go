package journal

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// DefaultSize is the size the journal file grows to by default.
const DefaultSize = 32 << 20

// MinSize is the smallest size a journal may be given.
const MinSize = 64 << 10

// RecordHead is the length of a record's header, which Seal fills in:
// magic, payload length, sequence number and CRC.
const RecordHead = 20

// Step is how much the file grows at a time (zero-filled).
const Step = 1 << 20

const (
	fileMagic = "GRJF"     // file header: magic, 8-byte salt, 4 reserved
	fileHead  = 16         // records start here
	recMagic  = 0x47524a31 // "GRJ1", each record
)

// castagnoli is the CRC-32C table (read-only after package initialisation).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// File is the journal file and its write position.
type File struct {
	f    *os.File
	salt [8]byte
	max  int64 // the size the file may grow to
	off  int64 // where the next record goes
	size int64 // zero-filled length of the file
}

// Open opens or creates the journal file at path, which may grow to max
// octets, with the write position at the front; created says whether the
// file is new (with a new salt). A file shorter than its header is an
// interrupted creation and is started again.
func Open(path string, max int64) (j *File, created bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, err
	}
	j = &File{f: f, max: max, off: fileHead, size: fi.Size()}
	if fi.Size() >= fileHead {
		var h [fileHead]byte
		if _, err := f.ReadAt(h[:], 0); err != nil {
			f.Close()
			return nil, false, err
		}
		if string(h[:4]) != fileMagic {
			f.Close()
			return nil, false, fmt.Errorf("%s: not a greyrelay journal (bad magic)", path)
		}
		copy(j.salt[:], h[4:12])
		return j, false, nil
	}
	if err := j.Reset(); err != nil {
		f.Close()
		return nil, false, err
	}
	return j, true, nil
}

// Reset empties the file: a new file header with a fresh salt, synced.
func (j *File) Reset() error {
	if _, err := rand.Read(j.salt[:]); err != nil {
		return err
	}
	var h [fileHead]byte
	copy(h[:], fileMagic)
	copy(h[4:], j.salt[:])
	if err := j.f.Truncate(0); err != nil {
		return err
	}
	if _, err := j.f.WriteAt(h[:], 0); err != nil {
		return err
	}
	j.size = fileHead
	return j.f.Sync()
}

// Salt is the file's salt, which every record's CRC covers.
func (j *File) Salt() [8]byte { return j.salt }

// Name is the file's path.
func (j *File) Name() string { return j.f.Name() }

// Close closes the file; every later write fails.
func (j *File) Close() error { return j.f.Close() }

// Size is the file's zero-filled length.
func (j *File) Size() int64 { return j.size }

// Offset is where the next record goes.
func (j *File) Offset() int64 { return j.off }

// AtFront reports whether the next record goes at the front of the file.
func (j *File) AtFront() bool { return j.off == fileHead }

// Rewind moves the write position to the front of the file. The caller
// must no longer need any record in it.
func (j *File) Rewind() { j.off = fileHead }

// Fits reports whether a record of n octets fits at the write position.
func (j *File) Fits(n int) bool { return j.off+int64(n) <= j.max }

// FitsAtFront reports whether a record of n octets fits in the file as
// it is now, without growing it.
func (j *File) FitsAtFront(n int) bool { return int64(n) <= j.size-fileHead }

// TooLarge reports whether a record of n octets is too large for the
// journal: more than half of its room, so that it never fills the file
// alone.
func (j *File) TooLarge(n int) bool { return int64(n) > (j.max-fileHead)/2 }

// Max is the size the file may grow to.
func (j *File) Max() int64 { return j.max }

// Scan is ScanImage on the file as it is now.
func (j *File) Scan(applied uint64, fn func(seq uint64, payload []byte) error) (uint64, error) {
	return ScanImage(j.f, j.size, j.salt, applied, fn)
}

// ScanImage walks the run of consecutive records from the front of a
// journal file r of size octets and returns the number of the last one (or
// applied). A record numbered up to applied is only stepped over: the
// caller's database holds it, so its payload is neither read nor checked,
// and a restart after a clean stop reads a header per record, not the
// file. Every later record must pass its CRC and is handed to fn. The walk
// stops at the first record that is not whole, not valid, or not numbered
// one above the previous.
func ScanImage(r io.ReaderAt, size int64, salt [8]byte, applied uint64, fn func(seq uint64, payload []byte) error) (uint64, error) {
	var h [RecordHead]byte
	last := applied
	for off, prev := int64(fileHead), uint64(0); off+RecordHead <= size; {
		if _, err := r.ReadAt(h[:], off); err != nil {
			return last, err
		}
		n := int64(binary.BigEndian.Uint32(h[4:]))
		seq := binary.BigEndian.Uint64(h[8:])
		if binary.BigEndian.Uint32(h[:]) != recMagic || n > size-off-RecordHead ||
			(off > fileHead && seq != prev+1) {
			break
		}
		if seq > applied {
			// An empty payload is not read: a reader may answer io.EOF to
			// a read of nothing at the end of the image.
			payload := make([]byte, n)
			if _, err := r.ReadAt(payload, off+RecordHead); n > 0 && err != nil {
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
		off += RecordHead + n
	}
	return last, nil
}

func recordCRC(salt [8]byte, seq uint64, payload []byte) uint32 {
	var h [16]byte
	copy(h[:], salt[:])
	binary.BigEndian.PutUint64(h[8:], seq)
	return crc32.Update(crc32.Checksum(h[:], castagnoli), castagnoli, payload)
}

// Seal makes rec, whose payload follows RecordHead octets the caller left
// for the header, the record numbered seq of the file with that salt. The
// caller builds the payload in place, so a payload (a message body) can
// be referred to inside the record without a copy.
func Seal(rec []byte, salt [8]byte, seq uint64) {
	payload := rec[RecordHead:]
	binary.BigEndian.PutUint32(rec, recMagic)
	binary.BigEndian.PutUint32(rec[4:], uint32(len(payload)))
	binary.BigEndian.PutUint64(rec[8:], seq)
	binary.BigEndian.PutUint32(rec[16:], recordCRC(salt, seq, payload))
}

// Append writes one record (built by Seal) at the write position and
// syncs it. The caller has made sure it fits (Fits).
func (j *File) Append(rec []byte) error {
	end := j.off + int64(len(rec))
	if end > j.size {
		if err := j.grow(end); err != nil {
			return &GrowError{err}
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

// GrowError is a failure to make the file larger (typically ENOSPC). It
// leaves the file as it was, so the journal stays usable within its size.
type GrowError struct{ Err error }

// Error says what failed.
func (e *GrowError) Error() string { return "growing the journal: " + e.Err.Error() }

// Unwrap returns the file system's error.
func (e *GrowError) Unwrap() error { return e.Err }

// grow zero-fills the file up to the next step at or above end, so that
// the writes that follow overwrite allocated blocks: their fdatasync then
// has no file metadata to flush. The record's own sync makes this durable.
func (j *File) grow(end int64) error {
	n := min(j.max, (end+Step-1)/Step*Step)
	zeros := make([]byte, 64<<10)
	for off := j.size; off < n; off += int64(len(zeros)) {
		if _, err := j.f.WriteAt(zeros[:min(int64(len(zeros)), n-off)], off); err != nil {
			return err
		}
	}
	j.size = n
	return nil
}
