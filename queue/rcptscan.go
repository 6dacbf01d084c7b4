package queue

import (
	"bytes"
	"iter"

	bolt "go.etcd.io/bbolt"
)

// rcptRecord is one record of the recipient bucket as a scan meets it. k and
// v belong to the transaction: clone them to keep them past it.
type rcptRecord struct {
	k, v []byte
	key  Key
}

// decode decodes the recipient; an undecodable record is a corrupt-record
// problem.
func (rec rcptRecord) decode() (Recipient, *problem) {
	r, err := decodeRecipient(rec.key, rec.v)
	if err != nil {
		return Recipient{}, &problem{corruptRecord, bRcpts, bytes.Clone(rec.k), err}
	}
	return r, nil
}

// rcptRecords is the one scan of the recipient bucket: it yields, in key
// order, the records whose key starts with prefix (nil: all of them). A
// record whose key is not a well-formed recipient key is never yielded: it
// is added to ps as corrupt, so that the caller's fixup quarantines it.
// Decoding is left to the caller (rcptRecord.decode), which may skip it.
func rcptRecords(tx *bolt.Tx, prefix []byte, ps *[]problem) iter.Seq[rcptRecord] {
	return func(yield func(rcptRecord) bool) {
		c := tx.Bucket(bRcpts).Cursor()
		k, v := c.First()
		if prefix != nil {
			k, v = c.Seek(prefix)
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			key, ok := parseRcptKey(k)
			if !ok {
				*ps = append(*ps, problem{corruptRecord, bRcpts, bytes.Clone(k), errMissing("valid key")})
				continue
			}
			if !yield(rcptRecord{k, v, key}) {
				return
			}
		}
	}
}
