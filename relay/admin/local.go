package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// Local answers the read requests of adminclient.Client straight from a
// queue, with the same views. Code inside the daemon, which holds the
// queue file's lock, uses it where a CLI uses the client (the status
// page's probe has no reason to call its own API over HTTP). The API's
// handlers are built on it too, so that an answer over HTTP and an answer
// in process cannot drift apart.
//
// The queue answers synchronously, so the contexts are not consulted.
type Local struct {
	q   *queue.Queue
	now func() time.Time
	// node names this node in every row and message (Row.Node): queue
	// IDs are unique across a cluster's nodes, and the name says where
	// one lives without decoding its tag.
	node string
}

// NewLocal returns a Local over q, the queue of the node named node
// (config.Config.NodeName; "" names none); now is the clock of relative
// fields (nil: time.Now).
func NewLocal(q *queue.Queue, node string, now func() time.Time) *Local {
	if now == nil {
		now = time.Now
	}
	return &Local{q: q, now: now, node: node}
}

// List returns one page of recipients, as GET /api/queue does. The query
// is validated by the API's own parser, so that a query the API refuses
// is refused here too.
func (l *Local) List(_ context.Context, lq ListQuery) (ListResult, error) {
	now := l.now()
	f, err := parseFilter(lq.Values(), now)
	if err != nil {
		return ListResult{}, err
	}
	return l.list(f, now)
}

func (l *Local) list(f queue.Filter, now time.Time) (ListResult, error) {
	rows, total, err := l.q.List(f)
	unsettled, err := unsettledOf(err) // a full disk: list what the database holds, and say so
	if err != nil {
		return ListResult{}, err
	}
	out := ListResult{Now: now, Total: total, Offset: f.Offset, Limit: f.Limit, Rows: make([]Row, len(rows)),
		Unsettled: unsettled}
	for i := range rows {
		out.Rows[i] = rowOf(&rows[i].Message, &rows[i].Recipient, now)
		out.Rows[i].Node = l.node
	}
	return out, nil
}

// Message returns one message, as GET /api/queue/{id} does, also one that
// has finished while its record is kept; an unknown id is
// queue.ErrNotFound.
func (l *Local) Message(_ context.Context, id string) (Message, error) {
	qid, err := parseID(id)
	if err != nil {
		return Message{}, err
	}
	m, err := l.q.Show(qid)
	if errors.Is(err, queue.ErrNotFound) {
		return Message{}, fmt.Errorf("message %s is not in the queue, and no record of it is kept "+
			"(a finished message is kept for history.retention, at most history.max_messages of them): %w", qid, queue.ErrNotFound)
	}
	if err != nil {
		return Message{}, err
	}
	out := messageOf(&m, l.now())
	out.Node = l.node
	for i := range out.Recipients {
		out.Recipients[i].Node = l.node
	}
	return out, nil
}

// Destinations returns what was learned about every destination, as GET
// /api/destinations does.
func (l *Local) Destinations(_ context.Context) (Destinations, error) {
	ds, err := l.q.Destinations()
	if err != nil {
		return Destinations{}, err
	}
	out := Destinations{Now: l.now(), Destinations: make([]Destination, len(ds))}
	for i := range ds {
		out.Destinations[i] = destinationOf(&ds[i])
	}
	return out, nil
}

// Destination returns what was learned about domain, or nil when nothing
// was (where GET /api/destinations/{domain} answers 404).
func (l *Local) Destination(_ context.Context, domain string) (*Destination, error) {
	d, ok, err := l.q.Destination(domain)
	if err != nil || !ok {
		return nil, err
	}
	v := destinationOf(&d)
	return &v, nil
}
