package queue

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ID identifies a queued message. IDs come from a bbolt bucket sequence, so
// they increase monotonically and are never reused within one database.
// With Options.Node set, an ID's low NodeBits bits name the node that
// allocated it and the bits above count (id.go), so that nodes sharing
// a cluster never hand out the same ID; IDs of a database written
// without a node (plain counts) stay valid as they are.
type ID uint64

// String returns the ID as 16 lower-case hex digits, the form used in logs,
// Received headers and the admin API.
func (id ID) String() string { return fmt.Sprintf("%016x", uint64(id)) }

// ParseID parses the form produced by ID.String (1 to 16 hex digits).
func ParseID(s string) (ID, error) {
	if s == "" || len(s) > 16 {
		return 0, fmt.Errorf("queue: invalid message id %q", s)
	}
	n, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("queue: invalid message id %q", s)
	}
	return ID(n), nil
}

// Key identifies one recipient of one message: Rcpt is the index of the
// recipient in NewMessage.To.
type Key struct {
	ID   ID
	Rcpt int
}

// String returns "id/n", e.g. "000000000000002a/0".
func (k Key) String() string { return k.ID.String() + "/" + strconv.Itoa(k.Rcpt) }

// Status is the delivery state of one recipient.
type Status string

// Recipient states. Queued, Deferred, Active and Held are live; Delivered,
// Relayed and Failed are final.
const (
	Queued    Status = "queued"    // accepted, not yet attempted
	Deferred  Status = "deferred"  // attempted, will be retried at NextAttempt
	Active    Status = "active"    // an attempt is in progress (see Begin)
	Held      Status = "held"      // held by the operator; never due until released
	Delivered Status = "delivered" // final: accepted by the destination's final MTA
	Relayed   Status = "relayed"   // final: accepted by a host that will relay further
	Failed    Status = "failed"    // final: permanently failed or expired
)

// Final reports whether s is a terminal state: nothing more will be attempted.
func (s Status) Final() bool { return s == Delivered || s == Relayed || s == Failed }

// valid reports whether s is one of the known states.
func (s Status) valid() bool {
	switch s {
	case Queued, Deferred, Active, Held, Delivered, Relayed, Failed:
		return true
	}
	return false
}

// The operator's actions, as Operate names them (classifier.Explain
// explains them). A released recipient's reason is ReasonReleased until
// its next attempt, so that its state explains itself; a held one keeps
// its reason (why it was not delivered: the status Held says the rest),
// and a deleted one is gone.
const (
	ReasonHeld     = "held"
	ReasonReleased = "released"
	ReasonDeleted  = "deleted"
)

// Errors returned by the queue. Inspect them with errors.Is.
var (
	// ErrLocked is returned by Open when another process holds the database
	// file lock for longer than Options.LockTimeout.
	ErrLocked = errors.New("queue is locked by another greyrelay")
	// ErrNotFound is returned when a message or recipient does not exist.
	ErrNotFound = errors.New("queue: not found")
	// ErrClosed is returned by calls made after, or pending during, Close.
	ErrClosed = errors.New("queue: closed")
	// ErrInvalid is returned for arguments the queue refuses to store.
	ErrInvalid = errors.New("queue: invalid argument")
	// ErrState is returned by Begin when a recipient is not in a state that
	// allows the operation (for example already Active, Held or final).
	ErrState = errors.New("queue: recipient not in a state for this operation")
)

// UnsettledError says that a read answered from what the database holds
// while the database could not take every message the intake journal
// acknowledged (its commits fail, as on a full disk): the answer lacks
// Recipients recipients, accepted and safe in the journal, which the
// first commit that succeeds inserts. Err is the commit's failure.
//
// The reads that must see every acknowledged message (List, Walk, Stats,
// Select, Waiting) return it alongside their complete answer from the
// database, instead of failing, so that an operator can still look at the
// queue when the disk is full (as Postfix's mailq can); a caller that does
// not look for it with errors.As fails as before. The reads of one message
// (Message, Show, Body, OpenBody) answer normally when the database holds
// the message, which it holds whole or not at all, and return it instead
// of ErrNotFound when it does not. Writes still fail.
type UnsettledError struct {
	Recipients int
	Err        error
}

func (e *UnsettledError) Error() string {
	return fmt.Sprintf("queue: %d recipients accepted and journaled are not in the database yet (it cannot be written: %v)",
		e.Recipients, e.Err)
}

