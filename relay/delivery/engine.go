// Package delivery is greyrelay's delivery engine: it takes due recipients
// from the queue, groups them into SMTP transactions, sends them from the
// pinned source address and records every outcome.
//
// Design notes:
//
//   - One scheduler loop (Run) owns the decisions about what starts when,
//     and the state they are made from (loop.go): the destinations, their
//     jobs and idle connections, what was learned about them and about
//     their MX hosts (greylisting windows, paces, dead hosts), the claimed
//     recipients, the cluster slots asked for, the suspensions. Only its
//     goroutine touches them, so no lock guards them: workers ask it for
//     their next job, a paced start or the settling of their outcomes
//     and wait for the answer, workers and the recorder leave it notes
//     without waiting, and the operator's changes run on it. What may
//     wait on the network or a disk (the shared store's views, the
//     suppression list) is done by the worker, which hands the loop what
//     it read. Besides the queue's own transactions, the only locks left
//     guard the two inboxes (the loop's notes, the recorder's outcomes)
//     for an append or a swap, and let those who come after the loop
//     take turns (inLoop). It sleeps on a single timer set to the
//     queue's earliest due time and wakes on queue.Wake (every enqueue
//     and deferral), on Kick (operator retry) and when a worker ends. It
//     never polls and starts no goroutine per message (the chasquid
//     anti-pattern): idle with nothing due is one pending timer.
//   - A worker is one outbound connection: one goroutine that serves the
//     jobs of one destination domain in turn, reusing the connection for up
//     to delivery.max_messages_per_connection transactions (RSET only after
//     one that did not complete, RFC 5321 §4.1.1.4; smtpclient pipelines
//     each envelope when the peer offers PIPELINING). With no job left it
//     keeps the connection open for delivery.connection_cache_time, and
//     the loop hands it the destination's next job directly (preferring
//     one the connection may carry), so a message arriving meanwhile
//     neither waits for a dial nor for a scan.
//     A connection remembers the TLS policy it was opened under (the
//     destination's rule for that host, the mode, whether STARTTLS and
//     its verification held), and a later message rides it only when that
//     gives it everything its own policy demands (session.rides): a
//     connection opened in plaintext for a "TLS-Required: No" message never
//     carries one held to MTA-STS, DANE or REQUIRETLS. Each attempt records
//     the rule that applied to its own message.
//     delivery.max_connections caps workers in all and
//     delivery.max_per_destination caps them per domain (1 while the domain
//     throttles us), and domains get workers round-robin, so a slow or dead
//     domain cannot starve healthy ones.
//   - A job is one transaction: all due recipients of one message at one
//     domain (at most delivery.max_recipients_per_transaction), so a message
//     is sent once per domain (RFC 5321 §4.5.4: "only one copy of the
//     message SHOULD be transmitted") and domains are never mixed.
//   - The attempt is recorded before it is made (queue.Begin, as in mox),
//     with the source address, MX host and address and a lease covering
//     every timeout the attempt may spend. After a crash, queue.Recover makes
//     it due again: a possible duplicate, never a loss. A message fresh
//     from the intake journal is the exception (fresh.go): it is sent from
//     the journal's copy at once, and its start is stored with its outcome;
//     its recipients stay Queued until then, so a crash makes them due
//     again just the same.
//   - Every outcome goes through the classifier (what happened) and the
//     backoff policy (when to try again), and is stored with its DSN and what
//     was learned about the destination in one transaction, by one route
//     (record.go): the loop settles the worker's outcomes (settle: it
//     learns from them, logs them and hands the update to the queue's
//     writer, queue.ApplyAsync, which commits in the order handed), and
//     the worker starts its next attempt without waiting for the commit;
//     one recorder goroutine collects the commits in the same order. A fresh attempt's outcome takes the same
//     route, its start in the same update. An outcome the queue cannot
//     store (a full disk) is held in memory and stored again by the
//     recorder on a timer, outside any lock, until the queue takes it
//     (held.go): its recipients are Active meanwhile, and would otherwise
//     stay so until the next start. Run returns once every worker has
//     ended and every outcome's commit is decided. What ends a wait
//     without an attempt is an outcome too, of its own kind (outcome.go):
//     an expiry, a postponement, the operator's bounce, hold, release and
//     delete, each decided by settleOne, given its DSNs and events by
//     conclude and logged and counted by report; an operator's hold,
//     release or delete is stored in the queue's own transaction for the
//     action (queue.Operate, operator.go).
//   - Greylisting is a property of a (source IP, sender, recipient) triplet
//     at one MX, so a recipient in the middle of a greylisting episode goes
//     back to the MX address that greylisted it, from the same source
//     address, unless that host is down. Greylisting never slows the whole
//     destination; rate limiting does (backoff.Throttle).
//
// Nothing here reads the clock or randomness directly: Options.Now and
// Options.Rand are injected.
package delivery

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/dsn"
	"github.com/greyrelay/greyrelay/relay/events"
	"github.com/greyrelay/greyrelay/relay/metrics"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

