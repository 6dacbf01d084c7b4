package admin

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// The queue's shape, as Postfix's qshape shows it: where the live
// recipients are going (or why they wait) against how old their messages
// are, in buckets that double from 5 minutes (qshape's defaults). One
// look tells a sudden problem (a destination filling the young buckets)
// from a chronic one (the old buckets). The queue is walked once, inside
// the queue, without building rows.

// shapeBuckets are qshape's default age buckets, in minutes.
var shapeBuckets = []int{5, 10, 20, 40, 80, 160, 320, 640, 1280}

// Shape rows by default and at most (GET /api/shape?limit=N).
const (
	DefaultShapeRows = 100
	MaxShapeRows     = 10000
)

// noReason names the row of recipients without a reason (never tried).
const noReason = "(not tried)"

// ShapeQuery selects a Shape: By is "domain" (the default) or "reason";
// Status, if set, limits it to one live status; Limit caps the rows (0:
// the API's default).
type ShapeQuery struct {
	By     string
	Status queue.Status
	Limit  int
}

func (sq ShapeQuery) check() (ShapeQuery, error) {
	if sq.By == "" {
		sq.By = "domain"
	}
	if sq.By != "domain" && sq.By != "reason" {
		return sq, badf("by: %q is not domain or reason", sq.By)
	}
	if sq.Status != "" && (!slices.Contains(statuses(), sq.Status) || sq.Status.Final()) {
		return sq, badf("status: %q is not a queue status (queued, deferred, active or held)", sq.Status)
	}
	if sq.Limit == 0 {
		sq.Limit = DefaultShapeRows
	}
	if sq.Limit < 1 || sq.Limit > MaxShapeRows {
		return sq, badf("limit: %d is not a number from 1 to %d", sq.Limit, MaxShapeRows)
	}
	return sq, nil
}

// Shape counts the live recipients as sq asks (GET /api/shape).
func (l *Local) Shape(_ context.Context, sq ShapeQuery) (Shape, error) {
	sq, err := sq.check()
	if err != nil {
		return Shape{}, err
	}
	now := l.now()
	rows := map[string]*ShapeRow{}
	total := newShapeRow("TOTAL")
	err = l.q.Walk(queue.Filter{Status: sq.Status}, func(m *queue.Message, r *queue.Recipient) bool {
		if r.Status.Final() {
			return true // a finished recipient of a message still queued
		}
		name := strings.ToLower(r.Domain)
		if sq.By == "reason" {
			name = r.Reason
			if name == "" {
				name = noReason
			}
		}
		row := rows[name]
		if row == nil {
			row = newShapeRow(name)
			rows[name] = row
		}
		b := ageBucket(now.Sub(m.Arrival))
		row.Total++
		row.Counts[b]++
		total.Total++
		total.Counts[b]++
		return true
	})
	unsettled, err := unsettledOf(err) // a full disk: what the database holds, and what it lacks
	if err != nil {
		return Shape{}, err
	}
	out := Shape{Now: now, By: sq.By, BucketMinutes: shapeBuckets, Total: *total, Rows: make([]ShapeRow, 0, len(rows)),
		Unsettled: unsettled}
	for _, r := range rows {
		out.Rows = append(out.Rows, *r)
	}
	slices.SortFunc(out.Rows, func(a, b ShapeRow) int {
		if a.Total != b.Total {
			return b.Total - a.Total
		}
		return strings.Compare(a.Name, b.Name)
	})
	if len(out.Rows) > sq.Limit {
		out.More = len(out.Rows) - sq.Limit
		out.Rows = out.Rows[:sq.Limit]
	}
	return out, nil
}

func newShapeRow(name string) *ShapeRow {
	return &ShapeRow{Name: name, Counts: make([]int, len(shapeBuckets)+1)}
}

// ageBucket is the index of the bucket of a message age: the first bound
// it does not exceed, or the last (older) bucket.
func ageBucket(age time.Duration) int {
	for i, m := range shapeBuckets {
		if age <= time.Duration(m)*time.Minute {
			return i
		}
	}
	return len(shapeBuckets)
}

// Values is sq as GET /api/shape's query string.
func (sq ShapeQuery) Values() url.Values {
	q := url.Values{}
	if sq.By != "" {
		q.Set("by", sq.By)
	}
	if sq.Status != "" {
		q.Set("status", string(sq.Status))
	}
	if sq.Limit != 0 {
		q.Set("limit", strconv.Itoa(sq.Limit))
	}
	return q
}

func (s *Server) shape(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sq := ShapeQuery{By: q.Get("by"), Status: queue.Status(q.Get("status"))}
	var err error
	if sq.Limit, err = intParam(q, "limit", DefaultShapeRows, 1, MaxShapeRows); err != nil {
		s.fail(w, r, err)
		return
	}
	out, err := s.local.Shape(r.Context(), sq)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