// Unwrap returns the database's failure.
func (e *UnsettledError) Unwrap() error { return e.Err }

// Options configure Open.
type Options struct {
	// LockTimeout bounds the wait for the file lock. Zero means 2 s; bbolt's
	// own zero would wait forever.
	LockTimeout time.Duration
	// OnQuarantine, if set, is called (outside any transaction, from the
	// goroutine that found it, possibly inside Open) each time a record that
	// cannot be decoded, or cannot be delivered because its message record
	// or body is missing, is moved to the quarantine bucket. It must not call
	// back into the Queue.
	OnQuarantine func(bucket string, key []byte, err error)
	// FullScan makes Open decode every record, quarantine those that do not
	// decode and count them all again, as it does by itself when the
	// stored counters cannot be trusted. A check for an operator who
	// suspects damage; a normal start does not need it.
	FullScan bool
	// JournalSize is the size the intake journal (path + ".journal", see
	// queue/journal) grows to. Zero means DefaultJournalSize; a negative size
	// turns the journal off, so that Enqueue waits for a database commit.
	JournalSize int64
	// CommitDelay, when positive, is how long a busy writer lets its next
	// batch grow before it commits it (group commit, like PostgreSQL's
	// commit_delay or etcd's batch interval): only after a commit that
	// ended with requests already waiting, so an idle queue answers at
	// once. Fewer, larger commits cost less CPU and fewer fdatasyncs per
	// message, and leave the disk to the journal's fdatasync, which every
	// Enqueue waits for. A caller that waits for its commit (Begin, the
	// operator's actions) waits at most 500 µs of it; a wait for journaled
	// messages to be inserted (before the journal starts again at its
	// front) ends it at once. So only work nobody waits for (ApplyAsync,
	// the journal's inserts) gathers for the whole delay.
	CommitDelay time.Duration
	// Reserve, when positive, is the free space (octets) intake leaves
	// on the queue's filesystem for everything else the queue writes:
	// the outcomes of deliveries (each of which frees space), DSNs and the
	// operator's actions. An Enqueue that would leave less, counting the
	// journal's growth, the database's copy of every message not yet
	// inserted and its own, fails with an error matching syscall.ENOSPC
	// (which intake answers 452 4.3.1), before anything is written.
	Reserve int64
	// DiskFree, if set, measures the free space instead of statfs on the
	// queue's directory.
	DiskFree func() (uint64, error)
	// History keeps a record of each finished message (without its body)
	// for Show and List; the zero value keeps none (finished.go).
	History HistoryOptions
	// OnAccept, if set, returns the outbox records (outbox.go) that tell
	// of message id's acceptance. It is called inside the transaction
	// that inserts a message from intake, also when Open replays the
	// journal after a crash, so the records exist iff the message was
	// inserted. head is the start of the body (at most 64 KiB). It must
	// not call back into the Queue.
	OnAccept func(id ID, m *NewMessage, head []byte) []Event
	// OnEvents, if set, is called after each commit that stored outbox
	// records, with their number by sink (from the writer's goroutine:
	// it must not call back into the Queue, only signal).
	OnEvents func(added map[string]int)
	// Node, when not zero, is this node's tag (its low NodeBits bits are
	// used): every new ID carries it in its low bits, so that the IDs of
	// nodes with different tags never collide. Zero hands out plain
	// counts (1, 2, 3...), as queues did before nodes were tagged. The
	// caller picks the tag (relay derives it from the node's name);
	// changing it between runs keeps IDs unique within the database.
	Node uint32
}

// NewRecipient is one envelope recipient of a NewMessage.
type NewRecipient struct {
	Addr, Domain string
	Notify       string // RFC 3461 §4.1 NOTIFY: "", "NEVER" or a comma list of SUCCESS,FAILURE,DELAY
	ORCPT        string // RFC 3461 §4.2 ORCPT, raw "rfc822;a@b"
}

