package probe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
)

// Knowledge is step 5: what the relay learned about the destination and
// what it holds for it, in the admin API's own views (so its JSON is the
// API's JSON).
type Knowledge struct {
	Destination *admin.Destination `json:"destination"` // nil: nothing learned yet
	Queued      []admin.Row        `json:"queued"`      // live recipients (a sample; see QueuedTotal)
	QueuedTotal int                `json:"queued_total"`
}

// ErrNotRunning says that the relay's admin API did not answer.
var ErrNotRunning = errors.New("relay not running")

// maxQueued is how many recipients per status a probe lists.
const maxQueued = 20

// knowledgeSource is what step 5 reads: *adminclient.Client from outside
// the daemon, *admin.Local inside it. Both give the same views.
type knowledgeSource interface {
	Destination(ctx context.Context, domain string) (*admin.Destination, error)
	List(ctx context.Context, lq admin.ListQuery) (admin.ListResult, error)
}

// AdminKnown returns an Options.Known that asks a running relay through
// its admin API: the queue file is locked by the daemon, so from outside
// this is the only way in. An API that is disabled or does not answer is
// ErrNotRunning.
func AdminKnown(c *adminclient.Client) func(ctx context.Context, domain string) (*Knowledge, error) {
	return func(ctx context.Context, domain string) (*Knowledge, error) {
		k, err := knowledgeFrom(ctx, c, domain)
		var ue *adminclient.UnreachableError
		if errors.As(err, &ue) {
			return nil, fmt.Errorf("%w: %w", ErrNotRunning, err)
		}
		return k, err
	}
}

// QueueKnown returns an Options.Known that reads q directly, for the probe
// that runs inside the daemon (GET /api/probe): the daemon holds the queue
// and has no reason to call its own API over HTTP. now is the clock of the
// views' relative fields (nil: time.Now).
func QueueKnown(q *queue.Queue, now func() time.Time) func(ctx context.Context, domain string) (*Knowledge, error) {
	l := admin.NewLocal(q, "", now) // destinations only: no queue IDs
	return func(ctx context.Context, domain string) (*Knowledge, error) {
		return knowledgeFrom(ctx, l, domain)
	}
}

// knowledgeFrom reads what src knows about domain: the learned
// destination and up to maxQueued recipients of each live status.
func knowledgeFrom(ctx context.Context, src knowledgeSource, domain string) (*Knowledge, error) {
	d, err := src.Destination(ctx, domain)
	if err != nil {
		return nil, err
	}
	k := &Knowledge{Destination: d, Queued: []admin.Row{}}
	// The live states: what is still to be delivered.
	for _, st := range []queue.Status{queue.Deferred, queue.Queued, queue.Active, queue.Held} {
		l, err := src.List(ctx, admin.ListQuery{Domain: domain, Status: st, Limit: maxQueued})
		if err != nil {
			return nil, err
		}
		k.Queued = append(k.Queued, l.Rows...)
		k.QueuedTotal += l.Total
	}
	return k, nil
}

// knowledge fills step 5.
func (p *prober) knowledge(ctx context.Context) {
	if p.opt.Known == nil {
		return
	}
	k, err := p.opt.Known(ctx, p.rep.Domain)
	if err != nil {
		p.rep.KnowledgeError = err.Error()
		return
	}
	p.rep.Knowledge = k
}
