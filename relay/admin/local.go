package admin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
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
	susp := l.suspended(now)
	for i := range rows {
		out.Rows[i] = rowOf(&rows[i].Message, &rows[i].Recipient, now)
		out.Rows[i].Node = l.node
		markSuspended(&out.Rows[i], susp)
	}
	return out, nil
}

// suspended returns the suspensions in force at now by domain; none when
// they cannot be read (the views then lack the mark, nothing else).
func (l *Local) suspended(now time.Time) map[string]*Suspension {
	ss, err := l.q.Suspensions()
	if err != nil {
		return nil
	}
	out := map[string]*Suspension{}
	for _, s := range ss {
		if s.Active(now) {
			out[s.Domain] = suspensionOf(s)
		}
	}
	return out
}

// Suspensions returns the suspensions in force, by domain.
func (l *Local) Suspensions(now time.Time) []Suspension {
	m := l.suspended(now)
	out := make([]Suspension, 0, len(m))
	for _, name := range slices.Sorted(maps.Keys(m)) {
		out = append(out, *m[name])
	}
	return out
}

// markSuspended marks a row not yet final whose domain is suspended.
func markSuspended(r *Row, susp map[string]*Suspension) {
	if s := susp[strings.ToLower(r.Domain)]; s != nil && !queue.Status(r.Status).Final() {
		r.Suspended = s
	}
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
	now := l.now()
	out := messageOf(&m, now)
	out.Node = l.node
	susp := l.suspended(now)
	for i := range out.Recipients {
		out.Recipients[i].Node = l.node
		markSuspended(&out.Recipients[i].Row, susp)
		out.Recipients[i].GreyLike = l.greyLike(&m.Recipients[i])
	}
	return out, nil
}

// greyLike returns the evidence that made r's deferral greylisting by its
// MX host's behaviour: r is greylisted with a reply whose text is the one
// the host's record learned (delivery's host.go); nil otherwise.
func (l *Local) greyLike(r *queue.Recipient) *GreyLike {
	if r.Reason != string(classifier.Greylisted) || r.MXAddr == "" || r.Reply.Text == "" || r.Status.Final() {
		return nil
	}
	name := "[" + r.MXAddr + "]"
	h, ok, err := l.q.Destination(name)
	if err != nil || !ok || h.GreyLike != r.Reply.Text {
		return nil
	}
	return &GreyLike{Host: name, Reply: h.GreyLike, Passed: h.GreyLikePassed, Refused: h.GreyLikeRefused}
}

// Destinations returns what was learned about every destination, as GET
// /api/destinations does.
func (l *Local) Destinations(_ context.Context) (Destinations, error) {
	ds, err := l.q.Destinations()
	if err != nil {
		return Destinations{}, err
	}
	now := l.now()
	susp := l.suspended(now)
	out := Destinations{Now: now, Destinations: make([]Destination, len(ds))}
	for i := range ds {
		out.Destinations[i] = destinationOf(&ds[i])
		out.Destinations[i].Suspended = susp[ds[i].Domain]
		delete(susp, ds[i].Domain)
	}
	for _, name := range slices.Sorted(maps.Keys(susp)) { // suspended before anything was learned
		out.Destinations = append(out.Destinations, Destination{Domain: name, DeadHosts: []DeadHost{}, Suspended: susp[name]})
	}
	slices.SortFunc(out.Destinations, func(a, b Destination) int { return strings.Compare(a.Domain, b.Domain) })
	return out, nil
}

// Destination returns what was learned about domain, or nil when nothing
// was (where GET /api/destinations/{domain} answers 404).
func (l *Local) Destination(_ context.Context, domain string) (*Destination, error) {
	d, ok, err := l.q.Destination(domain)
	if err != nil {
		return nil, err
	}
	s := l.suspended(l.now())[domain]
	if !ok && s == nil {
		return nil, nil
	}
	v := Destination{Domain: domain, DeadHosts: []DeadHost{}}
	if ok {
		v = destinationOf(&d)
	}
	v.Suspended = s
	return &v, nil
}
