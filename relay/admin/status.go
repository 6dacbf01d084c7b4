package admin

import (
	"bytes"
	_ "embed"
	"net/http"
	"sort"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// The status page is one self-contained HTML document (inline CSS, no
// scripts, no external assets) rendered with html/template, which escapes
// everything a remote server may have put into a reply. It refreshes itself
// every 10 s with <meta http-equiv=refresh>.

//go:embed status.html
var statusHTML string

// Rows shown per section of the status page.
const (
	pageOldest    = 10
	pageDeferrals = 20
)

type count struct {
	Name string
	N    int
}

type pageRow struct {
	Row
	Age, Next, Last string
	Reply           string
	Explanation     *Explanation
}

type pageDest struct {
	Destination
	Delay, ThrottledFor string
	LastReplyText       string
}

type pageData struct {
	Hostname   string
	Now        string
	Stats      Stats
	OldestAge  string
	DBSize     string
	ByStatus   []count
	ByReason   []count
	Oldest     []pageRow
	Deferrals  []pageRow
	DeferTotal int
	Dests      []pageDest
	Probe      bool
}

func (s *Server) statusPage(w http.ResponseWriter, r *http.Request) {
	d, err := s.pageData(s.opt.Now())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var buf bytes.Buffer
	if err := s.page.Execute(&buf, d); err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) pageData(now time.Time) (*pageData, error) {
	st, err := s.opt.Queue.Stats()
	if err != nil {
		return nil, err
	}
	d := &pageData{Hostname: s.opt.Config.Hostname, Now: now.UTC().Format(time.RFC3339),
		Stats: statsOf(st, s.opt.Queue.DBSize(), now), Probe: s.opt.Probe != nil}
	d.DBSize = humanBytes(d.Stats.DBBytes)
	d.OldestAge = "-"
	if !st.Oldest.IsZero() {
		d.OldestAge = humanDuration(now.Sub(st.Oldest))
	}
	for _, x := range statuses() {
		if n := st.ByStatus[x]; n > 0 {
			d.ByStatus = append(d.ByStatus, count{string(x), n})
		}
	}
	for name, n := range st.ByReason {
		d.ByReason = append(d.ByReason, count{name, n})
	}
	sort.Slice(d.ByReason, func(i, j int) bool {
		a, b := d.ByReason[i], d.ByReason[j]
		return a.N > b.N || a.N == b.N && a.Name < b.Name
	})
	// IDs are assigned in enqueue order, so the first rows are the oldest.
	oldest, _, err := s.opt.Queue.List(queue.Filter{Limit: pageOldest})
	if err != nil {
		return nil, err
	}
	d.Oldest = pageRows(oldest, now)
	if d.Deferrals, d.DeferTotal, err = s.latestDeferrals(now); err != nil {
		return nil, err
	}
	if d.Dests, err = s.learnedDestinations(now); err != nil {
		return nil, err
	}
	return d, nil
}

// latestDeferrals returns deferred recipients of the newest messages, the
// most recent attempt first. The queue lists in key order, so the last page
// of the deferred filter holds the newest messages; this costs two list
// walks, independent of how many rows are shown.
func (s *Server) latestDeferrals(now time.Time) ([]pageRow, int, error) {
	_, total, err := s.opt.Queue.List(queue.Filter{Status: queue.Deferred, Limit: 1})
	if err != nil || total == 0 {
		return nil, total, err
	}
	rows, total, err := s.opt.Queue.List(queue.Filter{Status: queue.Deferred,
		Offset: max(0, total-pageDeferrals), Limit: pageDeferrals})
	if err != nil {
		return nil, 0, err
	}
	sort.SliceStable(rows, func(i, j int) bool {
		return rows[i].Recipient.LastAttempt.After(rows[j].Recipient.LastAttempt)
	})
	out := pageRows(rows, now)
	for i := range out {
		out[i].Explanation = explain(&rows[i].Recipient)
	}
	return out, total, nil
}

func pageRows(rows []queue.Row, now time.Time) []pageRow {
	out := make([]pageRow, len(rows))
	for i := range rows {
		rj := rowOf(&rows[i].Message, &rows[i].Recipient, now)
		out[i] = pageRow{Row: rj, Age: humanDuration(now.Sub(rj.Arrival)),
			Next: nextText(rj.Status, rows[i].Recipient.NextAttempt, now), Last: relTime(rows[i].Recipient.LastAttempt, now),
			Reply: clean(replyText(rj.LastReply))}
		out[i].Sender = sender(rj.Sender)
	}
	return out
}

// learnedDestinations returns the destinations worth an operator's eye:
// those that greylist, throttle us or have hosts marked dead.
func (s *Server) learnedDestinations(now time.Time) ([]pageDest, error) {
	ds, err := s.opt.Queue.Destinations()
	if err != nil {
		return nil, err
	}
	var out []pageDest
	for i := range ds {
		x := &ds[i]
		if !x.Greylists && x.ThrottleLevel == 0 && !x.ThrottledUntil.After(now) && len(x.DeadHosts) == 0 {
			continue
		}
		pd := pageDest{Destination: destinationOf(x), Delay: "-", ThrottledFor: "-",
			LastReplyText: clean(replyText(replyOf(x.LastReply)))}
		if x.LearnedDelay > 0 {
			pd.Delay = humanDuration(x.LearnedDelay)
		}
		if x.ThrottledUntil.After(now) {
			pd.ThrottledFor = humanDuration(x.ThrottledUntil.Sub(now))
		}
		out = append(out, pd)
	}
	return out, nil
}
