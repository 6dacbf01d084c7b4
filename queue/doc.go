// Package queue is greyrelay's durable store: accepted messages and the
// per-recipient delivery state, in one bbolt database. It knows nothing about
// SMTP, DNS or retry policy. It never sleeps and never reads the clock: every
// time is passed in. It makes no delivery decisions; callers record outcomes.
//
// Data model (mox's, on bbolt; see store.go for the bucket layout):
//
//   - a message record (envelope) and its body, stored once and never
//     rewritten; both are deleted when the last recipient is final;
//   - one record per recipient, carrying its status, counters, last reply
//     and sticky route (source IP, MX) so greylisting sees the same triplet
//     on every retry; the attempt history lives in a side bucket so hot
//     paths never decode it;
//   - a due index keyed by next-attempt time (big-endian Unix nanoseconds |
//     id | recipient), so finding due work is a cursor seek, never a scan;
//   - one record per destination domain (what the caller learned about
//     greylisting, throttling and dead hosts);
//   - a quarantine bucket for records that fail to decode (Postfix's
//     "corrupt" queue): they are moved there, reported through
//     Options.OnQuarantine, and the rest of the queue keeps working.
//
// Lifecycle of a recipient: Queued → (Begin) Active → (Apply) Deferred,
// Delivered, Relayed or Failed; Deferred → Active again when due. The
// attempt is recorded before it is made (Begin, as in mox) and its due entry
// moves to a lease; after a crash, Recover turns every Active recipient back
// into a Deferred one, due at once. That may deliver a message twice; it
// never loses one.
//
// Durability: every write is a bbolt transaction, committed with fsync
// (NoSync is never set) before the method returns. Enqueue, Begin and
// Apply group-commit: concurrent callers share one transaction and one
// fsync; a refused call (ErrState, ErrNotFound) writes nothing. Supported
// filesystems are local ones with working fsync and flock (not NFS/CIFS).
//
// Records are versioned and encoded with a small binary codec (codec.go).
package queue
