package queue

import (
	"encoding/binary"
	"os"
	"strings"
	"time"
)

// The file's layout, for a reader that does not open the queue.
//
// queue/salvage reads a damaged file page by page (queue/boltfile) and
// builds a fresh one; it has to know which bucket holds what, how keys
// are made, and to decode and check the records it finds, so the queue
// exports that here. Everyone else goes through a Queue.

// The top-level buckets of the queue's file (store.go lists their keys).
const (
	BucketMessages   = "msgs"       // MessageKey → message record
	BucketBodies     = "bodies"     // MessageKey → raw body
	BucketRecipients = "rcpts"      // RecipientKey → recipient record
	BucketHistory    = "hist"       // RecipientKey → attempt history
	BucketDue        = "due"        // DueEntry's key → DueEntry's value
	BucketDests      = "dests"      // domain → destination record
	BucketQuarantine = "quarantine" // bucket name → nested bucket of records that did not decode
	BucketSpool      = "spool"      // MessageKey → the body's file name in SpoolDir
	BucketJournal    = "journal"    // the intake journal's state and the file's format
	BucketFinished   = "finished"   // time(8)|MessageKey → a finished message (FinishedID)
	BucketSalvaged   = "salvaged"   // RecipientKey → SalvagedMark
)

// Buckets lists the top-level buckets Open creates, BucketSalvaged and the
// stores' (kv.go) not among them.
func Buckets() []string {
	out := make([]string, len(allBuckets))
	for i, b := range allBuckets {
		out[i] = string(b)
	}
	return out
}

// MessageKey is the key of message id in BucketMessages, BucketBodies and
// BucketSpool.
func MessageKey(id ID) []byte { return idKey(id) }

// RecipientKey is the key of recipient k in BucketRecipients,
// BucketHistory and BucketSalvaged.
func RecipientKey(k Key) []byte { return rcptKey(k) }

// ParseRecipientKey is RecipientKey's inverse; false: b is not one.
func ParseRecipientKey(b []byte) (Key, bool) { return parseRcptKey(b) }

// FinishedID returns the message a key of BucketFinished names; false: k
// has not the length of one.
func FinishedID(k []byte) (ID, bool) {
	if len(k) != 16 {
		return 0, false
	}
	return ID(binary.BigEndian.Uint64(k[8:])), true
}

// Sealed reports whether v is a record sealed with its bucket and key
// (seal.go): decoding it proves where it belongs.
func Sealed(v []byte) bool { return len(v) > sealSize && v[0]&sealedFlag != 0 }

// DecodeMessageRecord decodes message id's record v, with its body's
// checksum (see Message.CheckBody).
func DecodeMessageRecord(id ID, v []byte) (Message, error) { return decodeMessageRec(id, v) }

// BodySummed reports whether m, as DecodeMessageRecord returned it, holds
// its body's checksum (records of older formats do not).
func (m *Message) BodySummed() bool { return m.bodySummed }

// CheckBody verifies body against the checksum m, as DecodeMessageRecord
// returned it, holds; a message without one accepts every body.
func (m *Message) CheckBody(body []byte) error { return checkBody(m, body) }

// DecodeRecipientRecord decodes recipient k's record v.
func DecodeRecipientRecord(k Key, v []byte) (Recipient, error) { return decodeRecipient(k, v) }

// EncodeRecipientRecord is DecodeRecipientRecord's inverse.
func EncodeRecipientRecord(r *Recipient) []byte { return encodeRecipient(r) }

// DecodeHistoryRecord decodes recipient k's history v. Its newest attempt
// is checked against r's record (nil: a history found without it).
func DecodeHistoryRecord(k Key, v []byte, r *Recipient) ([]Attempt, error) {
	return decodeHistory(k, v, historyRef(r))
}

// DecodeDestinationRecord decodes a destination record.
func DecodeDestinationRecord(v []byte) (Destination, error) { return decodeDestination(v) }

// DueEntry returns the entry of BucketDue recipient r must have, or a nil
// key when its status has none.
func DueEntry(r *Recipient) (k, v []byte) {
	if k = expectedDueKey(r); k != nil {
		v = dueValue(r)
	}
	return k, v
}

// SalvagedMark is the value of BucketSalvaged for a recipient recovered at
// t from an older copy of its record (Recipient.Salvaged).
func SalvagedMark(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano()))
}

// SpoolDir is the directory of the spool files of the queue at path.
func SpoolDir(path string) string { return path + ".bodies" }

// IsSpoolName reports whether name, a value of BucketSpool, names a spool
// file.
func IsSpoolName(name []byte) bool {
	return strings.HasPrefix(string(name), bodyFilePrefix)
}

// InUse reports whether a process holds the queue file at path open (a
// running relay): its bbolt lock is taken. Where locks cannot be tested it
// reports false.
func InUse(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	return !lockFree(f), nil
}

// CopyOwner gives the file to the owner and group of the file from, when
// run as root (a queue salvaged by root stays the relay's); failures are
// ignored, as an operator who is the relay's user owns both already.
func CopyOwner(from, to string) { copyOwner(from, to) }
