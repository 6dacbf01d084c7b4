package cluster

import (
	"context"
	"time"

	"github.com/greyrelay/greyrelay/relay/suppress"
)

// Store is where the nodes' shared state lives: Redis in production
// (NewRedis). The Cluster decides what to share and what to do when the
// store fails; a Store only keeps the state and applies each operation
// atomically, with expiries measured on one clock for every node (for
// Redis, the server's), so that the nodes' own clocks may disagree.
//
// Domains come lower-cased. An error means the store did not answer: the
// Cluster then goes on with local knowledge until Ping succeeds again.
// An absent record or entry is no error.
type Store interface {
	// Ping checks that the store answers.
	Ping(ctx context.Context) error

	// Acquire adds member to domain's leases, expiring after ttl, if
	// fewer than limit unexpired leases remain, and reports whether it
	// did.
	Acquire(ctx context.Context, domain, member string, limit int, ttl time.Duration) (bool, error)
	// Renew extends the leases held (domain → member → the limit it was
	// granted under) to ttl from now. A lease the store lacks (granted
	// while it was away, or lost) is added back while its domain's limit
	// allows (added) and refused otherwise (refused), both by domain.
	Renew(ctx context.Context, ttl time.Duration, held map[string]map[string]int) (added, refused map[string][]string, err error)
	// Release removes member from domain's leases and, if it was there,
	// announces domain to every Subscribe.
	Release(ctx context.Context, domain, member string) error
	// Drop removes member from domain's leases without an announcement.
	Drop(ctx context.Context, domain, member string) error
	// Subscribe calls freed with each domain Release announces, until
	// ctx is done.
	Subscribe(ctx context.Context, freed func(domain string))

	// Record returns domain's shared record, nil if there is none.
	Record(ctx context.Context, domain string) ([]byte, error)
	// SetRecord stores domain's shared record for ttl, unless the one
	// stored is later: records are ordered by refused (when a rate-limit
	// reply last slowed the pace), then by updated (when the record last
	// changed). A node publishes after its commit, which may come after
	// another node published what it learned later, and a late older
	// record must not replace it; and a node that learned from
	// acceptances after another node's refusal, before it heard of it,
	// must not undo the refusal's slowdown.
	SetRecord(ctx context.Context, domain string, rec []byte, refused, updated time.Time, ttl time.Duration) error

	// Runs returns every node's run of accepted messages to domain
	// (node → value) that has not expired; SetRun stores this node's for
	// ttl.
	Runs(ctx context.Context, domain string) (map[string][]byte, error)
	SetRun(ctx context.Context, domain, node string, v []byte, ttl time.Duration) error

	// Suspensions returns every suspension the operator made (domain →
	// value); SetSuspension stores one, DeleteSuspension removes it.
	Suspensions(ctx context.Context) (map[string][]byte, error)
	SetSuspension(ctx context.Context, domain string, v []byte) error
	DeleteSuspension(ctx context.Context, domain string) error

	// Pace finds domain's next start, interval after the one reserved
	// before it (or now, if that is later), and returns how long from now
	// that is; it reserves it only if that is at most ahead. interval is
	// the caller's current gap, not the one the start before was reserved
	// with.
	Pace(ctx context.Context, domain string, interval, ahead time.Duration) (time.Duration, error)

	// Heartbeat stores a node's registry entry for ttl and returns the
	// entry it replaced (nil if none).
	Heartbeat(ctx context.Context, name string, entry []byte, ttl time.Duration) ([]byte, error)
	// Unregister removes name's entry if the process instance wrote it.
	Unregister(ctx context.Context, name, instance string) error
	// Nodes returns every unexpired registry entry.
	Nodes(ctx context.Context) ([][]byte, error)

	// SuppressionPut stores v under the suppression list's key (v nil:
	// removes it) and appends the change to the list's log, which keeps
	// about the last suppressionLogLen changes.
	SuppressionPut(ctx context.Context, key string, v []byte) error
	// SuppressionLog returns (a change with Key "" is a marker) the list's epoch (newEpoch, stored, if it
	// has none) and the log's changes from after on, after's own first if
	// the log still holds it, at most limit.
	SuppressionLog(ctx context.Context, newEpoch, after string, limit int) (epoch string, log []suppress.Change, err error)
	// SuppressionSnapshot returns the epoch (as SuppressionLog), the ID
	// of the log's last change (adding a marker to an empty log, so that
	// there is one) and every entry.
	SuppressionSnapshot(ctx context.Context, newEpoch string) (epoch, last string, all map[string][]byte, err error)
	// SuppressionForget removes key if its value is still v, without a
	// change in the log.
	SuppressionForget(ctx context.Context, key string, v []byte) error

	// AddUsage adds add (Unix minute → messages, recipients) to id's
	// user_limits counts, forgets minutes before since, keeps the rest for
	// a day, and returns them.
	AddUsage(ctx context.Context, id string, add map[int64][2]int64, since int64) (map[int64][2]int64, error)

	// Close releases the store's connections.
	Close() error
}
