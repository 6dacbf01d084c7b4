// Package journal is the queue's intake journal: a file of numbered,
// checksummed records, each made durable by one fdatasync, that the queue
// writes before a message is in its database.
//
// Why: bbolt has one writer, its commits cannot overlap, and each costs two
// fdatasyncs (the pages, then the meta page). When Enqueue waited for a
// bbolt commit, a session's 250 waited on average one and a half commits,
// which also carried the delivery workers' Begin and Apply writes; on two
// cores that capped intake well below what the CPUs allowed (BENCHMARKS.md).
// So the queue appends new messages to this journal, next to the database,
// and answers after one fdatasync of it; its writer inserts them into the
// database afterwards and stores there the number of the last record it
// holds (queue/journaler.go). This package knows only the file: what a
// record holds is the queue's business (a payload of bytes here).
//
// Records: a header (magic, payload length, sequence number, CRC-32C of a
// per-file random salt, the number and the payload) and the payload.
// Reading (Scan) stops at the first record that fails, or whose number does
// not follow the previous one: behind the last record written lie older
// records or a torn write, which was never acknowledged (its fdatasync did
// not return). The salt keeps a record-shaped message body, left behind an
// older write position, from ever passing for a record; the queue also
// stores it in its database, so that a journal that is not the database's
// own is never replayed.
//
// Space: the file is reused in place. It grows in zero-filled steps (Step)
// up to the size given to Open, so that the fdatasync of a record only
// flushes data, not the file's size. When the next record does not fit,
// the caller waits until its database holds every record in the file and
// starts again at the front (Rewind). A file that cannot grow (GrowError,
// typically a full disk) is left as it was and stays usable within its
// size.
//
// A File is not safe for concurrent use: after Open, one goroutine (the
// queue's journaler) owns it.
package journal
