package admin

import (
	"bytes"
	"context"
	_ "embed"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dkim"
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
	pageBounced   = 20
	pageDelivered = 20
	pageShapeRows = 15
	pageDests     = 200
)

type count struct {
	Name string
	N    int
}

type pageRow struct {
	Row
	Age, Next, Last string
	Reply           string
	Why             string // anchor of the row's explanation; "" for none
	TLS             string // the TLS policy of the last attempt (latest rows only)
}

type pageDest struct {
	Domain              string
	Known               bool // something was learned
	Greylists           bool
	Delay, ThrottledFor string
	GreylistSeen        int
	GreylistPassed      int
	ThrottleLevel       int
	DeadHosts           []DeadHost
	Queued              int
	LastReplyText       string
}

// pageExpl is one explanation, shown once for every row that links to it.
type pageExpl struct {
	ID       string
	Reason   string
	Enhanced []string // enhanced codes of the rows that link to it
	Explanation
}

type pageData struct {
	Hostname     string
	Now          string
	Stats        Stats
	OldestAge    string
	DBSize       string
	ByStatus     []count
	ByReason     []count
	Charts       []pageChart
	Axis         chartAxis
	Shape        Shape
	Oldest       []pageRow
	Deferrals    []pageRow
	DeferTotal   int
	Bounced      []pageRow
	BounceTotal  int
	Delivered    []pageRow // finished deliveries still kept (history.retention)
	DeliverTotal int
	Finished     int
	Dests        []pageDest
	DestsHidden  int
	Expls        []*pageExpl
	Probe        bool
	Nodes        []pageNode // the cluster's nodes; nil for a node on its own
	Find         pageFind   // the page's search by the application's names
	FindBy       []string   // what it may search by
	DKIM         []pageDKIM // the signing keys' records
	Suspended    []pageSuspension

	expls map[Explanation]*pageExpl
}

// pageFind is a search of the status page (?by=tag|envid|message_id&q=):
// the messages an application knows by that name, queued or finished.
type pageFind struct {
	By, Q string
	Rows  []pageRow
	Total int
}

// pageFound is how many recipients a search shows.
const pageFound = 50

// findBy names the searches, as the query's by= spells them.
var findBy = []string{"tag", "envid", "message_id"}

// pageSuspension is a suspended destination on the status page.
type pageSuspension struct{ Domain, Text string }

func (s *Server) statusPage(w http.ResponseWriter, r *http.Request) {
	now := s.opt.Now()
	d, err := s.pageData(now)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if d.Find, err = s.find(d, r.URL.Query(), now); err != nil {
		s.fail(w, r, err)
		return
	}
	var buf bytes.Buffer
	if err := s.page.Execute(&buf, d); err != nil {
		s.fail(w, r, err)
		return
	}
	writePage(w, buf.Bytes())
}