// NewMessage is a message to enqueue.
type NewMessage struct {
	From string // "" is the null sender <>
	To   []NewRecipient
	Body []byte // full message as stored (Received header prepended), CRLF lines
	// File holds the body instead of Body for a large message, written to
	// the spool while it was read (see CreateBody); Enqueue syncs and
	// closes it. At most one of Body and File is set.
	File        *BodyFile
	Arrival     time.Time
	ClientAddr  string
	AuthUser    string
	Helo        string
	RET, EnvID  string // RFC 3461 §4.3, §4.4
	SMTPUTF8    bool
	EightBit    bool
	DSN         bool      // the message is itself a DSN; no DSN is ever made for it
	NextAttempt time.Time // zero means Arrival
	// RequireTLS: MAIL FROM carried REQUIRETLS (RFC 8689 §4.1); the message
	// may only leave over TLS whose server DANE or MTA-STS authenticated.
	RequireTLS bool
	// TLSOptional: the message has "TLS-Required: No" (RFC 8689 §5); DANE
	// and MTA-STS failures do not hold it back.
	TLSOptional bool
	// Tag and MessageID are the message's X-Greyrelay-Tag and Message-ID
	// header fields, the application's own names for it, kept so that
	// List finds the message by them, also after it left the queue.
	Tag, MessageID string
}

// Reply is an SMTP reply as the queue stores it.
type Reply struct {
	Code     int
	Enhanced string
	Text     string
}

// Attempt is one delivery attempt in a recipient's history.
type Attempt struct {
	Start, End                      time.Time
	SourceIP, MXHost, MXAddr, Stage string
	Outcome                         string // "in-progress", "interrupted" or the resulting Status
	Reason                          string
	Reply                           Reply
	// TLS is the TLS policy the attempt was made under ("dane",
	// "mta-sts", ...; empty: the configured delivery.tls).
	TLS string
}

// Recipient is the stored state of one recipient.
type Recipient struct {
	Key                         Key
	Addr, Domain, Notify, ORCPT string
	Status                      Status
	Reason                      string // last outcome, as set by the caller
	Reply                       Reply  // last reply
	Attempts                    int
	NextAttempt                 time.Time // due time; while Active, the lease end
	FirstAttempt, LastAttempt   time.Time
	FirstGreylisted             time.Time
	GreylistTries               int
	SourceIP, MXHost, MXAddr    string    // sticky: where the last attempt went
	DelayWarnings               int       // delay DSNs sent so far
	History                     []Attempt // only filled by Show; first 3 + last 20 attempts
	// Salvaged, filled by Show, is when queue/salvage recovered this recipient
	// from an older copy of its record (its current one was lost): it may
	// already have been delivered, and may be delivered again. Zero
	// otherwise.
	Salvaged time.Time
	// RequireTLS and TLSOptional are the message's (Message), and
	// MessageRead says they are filled: Due and DueCursor read them from
	// the message record their walk checks anyway, so that a scheduler
	// can decide whether the message may ride an open connection without
	// reading it again. Other readers leave them unset.
	RequireTLS, TLSOptional, MessageRead bool
}

// Message is the stored envelope of a message.
type Message struct {
	ID                                     ID
	From                                   string
	Arrival                                time.Time
	Size                                   int64
	ClientAddr, AuthUser, Helo, RET, EnvID string
	SMTPUTF8, EightBit, DSN                bool
	RequireTLS, TLSOptional                bool        // see NewMessage
	Tag, MessageID                         string      // see NewMessage
	Recipients                             []Recipient // filled by Show only
	// Finished is set (by Show and List) for a message that has left the
	// queue: the time of the outcome that finished it. Its body is gone.
	Finished time.Time
	// bodySum is the CRC-32C of the body, checked each time it is read;
	// records written before checksums have none (bodySummed false).
	bodySum    uint32
	bodySummed bool
}

// Start describes an attempt about to be made for one or more recipients.
type Start struct {
	Keys                     []Key
	Time                     time.Time
	SourceIP, MXHost, MXAddr string
	LeaseUntil               time.Time
}

// Result is the outcome of an attempt for one recipient.
type Result struct {
	Key         Key
	Status      Status // Deferred, Delivered, Relayed, Failed or Queued
	Reason      string
	Reply       Reply
	Stage       string
	End         time.Time
	NextAttempt time.Time // for Deferred/Queued; zero means End
	// New values to store; the caller computes them.
	FirstGreylisted time.Time
	GreylistTries   int
	DelayWarnings   int
	// Optional overrides of the sticky route; empty keeps the stored value.
	SourceIP, MXHost, MXAddr string
	// TLS is the TLS policy the attempt was made under; empty: none known.
	TLS string
	// Events are outbox records (outbox.go) stored with this result, and
	// only if it is stored (not for a recipient that is gone or final).
	Events []Event
}

