// Package queue is greyrelay's durable store: accepted messages and the
// per-recipient delivery state, in one bbolt database. It knows nothing about
// SMTP, DNS or retry policy. It never reads the clock: every time is passed
// in. The one wait it makes (a busy writer's commit delay, for larger group
// commits) is a timer, which tests drive with testing/synctest. It makes no
// delivery decisions; callers record outcomes.
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
//     Options.OnQuarantine, and the rest of the queue keeps working;
//   - the Stats counters, stored with the records they count (counters.go);
//   - when Options.History asks, a compact record of each finished message
//     (envelope, recipients, attempts; no body), written by the commit that
//     retires it and pruned by age and number (finished.go).
//   - an outbox of opaque records per sink (the relay's delivery events),
//     each written by the transaction that stores the change it reports,
//     including the insert of a message replayed from the journal, and
//     removed by its reader once passed on (outbox.go).
//
// Open reads only the stored counters, not the records: a start costs the
// same at 1,000,000 recipients as at 10, and it does not pull the whole file
// into memory (bbolt maps the file; every page read stays resident). The
// counters cannot drift from the records, because every write transaction
// stores its own change to them and bbolt commits a transaction whole or
// not at all; a file written by anything else is detected (counters.go) and
// counted again. Open does not decode every record to find damage on
// every start. That is safe because every read path checks what
// it reads and repairs it in a write transaction of its own: a recipient,
// message, history or destination record that does not decode is
// quarantined when it is first read (Due, Begin, Apply, List, Show, Select,
// the operator actions, Destination); so is a message whose body is missing
// (Body) and a recipient whose message is gone (Due, List); a due entry
// that does not match its recipient is dropped or rewritten when the
// scheduler reaches it. Damage that nothing reads harms nothing meanwhile.
// Removing a record whose counts are unknown (it no longer decodes) makes
// that transaction count all records again, so Stats stays exact.
// Options.FullScan, and any start whose counters cannot be trusted, does
// a full scan: decode everything, quarantine, count.
//
// Lifecycle of a recipient: Queued → (Begin) Active → (Apply) Deferred,
// Delivered, Relayed or Failed; Deferred → Active again when due. The
// attempt is recorded before it is made (Begin, as in mox) and its due entry
// moves to a lease; after a crash, Recover turns every Active recipient back
// into a Deferred one, due at once. That may deliver a message twice; it
// never loses one. A message just journaled may instead be attempted from
// the journal's copy (Fresh, fresh.go) and its start stored with the
// outcome (Update.Starts): Queued → Deferred or final in one commit, and
// still Queued, hence due, after a crash in between. When that commit is
// also the one that inserts the message and the outcome finishes it, the
// message's records are never written, only what their deletion leaves
// (finish.go).
//
// Durability: Enqueue returns once its messages are in the intake journal
// (queue/journal, journaler.go: one fdatasync shared by concurrent
// callers); the writer then inserts them into the database, and Open
// replays what a crash left in the journal only. Every other write is a bbolt transaction, committed
// with fsync (NoSync is never set) before the method returns. Begin and
// Apply group-commit: concurrent callers share one transaction and one
// fsync; a refused call (ErrState, ErrNotFound) writes nothing. ApplyAsync
// hands an Apply to the same writer without waiting; its commit comes
// before that of any later call. bbolt's freelist is written only by
// Close (NoFreelistSync; see Open for why); after a crash, Open rebuilds
// it by walking the pages. Supported filesystems are local ones with
// working fsync and flock (not NFS/CIFS).
//
// A full disk stops intake, never the rest: Options.Reserve is kept
// free by the journaler, which refuses a batch that would use it
// (reserve.go), and a journaled message the database cannot take waits
// without failing the commits of others (journaler.go, commit).
//
// Bodies of SpoolThreshold octets or more are files in a spool directory
// next to the database (path + ".bodies"), written by the caller while the
// message is read, synced with their directory before the commit that
// names them, and mapped while they are read back (spool.go explains why
// and in which order).
//
// Records are versioned and encoded with a small binary codec (codec.go).
// Those that carry mail (messages, recipients, histories) are sealed with
// a CRC-32C, and every body's CRC-32C is kept in its message record and
// checked whenever the body is read (seal.go): bbolt does not check its
// data pages, and an altered body must never be sent.
//
// A damaged file is a fact the queue reports, not a crash: every way into
// bbolt runs under a guard that turns its panics and memory faults into a
// *DamagedError, after which every call fails with it (guard.go); a file
// left by an unclean stop is walked by our own bounds-checked reader
// (queue/boltfile) before bbolt walks it; and queue/salvage copies what
// can still be read into a fresh file, through the file layout the queue
// exports for it (layout.go). The queue imports neither salvage nor
// anything above it.
//
// Other packages keep what they learned in the queue's file through
// stores (kv.go): named buckets of opaque values, so the queue does not
// know what an MTA-STS policy or a TLS report is.
package queue