func (s *Server) pageData(now time.Time) (*pageData, error) {
	st, err := s.opt.Queue.Stats()
	// A full disk: the page shows what the database holds and says what it
	// lacks (once: every read of the queue below lacks the same).
	unsettled, err := unsettledOf(err)
	if err != nil {
		return nil, err
	}
	d := &pageData{Hostname: s.opt.Config.Hostname, Now: now.UTC().Format(time.RFC3339),
		Stats: statsOf(st, s.opt.Queue.DBSize(), now), Probe: s.opt.Probe != nil, FindBy: findBy,
		expls: map[Explanation]*pageExpl{}}
	d.Stats.Unsettled = unsettled
	for _, sp := range s.local.Suspensions(now) {
		d.Suspended = append(d.Suspended, pageSuspension{Domain: sp.Domain, Text: SuspendedText(&sp, now)})
	}
	d.DBSize = HumanBytes(d.Stats.DBBytes)
	d.OldestAge = "-"
	if !st.Oldest.IsZero() {
		d.OldestAge = HumanDuration(now.Sub(st.Oldest))
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
	if s.opt.Recent != nil {
		d.Charts, d.Axis = charts(s.opt.Recent, now, s.started)
	}
	// One walk of the queue gives the shape and the recipients queued
	// per destination.
	byDomain, err := s.local.Shape(context.Background(), ShapeQuery{Limit: MaxShapeRows})
	if err != nil {
		return nil, err
	}
	d.Shape = byDomain
	d.Shape.Rows = byDomain.Rows[:min(len(byDomain.Rows), pageShapeRows)]
	d.Shape.More = byDomain.More + len(byDomain.Rows) - len(d.Shape.Rows)
	// IDs are assigned in enqueue order, so the first rows are the oldest.
	var oldest []queue.Row
	err = s.opt.Queue.Walk(queue.Filter{}, func(m *queue.Message, r *queue.Recipient) bool {
		oldest = append(oldest, queue.Row{Message: *m, Recipient: *r})
		return len(oldest) < pageOldest
	})
	if _, err = unsettledOf(err); err != nil {
		return nil, err
	}
	d.Oldest = d.pageRows(oldest, now)
	if d.Deferrals, d.DeferTotal, err = s.latest(d, queue.Deferred, pageDeferrals, now); err != nil {
		return nil, err
	}
	if d.Bounced, d.BounceTotal, err = s.latest(d, queue.Failed, pageBounced, now); err != nil {
		return nil, err
	}
	if d.Delivered, d.DeliverTotal, err = s.latest(d, queue.Delivered, pageDelivered, now); err != nil {
		return nil, err
	}
	if d.Finished, err = s.opt.Queue.Finished(); err != nil {
		return nil, err
	}
	if d.Dests, d.DestsHidden, err = s.allDestinations(byDomain.Rows, now); err != nil {
		return nil, err
	}
	d.Nodes = s.clusterNodes(context.Background())
	if s.opt.DKIM != nil {
		d.DKIM = dkimRecords(s.opt.DKIM.Keys())
	}
	return d, nil
}

// find runs the search the query asks for, if any.
func (s *Server) find(d *pageData, q url.Values, now time.Time) (pageFind, error) {
	f := pageFind{By: q.Get("by"), Q: strings.TrimSpace(q.Get("q"))}
	if !slices.Contains(findBy, f.By) {
		f.By = findBy[0]
	}
	if f.Q == "" {
		return f, nil
	}
	filter := queue.Filter{Limit: pageFound}
	switch f.By {
	case "tag":
		filter.Tag = f.Q
	case "envid":
		filter.EnvID = f.Q
	default:
		filter.MessageID = f.Q
	}
	rows, total, err := s.opt.Queue.List(filter)
	if _, err = unsettledOf(err); err != nil {
		return f, err
	}
	f.Rows, f.Total = d.pageRows(rows, now), total
	return f, nil
}

// pageDKIM is a signing key's DNS record: Name and, as one string, the
// TXT value (what a DNS provider's web form takes).
type pageDKIM struct {
	Name, Algorithm, Value string
}

func dkimRecords(k *dkim.Keys) []pageDKIM {
	var out []pageDKIM
	for _, s := range k.Selectors() {
		out = append(out, pageDKIM{Name: s.Name + "._domainkey." + s.Domain, Algorithm: s.Algorithm(), Value: s.Record()})
	}
	return out
}

// latest returns the last n recipients with status st in List's order
// (the newest messages; for Failed, the latest finished ones last), the
// most recent attempt first, and how many there are: one walk of the
// queue, keeping n rows.
func (s *Server) latest(d *pageData, st queue.Status, n int, now time.Time) ([]pageRow, int, error) {
	ring := make([]queue.Row, n)
	total := 0
	err := s.opt.Queue.Walk(queue.Filter{Status: st}, func(m *queue.Message, r *queue.Recipient) bool {
		ring[total%n] = queue.Row{Message: *m, Recipient: *r}
		total++
		return true
	})
	if _, err = unsettledOf(err); err != nil || total == 0 {
		return nil, total, err
	}
	rows := ring[:min(total, n)]
	sort.SliceStable(rows, func(i, j int) bool {
		return rows[i].Recipient.LastAttempt.After(rows[j].Recipient.LastAttempt)
	})
	out := d.pageRows(rows, now)
	s.lastTLS(out, rows)
	return out, total, nil
}

// lastTLS fills in each row's TLS policy from its recipient's last
// attempt (Walk gives no histories; these few rows are read with Show).
func (s *Server) lastTLS(out []pageRow, rows []queue.Row) {
	shown := map[queue.ID]queue.Message{}
	for i, r := range rows {
		m, ok := shown[r.Message.ID]
		if !ok {
			var err error
			if m, err = s.opt.Queue.Show(r.Message.ID); err != nil {
				continue
			}
			shown[r.Message.ID] = m
		}
		for _, rc := range m.Recipients {
			if rc.Key == r.Recipient.Key && len(rc.History) > 0 {
				out[i].TLS = rc.History[len(rc.History)-1].TLS
			}
		}
	}
}

func (d *pageData) pageRows(rows []queue.Row, now time.Time) []pageRow {
	out := make([]pageRow, len(rows))
	for i := range rows {
		rj := rowOf(&rows[i].Message, &rows[i].Recipient, now)
		out[i] = pageRow{Row: rj, Age: HumanDuration(now.Sub(rj.Arrival)),
			Next: NextText(rj.Status, rows[i].Recipient.NextAttempt, now), Last: RelTime(rows[i].Recipient.LastAttempt, now),
			Reply: Clean(ReplyText(rj.LastReply)), Why: d.explain(&rows[i].Recipient)}
		out[i].Sender = Sender(rj.Sender)
	}
	return out
}

// explain files the explanation of r's last reply under the page's list
// of explanations, once per distinct explanation, and returns its anchor.
func (d *pageData) explain(r *queue.Recipient) string {
	e := explain(r)
	if e == nil {
		return ""
	}
	x := d.expls[*e]
	if x == nil {
		x = &pageExpl{ID: "why-" + strconv.Itoa(len(d.Expls)+1), Reason: r.Reason, Explanation: *e}
		d.expls[*e] = x
		d.Expls = append(d.Expls, x)
	}
	if c := r.Reply.Enhanced; c != "" && !slices.Contains(x.Enhanced, c) {
		x.Enhanced = append(x.Enhanced, c)
	}
	return x.ID
}

// allDestinations returns every destination with recipients in the queue
// or something learned (greylisting, throttling, dead hosts), most queued
// first, at most pageDests; the second result is how many more there are.
// A destination with neither has nothing to show.
func (s *Server) allDestinations(queued []ShapeRow, now time.Time) ([]pageDest, int, error) {
	ds, err := s.opt.Queue.Destinations()
	if err != nil {
		return nil, 0, err
	}
	byName := map[string]*pageDest{}
	var out []*pageDest
	for _, r := range queued {
		pd := &pageDest{Domain: r.Name, Queued: r.Total, Delay: "-", ThrottledFor: "-"}
		byName[r.Name] = pd
		out = append(out, pd)
	}
	for i := range ds {
		x := &ds[i]
		learned := x.Greylists || x.ThrottleLevel > 0 || x.ThrottledUntil.After(now) || len(x.DeadHosts) > 0
		pd := byName[strings.ToLower(x.Domain)]
		if pd == nil && !learned {
			continue
		}
		if pd == nil {
			pd = &pageDest{Domain: x.Domain}
			out = append(out, pd)
		}
		v := destinationOf(x)
		pd.Known, pd.Greylists, pd.GreylistSeen, pd.GreylistPassed = learned, x.Greylists, x.GreylistSeen, x.GreylistPassed
		pd.ThrottleLevel, pd.DeadHosts = x.ThrottleLevel, v.DeadHosts
		pd.LastReplyText = Clean(ReplyText(v.LastReply))
		pd.Delay, pd.ThrottledFor = "-", "-"
		if x.LearnedDelay > 0 {
			pd.Delay = HumanDuration(x.LearnedDelay)
		}
		if x.ThrottledUntil.After(now) {
			pd.ThrottledFor = HumanDuration(x.ThrottledUntil.Sub(now))
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.Queued > b.Queued || a.Queued == b.Queued && a.Domain < b.Domain
	})
	hidden := max(0, len(out)-pageDests)
	res := make([]pageDest, 0, len(out)-hidden)
	for _, pd := range out[:len(out)-hidden] {
		res = append(res, *pd)
	}
	return res, hidden, nil
}