// Options are the engine's dependencies. Config, Queue, Classifier, Router,
// Dialer4, Logger, Metrics, Now and Rand are required.
type Options struct {
	Config     *config.Config
	Queue      *queue.Queue
	Classifier *classifier.Classifier
	Router     *mx.Router
	// Dialer4 and Dialer6 dial from the pinned source addresses
	// (net.Dialer{LocalAddr: ...}). A nil Dialer6 means no IPv6 egress:
	// IPv6 MX addresses are skipped, never dialed from another address.
	Dialer4, Dialer6 smtpclient.Dialer
	TLSConfig        *tls.Config // base TLS settings (roots); ServerName is set per host
	// TLSPolicy, if set, applies DANE and MTA-STS to MX delivery.
	TLSPolicy TLSPolicy
	// TLSReport, if set, counts each TLS session under a policy for the
	// TLS reports of RFC 8460 (relay/tlsrpt).
	TLSReport *tlsrpt.Aggregator
	Logger    *zap.Logger
	Metrics   *metrics.Metrics
	Now       func() time.Time
	Rand      func() float64 // uniform in [0,1), for backoff jitter
	// Events, if set, makes the application events each stored outcome
	// carries into the queue (relay/events), and strips the tag header
	// from what is sent.
	Events *events.Events
	// Shared is what other nodes know and the cluster-wide connection
	// limits (shared.go); nil for a node on its own.
	Shared Shared
	// Suppress, if set, is told of every recipient that failed
	// permanently for a reason about the address (an unknown user or a
	// disabled mailbox, answered with a 5xx reply; not a policy or content
	// refusal, nor an expiry), and reports whether it suppressed it
	// (relay/suppress).
	Suppress func(from, rcpt, reason, reply string, at time.Time) bool
	// Suppressed, if set, says whether mail from sender to rcpt is on
	// the suppression list, since when, why and for which reply; such
	// recipients fail at once, without an attempt (suppressed.go). Set
	// for suppression.action "bounce", where intake accepts them.
	Suppressed func(sender, rcpt string) (since time.Time, reason, reply string, ok bool)
	// Suspensions shares the operator's suspensions with the other nodes
	// (suspend.go); nil for a node on its own.
	Suspensions SuspensionStore
	// Node names this node in the suspensions it makes ("" on its own).
	Node string
}

