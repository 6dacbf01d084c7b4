package queue

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// formatVersion is the queue's on-disk format, stamped in the database
// (bucket journal, key "format") when Open finds it missing or older: 2
// is the record format of 2026-11-30 (smaller recipients and histories), 3
// adds the intake journal next to the file, 4 seals messages, recipients
// and histories with checksums and stores each body's (seal.go; records
// of earlier formats are still read). A database stamped with a
// newer version was written by a newer greyrelay, whose records or journal
// this one might not read: it would quarantine records it cannot decode,
// or leave a journal unreplayed. Open refuses such a file rather than lose
// mail; databases from before the stamp existed are read as they are.
const formatVersion = 4

var keyFormat = []byte("format")

// ErrNewerFormat is returned by Open for a database written by a newer
// greyrelay (see formatVersion).
var ErrNewerFormat = errors.New("queue: written by a newer greyrelay")

func storedFormat(tx *bolt.Tx) uint64 {
	if b := tx.Bucket(bJournal); b != nil {
		if v := b.Get(keyFormat); len(v) == 8 {
			return binary.BigEndian.Uint64(v)
		}
	}
	return 0
}

// checkFormat refuses a database stamped with a newer format, and returns
// the stamp it found. It only reads, so a refused file is left as it was.
func (q *Queue) checkFormat() (uint64, error) {
	var v uint64
	if err := q.view(func(tx *bolt.Tx) error { v = storedFormat(tx); return nil }); err != nil {
		return 0, err
	}
	if v > formatVersion {
		return 0, fmt.Errorf("%w: %s has format %d, this version knows %d", ErrNewerFormat, q.path, v, formatVersion)
	}
	return v, nil
}

// stampFormat records formatVersion over an older stamp (found, as read by
// checkFormat). It runs once the counters are settled (update stores them
// with it).
func (q *Queue) stampFormat(found uint64) error {
	if found == formatVersion {
		return nil
	}
	return q.update(func(w *wtx) error {
		return w.b(bJournal).Put(keyFormat, binary.BigEndian.AppendUint64(nil, formatVersion))
	})
}