// Update is applied atomically by Apply.
type Update struct {
	Results      []Result
	DSNs         []NewMessage
	Destinations []Destination
	// Starts records attempts begun without Begin, from a Fresh message:
	// each key still Queued or Deferred is begun as Begin would (attempt
	// counted, route and an in-progress history entry stored) in the
	// same transaction as the Results, which then end it. A key in no
	// other state is left alone. Until that commit the recipient stays
	// Queued, so a crash during the attempt makes it due again: the
	// guarantee Begin gives, without a commit before the attempt.
	Starts []Start
}

// Selector picks recipients for operator actions. All selects the whole
// queue and excludes every other field; otherwise at least one of the
// others must be set, and a recipient is selected when it matches every
// one that is (so that a forgotten criterion never widens an action to
// the whole queue).
type Selector struct {
	ID     ID
	Domain string // the canonical domain (relay/address.DomainKey); compared case-insensitively
	All    bool
	// Status, Reason, Sender and ArrivedBefore select as Filter's fields
	// of the same names do.
	Status        Status
	Reason        string
	Sender        string
	ArrivedBefore time.Time
	// Tag selects the messages whose stored X-Greyrelay-Tag is Tag, as
	// Filter.Tag does.
	Tag string
	// DryRun makes an action count what it would change and change
	// nothing: its transaction is rolled back.
	DryRun bool
}

// Filter selects rows for List. Zero fields do not filter.
type Filter struct {
	Status        Status
	Reason        string    // exact match
	Domain        string    // case-insensitive exact match
	Sender        string    // case-insensitive exact match; "<>" selects the null sender
	Tag           string    // exact match of NewMessage.Tag
	EnvID         string    // exact match of the ENVID (RFC 3461 §4.4)
	MessageID     string    // exact match of the Message-ID, angle brackets optional
	ArrivedBefore time.Time // messages that arrived strictly before
	Offset, Limit int       // Limit <= 0: no limit
}

// Row is one recipient with its message envelope (without Recipients).
type Row struct {
	Message   Message
	Recipient Recipient
}

// Stats summarises the queue; see Queue.Stats for how it is kept.
type Stats struct {
	ByStatus   map[Status]int
	ByReason   map[string]int
	Oldest     time.Time
	Messages   int
	Recipients int
}

// Destination is what the relay has learned about one destination domain.
// The queue stores it; the caller computes it.
type Destination struct {
	Domain         string
	Greylists      bool
	GreylistSeen   int
	GreylistPassed int
	// LearnedDelay is the shortest wait after a first greylisting reply
	// known to pass (the upper bound of the delay); GreylistLow the
	// longest known to be refused (its lower bound); GreylistProbes the
	// probes inside that window since it last started again; GreylistProbe
	// when the probe under way is decided; GreylistChecked when the window
	// was last checked below its lower bound (backoff.Window).
	LearnedDelay   time.Duration
	LastGreylisted time.Time
	ThrottleLevel  int
	ThrottledUntil time.Time
	DeadHosts      map[string]time.Time // MX host or address → skip until
	LastReply      Reply
	Updated        time.Time
	GreylistLow    time.Duration
	GreylistProbes int
	GreylistProbe  time.Time
	// PaceInterval, PaceBase and PaceRefusals are the learned sending rate
	// of a throttling destination (backoff.Pace); PaceInterval 0: not paced.
	// PaceRun and PaceRunStart count the messages accepted before it first
	// refused (backoff.Pace.Run).
	PaceInterval time.Duration
	PaceBase     time.Duration
	PaceRefusals int
	// GreylistChecked: see LearnedDelay.
	GreylistChecked time.Time
	PaceRun         int
	PaceRunStart    time.Time
	// GreyLike is a temporary reply without a greylisting text that this
	// MX host sent and that behaved like greylisting: GreyLikePassed
	// recipients deferred by it passed at their first retry to the same
	// address from the same source, GreyLikeRefused were refused again
	// (delivery's host.go decides from these).
	GreyLike        string
	GreyLikePassed  int
	GreyLikeRefused int
	// PaceRefused is when a rate-limit reply last slowed the pace. Nodes
	// sharing a destination order what they know of its pace by it first
	// and by Updated second: an acceptance learned later, by a node that
	// had not yet heard of another node's refusal, must not undo the
	// slowdown.
	PaceRefused time.Time
	// GreylistLearned is when the greylisting window (GreylistLow,
	// LearnedDelay) last changed: nodes sharing a destination take the
	// window learned last, not the one in the record written last, which
	// may come from a node that had not read it yet.
	GreylistLearned time.Time
}