// Engine delivers queued mail. Create it with New, then call Run once.
type Engine struct {
	pause  storagePause // after a failed Begin (a full disk): storagepause.go; the loop's
	opt    Options
	cfg    *config.Config
	q      *queue.Queue
	policy backoff.Policy
	limit  *dsn.Limiter
	log    *zap.Logger
	m      *metrics.Metrics
	kick   chan struct{}

	// The loop's own (loop.go): read and written by Run's goroutine
	// only, reached from other goroutines through notes, asks and ops
	// (inLoop, call). No lock guards them.
	dests   map[string]*dest
	order   []string // round-robin order of domains for fair worker starts
	next    int      // where the next round-robin pass starts in order
	workers int      // open connections (running workers) in all
	waiting bool     // some domain has jobs but no worker because of the global cap
	// rescan asks the next scan to start from the first key, rewind (if
	// not zero) to start no later than that due time; lastFull is when the
	// last full scan started (see the scheduler limits).
	rescan   bool
	rewind   time.Time
	lastFull time.Time
	claimed  map[queue.Key]bool // the recipients held in jobs
	cur      *queue.DueCursor   // the scan's position
	rewake   bool               // a note asked the loop to schedule again
	// susp holds the operator's suspensions by canonical domain
	// (suspend.go); suspShared names those the shared store holds as far
	// as this node knows.
	susp       map[string]queue.Suspension
	suspShared map[string]bool
	fresh      <-chan queue.Fresh // the queue's fresh messages (fresh.go)
	// scanned is what queue.Visible said when the last scan ended: a
	// fresh offer at or below it may have been found by that scan
	// (fresh.go).
	scanned uint64
	freed   <-chan string // domains whose cluster-wide slot was released (shared.go); nil without Shared

	notes mailbox       // what workers and the recorder tell the loop
	ops   chan op       // the operator's changes the loop runs (inLoop)
	asks  chan ask      // workers' questions for their next job (askLoop)
	ended chan struct{} // closed when the loop takes no more ops or asks
	// afterLoop makes the operator's changes take turns once the loop
	// has ended (inLoop); it guards nothing while the loop runs.
	afterLoop sync.Mutex

	// hosts is what was learned per MX address (host.go); the loop's
	// too, as the workers of every domain behind one MX learn about it
	// through the loop.
	hosts map[string]*host
	// hostsSwept is when evictHosts last walked hosts.
	hostsSwept time.Time

	out *recorder // collects the commits of outcomes (record.go)
}

// New checks opt and returns an engine.
func New(opt Options) (*Engine, error) {
	if opt.Config == nil || opt.Queue == nil || opt.Classifier == nil || opt.Router == nil ||
		opt.Dialer4 == nil || opt.Logger == nil || opt.Metrics == nil || opt.Now == nil || opt.Rand == nil {
		return nil, errors.New("delivery: Config, Queue, Classifier, Router, Dialer4, Logger, Metrics, Now and Rand are required")
	}
	policy := opt.Config.Retry.Policy()
	if err := policy.Validate(); err != nil {
		return nil, fmt.Errorf("delivery: %w", err)
	}
	d := opt.Config.Delivery
	if d.MaxConnections <= 0 || d.MaxPerDestination <= 0 || d.MaxMessagesPerConnection <= 0 || d.MaxRecipientsPerTransaction <= 0 {
		return nil, errors.New("delivery: delivery.max_* limits must be positive")
	}
	if opt.Config.Hostname == "" {
		return nil, errors.New("delivery: hostname is empty")
	}
	var freed <-chan string
	if opt.Shared != nil {
		freed = opt.Shared.Freed()
	}
	return &Engine{
		notes:      mailbox{wake: make(chan struct{}, 1)},
		ops:        make(chan op),
		asks:       make(chan ask),
		ended:      make(chan struct{}),
		freed:      freed,
		opt:        opt,
		cfg:        opt.Config,
		q:          opt.Queue,
		policy:     policy,
		limit:      dsn.NewLimiter(opt.Config.DSN.MaxPerSenderPerHour),
		log:        opt.Logger,
		m:          opt.Metrics,
		kick:       make(chan struct{}, 1),
		dests:      map[string]*dest{},
		claimed:    map[queue.Key]bool{},
		susp:       map[string]queue.Suspension{},
		suspShared: map[string]bool{},
		hosts:      map[string]*host{},
		fresh:      opt.Queue.Fresh(),
		out: newRecorder(func(u queue.Update) error {
			_, err := opt.Queue.Apply(u)
			return err
		}),
	}, nil
}

// Kick wakes the scheduler loop, e.g. after an operator's "retry now". It
// never blocks; kicks coalesce.
func (e *Engine) Kick() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

func (e *Engine) now() time.Time { return e.opt.Now() }
