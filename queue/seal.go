package queue

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// castagnoli is the CRC-32C table (read-only after package initialisation).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksums on what carries mail.
//
// bbolt checks its meta pages, not its data pages: a flipped bit in a
// record or a body is read back as it is. So every message, recipient and
// history record is sealed: the high bit of its version byte is set and a
// CRC-32C (Castagnoli, as iSCSI and ext4 use) of the bucket name, the key
// and the record follows it. Bucket and key are in the sum so that a
// record that lands under another key (a damaged page, a salvage that
// guessed wrong) does not pass. A body's CRC-32C is stored in its
// message record and checked each time the body is read, from the
// database or from its spool file: a spooled body's is computed as it is
// written (BodyFile.Write) and carried through the intake journal; one
// kept in the database gets its own when it is inserted, from the journal
// record (whose own CRC covered it meanwhile) or the caller's buffer. A record that
// fails its check is quarantined like one that does not decode, with the
// whole message when it is the envelope or the body: an altered body is
// never handed out for delivery.
//
// Records written before checksums (an unset high bit) are read as they
// are; format.go's stamp tells an older greyrelay not to open the file.

const (
	sealedFlag = 0x80
	sealSize   = 4
)

// errChecksum is a record or body whose checksum does not match.
var errChecksum = fmt.Errorf("%w: checksum mismatch", errCorrupt)

func sealSum(bucket, key, rec []byte) uint32 {
	s := crc32.Checksum(bucket, castagnoli)
	s = crc32.Update(s, castagnoli, []byte{0})
	s = crc32.Update(s, castagnoli, key)
	return crc32.Update(s, castagnoli, rec)
}

// seal marks rec (a version byte and its fields) as sealed and appends
// its checksum.
func seal(bucket, key, rec []byte) []byte {
	rec[0] |= sealedFlag
	return binary.BigEndian.AppendUint32(rec, sealSum(bucket, key, rec))
}

// unseal checks a sealed record's checksum and returns it without the
// checksum; an unsealed (older) record is returned as it is.
func unseal(bucket, key, rec []byte) ([]byte, error) {
	if len(rec) == 0 || rec[0]&sealedFlag == 0 {
		return rec, nil
	}
	n := len(rec) - sealSize
	if n < 1 || binary.BigEndian.Uint32(rec[n:]) != sealSum(bucket, key, rec[:n]) {
		return nil, errChecksum
	}
	return rec[:n], nil
}

// bodySum is the checksum stored for a body.
func bodySum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// checkBody verifies body against its message record m.
func checkBody(m *Message, body []byte) error {
	if !m.bodySummed || bodySum(body) == m.bodySum {
		return nil
	}
	return fmt.Errorf("%w: body of %s", errChecksum, m.ID)
}
