package admin

import (
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
)

// The views: the JSON shapes of the API. The server encodes them, adminclient
// decodes them and Local builds them in process, so one definition serves
// all three. Names are snake_case; zero times are omitted (a
// never-attempted recipient has no last_attempt). Field names are part of
// the operator interface (README, scripts): change them only on purpose.

// Reply is an SMTP reply as a remote server gave it.
type Reply struct {
	Code     int    `json:"code,omitempty"`
	Enhanced string `json:"enhanced,omitempty"`
	Text     string `json:"text,omitempty"`
}

// Explanation is classifier.Explanation of a recipient's last reply.
type Explanation struct {
	Meaning string `json:"meaning"`
	Fault   string `json:"fault"`
	Action  string `json:"action"`
}

// Row is one recipient of one message: a line of `queue list` and of
// GET /api/queue.
type Row struct {
	ID          string     `json:"id"`             // message id
	Node        string     `json:"node,omitempty"` // the node that holds it (config.Config.NodeName)
	Key         string     `json:"key"`            // id/recipient-index
	Rcpt        int        `json:"rcpt"`           // recipient index
	Status      string     `json:"status"`
	Reason      string     `json:"reason,omitempty"`
	Attempts    int        `json:"attempts"`
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
	LastAttempt *time.Time `json:"last_attempt,omitempty"`
	LastReply   *Reply     `json:"last_reply,omitempty"`
	SourceIP    string     `json:"source_ip,omitempty"`
	MXHost      string     `json:"mx_host,omitempty"`
	MXAddr      string     `json:"mx_addr,omitempty"`
	Sender      string     `json:"sender"`               // "" is the null sender <>
	Tag         string     `json:"tag,omitempty"`        // the message's X-Greyrelay-Tag
	EnvID       string     `json:"envid,omitempty"`      // RFC 3461 ENVID
	MessageID   string     `json:"message_id,omitempty"` // the message's Message-ID
	Recipient   string     `json:"recipient"`
	Domain      string     `json:"domain"`
	Arrival     time.Time  `json:"arrival"`
	AgeSeconds  float64    `json:"age_seconds"`
	// Finished is set when the message has left the queue (all its
	// recipients final; kept for history.retention): its last outcome.
	Finished *time.Time `json:"finished,omitempty"`
	// Suspended is set for a recipient not yet final whose domain the
	// operator suspended: it is not attempted until the suspension ends.
	Suspended *Suspension `json:"suspended,omitempty"`
}

// Suspension is the operator's suspension of a destination domain
// (greyrelay destinations suspend): delivery to it stops, its mail stays
// queued.
type Suspension struct {
	Domain string     `json:"domain"`
	Reason string     `json:"reason,omitempty"`
	Since  time.Time  `json:"since"`
	Until  *time.Time `json:"until,omitempty"` // absent: until the operator resumes it
	Node   string     `json:"node,omitempty"`  // the node where it was made
}

// SuspendResult answers POST /api/destinations/suspend and resume.
type SuspendResult struct {
	Action     string      `json:"action"` // "suspend" or "resume"
	Domain     string      `json:"domain"`
	Suspension *Suspension `json:"suspension,omitempty"` // what is now in force (suspend)
	// WasSuspended (resume): the domain was suspended; Recipients: how
	// many of its recipients resume made due.
	WasSuspended bool `json:"was_suspended,omitempty"`
	Recipients   int  `json:"recipients"`
}

// ListResult is one page of GET /api/queue.
type ListResult struct {
	Now    time.Time `json:"now"` // the server's clock, for relative times
	Total  int       `json:"total"`
	Offset int       `json:"offset"`
	Limit  int       `json:"limit"`
	Rows   []Row     `json:"rows"`
	Unsettled
}

// Unsettled is part of an answer read while the queue's database cannot
// be written (its commits fail, as on a full disk): the answer holds what
// the database holds, and lacks Recipients recipients that were accepted
// (250) and are safe in the intake journal, until the database takes
// them. Error is why it cannot. Both are omitted otherwise.
type Unsettled struct {
	Recipients int    `json:"unsettled_recipients,omitempty"`
	Error      string `json:"unsettled_error,omitempty"`
}

// unsettledOf splits the error of a queue read: a *queue.UnsettledError
// becomes the Unsettled of the read's answer; any other error is
// returned.
func unsettledOf(err error) (Unsettled, error) {
	var ue *queue.UnsettledError
	if !errors.As(err, &ue) {
		return Unsettled{}, err
	}
	return Unsettled{Recipients: ue.Recipients, Error: ue.Err.Error()}, nil
}

// Note is a line telling an operator what u means for an answer (what:
// "this list", "these counts"), or "" when the answer lacks nothing.
func (u Unsettled) Note(what string) string {
	if u.Recipients == 0 {
		return ""
	}
	return fmt.Sprintf("note: %d recipients accepted and journaled are not in %s yet "+
		"(the database cannot be written: %s)", u.Recipients, what, u.Error)
}

// Attempt is one delivery attempt of one recipient.
type Attempt struct {
	Start    time.Time  `json:"start"`
	End      *time.Time `json:"end,omitempty"`
	SourceIP string     `json:"source_ip,omitempty"`
	MXHost   string     `json:"mx_host,omitempty"`
	MXAddr   string     `json:"mx_addr,omitempty"`
	Stage    string     `json:"stage,omitempty"`
	Outcome  string     `json:"outcome"`
	Reason   string     `json:"reason,omitempty"`
	Reply    *Reply     `json:"reply,omitempty"`
	// TLS is the TLS policy the attempt was made under (dane, mta-sts,
	// mta-sts-testing, dane-unusable, none); empty when none was asked.
	TLS string `json:"tls_policy,omitempty"`
}

// Recipient is a Row with everything the queue keeps about it: its
// attempts and an explanation of its last reply.
type Recipient struct {
	Row
	Notify          string       `json:"notify,omitempty"`
	ORCPT           string       `json:"orcpt,omitempty"`
	FirstAttempt    *time.Time   `json:"first_attempt,omitempty"`
	FirstGreylisted *time.Time   `json:"first_greylisted,omitempty"`
	GreylistTries   int          `json:"greylist_tries,omitempty"`
	DelayWarnings   int          `json:"delay_warnings,omitempty"`
	Explanation     *Explanation `json:"explanation,omitempty"`
	// GreyLike is set for a recipient deferred as greylisted because of
	// how its MX host behaved, not by its reply's text: the evidence.
	GreyLike *GreyLike `json:"grey_like,omitempty"`
	// Salvaged: `queue salvage` recovered this recipient from an older
	// copy of its record, so it may already have been delivered (a
	// duplicate if it is delivered again).
	Salvaged *time.Time `json:"salvaged,omitempty"`
	History  []Attempt  `json:"history"`
}

// GreyLike is the evidence that a temporary reply without a greylisting
// text is greylisting at one MX host: of the recipients it deferred
// there, Passed passed at their first retry to the same address from the
// same source and Refused were refused again (the host's record in
// `destinations`).
type GreyLike struct {
	Host    string `json:"host"` // the MX host's record, "[address]"
	Reply   string `json:"reply"`
	Passed  int    `json:"passed"`
	Refused int    `json:"refused"`
}

// Message is one queued message: GET /api/queue/{id}.
type Message struct {
	Now        time.Time `json:"now"`
	ID         string    `json:"id"`
	Node       string    `json:"node,omitempty"` // the node that holds it (config.Config.NodeName)
	Sender     string    `json:"sender"`
	Arrival    time.Time `json:"arrival"`
	Size       int64     `json:"size"`
	ClientAddr string    `json:"client_addr,omitempty"`
	AuthUser   string    `json:"auth_user,omitempty"`
	Helo       string    `json:"helo,omitempty"`
	RET        string    `json:"ret,omitempty"`
	EnvID      string    `json:"envid,omitempty"`
	Tag        string    `json:"tag,omitempty"`
	MessageID  string    `json:"message_id,omitempty"`
	SMTPUTF8   bool      `json:"smtputf8,omitempty"`
	EightBit   bool      `json:"8bitmime,omitempty"`
	DSN        bool      `json:"dsn,omitempty"`
	// Finished is set for a message that has left the queue: the time of
	// its last outcome. Its body is not kept.
	Finished   *time.Time  `json:"finished,omitempty"`
	Recipients []Recipient `json:"recipients"`
}

// Shape is GET /api/shape, Postfix's qshape: live recipients counted by
// destination domain (or by reason) and by the age of their message.
type Shape struct {
	Now time.Time `json:"now"`
	By  string    `json:"by"` // "domain" or "reason"
	// BucketMinutes are the upper bounds of the age buckets: a row's
	// Counts[i] are recipients of messages at most BucketMinutes[i] old
	// and older than the bucket before; its last count is everything
	// older than the last bound.
	BucketMinutes []int      `json:"bucket_minutes"`
	Total         ShapeRow   `json:"total"`
	Rows          []ShapeRow `json:"rows"` // largest total first
	More          int        `json:"more"` // rows left out by the limit
	Unsettled                // the counts lack these recipients
}

// ShapeRow is one line of a Shape.
type ShapeRow struct {
	Name   string `json:"name"`
	Total  int    `json:"total"`
	Counts []int  `json:"counts"`
}

// ActionResult is the answer to a queue action.
type ActionResult struct {
	Action     string `json:"action"`
	Recipients int    `json:"recipients"` // how many recipients changed, or would change with dry_run
	DryRun     bool   `json:"dry_run,omitempty"`
	// Unsettled: on a full disk the action was done on the messages the
	// database holds; the journaled ones it lacks were left as they are.
	Unsettled
}

// DeadHost is a host of a destination that delivery skips until Until.
type DeadHost struct {
	Host  string    `json:"host"`
	Until time.Time `json:"until"`
}

// Destination is what the relay learned about one destination domain:
// greylisting and its learned delay, throttling, dead hosts.
type Destination struct {
	Domain              string     `json:"domain"`
	Greylists           bool       `json:"greylists"`
	GreylistSeen        int        `json:"greylist_seen"`
	GreylistPassed      int        `json:"greylist_passed"`
	LearnedDelaySeconds float64    `json:"learned_delay_seconds"`      // upper bound of the greylisting delay
	GreylistLowSeconds  float64    `json:"greylist_low_seconds"`       // its lower bound (0: none)
	GreylistLearned     *time.Time `json:"greylist_learned,omitempty"` // when those bounds last changed
	LastGreylisted      *time.Time `json:"last_greylisted,omitempty"`
	ThrottleLevel       int        `json:"throttle_level"`
	PaceSeconds         float64    `json:"pace_seconds"`           // learned interval between transactions (0: not paced)
	PaceRefused         *time.Time `json:"pace_refused,omitempty"` // when a rate-limit reply last slowed the pace
	ThrottledUntil      *time.Time `json:"throttled_until,omitempty"`
	DeadHosts           []DeadHost `json:"dead_hosts"` // sorted by host
	// GreyLike is a temporary reply without a greylisting text that this
	// MX host ("[address]") sent and that behaved like greylisting: it is
	// treated as greylisting once GreyLikePassed recipients it deferred
	// passed at their first retry (at least 2, and more than twice
	// GreyLikeRefused, those refused again at it).
	GreyLike        string     `json:"grey_like,omitempty"`
	GreyLikePassed  int        `json:"grey_like_passed,omitempty"`
	GreyLikeRefused int        `json:"grey_like_refused,omitempty"`
	LastReply       *Reply     `json:"last_reply,omitempty"`
	Updated         *time.Time `json:"updated,omitempty"`
	// Suspended is set while the operator has suspended delivery to the
	// domain.
	Suspended *Suspension `json:"suspended,omitempty"`
}

// Destinations is GET /api/destinations, and GET
// /api/destinations/{domain} with exactly one destination.
type Destinations struct {
	Now          time.Time     `json:"now"`
	Destinations []Destination `json:"destinations"`
}

// Stats is GET /api/stats: queue counters.
type Stats struct {
	Now              time.Time      `json:"now"`
	ByStatus         map[string]int `json:"by_status"`
	ByReason         map[string]int `json:"by_reason"`
	Messages         int            `json:"messages"`
	Recipients       int            `json:"recipients"`
	Oldest           *time.Time     `json:"oldest,omitempty"`
	OldestAgeSeconds float64        `json:"oldest_age_seconds"`
	DBBytes          int64          `json:"db_bytes"`
	Unsettled                       // the counts lack these recipients
}

// ErrorAnswer is the body of every error answer: {"error": "..."}.
type ErrorAnswer struct {
	Error string `json:"error"`
}

func ts(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func replyOf(r queue.Reply) *Reply {
	if r == (queue.Reply{}) {
		return nil
	}
	return &Reply{Code: r.Code, Enhanced: r.Enhanced, Text: r.Text}
}

func rowOf(m *queue.Message, r *queue.Recipient, now time.Time) Row {
	return Row{
		ID: m.ID.String(), Key: r.Key.String(), Rcpt: r.Key.Rcpt,
		Status: string(r.Status), Reason: r.Reason, Attempts: r.Attempts,
		NextAttempt: ts(r.NextAttempt), LastAttempt: ts(r.LastAttempt), LastReply: replyOf(r.Reply),
		SourceIP: r.SourceIP, MXHost: r.MXHost, MXAddr: r.MXAddr,
		Sender: m.From, Tag: m.Tag, EnvID: m.EnvID, MessageID: m.MessageID, Recipient: r.Addr, Domain: r.Domain,
		Arrival: m.Arrival, AgeSeconds: now.Sub(m.Arrival).Seconds(), Finished: ts(m.Finished),
	}
}

// explain describes the last reply of a recipient that has one and is not
// delivered, or the operator's action on it (a held recipient is
// explained as held whatever its reason: an attempt in flight when it was
// held stores its own); it returns nil otherwise.
func explain(r *queue.Recipient) *Explanation {
	reason := classifier.Reason(r.Reason)
	if r.Status == queue.Held {
		reason = classifier.OperatorHeld
	}
	if reason == "" || r.Status == queue.Delivered || r.Status == queue.Relayed {
		return nil
	}
	e := classifier.Explain(reason, r.Reply.Enhanced)
	return &Explanation{Meaning: e.Meaning, Fault: string(e.Fault), Action: e.Action}
}

func messageOf(m *queue.Message, now time.Time) Message {
	out := Message{Now: now, ID: m.ID.String(), Sender: m.From, Arrival: m.Arrival, Size: m.Size,
		ClientAddr: m.ClientAddr, AuthUser: m.AuthUser, Helo: m.Helo, RET: m.RET, EnvID: m.EnvID,
		Tag: m.Tag, MessageID: m.MessageID,
		SMTPUTF8: m.SMTPUTF8, EightBit: m.EightBit, DSN: m.DSN, Finished: ts(m.Finished),
		Recipients: make([]Recipient, 0, len(m.Recipients))}
	for i := range m.Recipients {
		r := &m.Recipients[i]
		rj := Recipient{Row: rowOf(m, r, now), Notify: r.Notify, ORCPT: r.ORCPT,
			FirstAttempt: ts(r.FirstAttempt), FirstGreylisted: ts(r.FirstGreylisted),
			GreylistTries: r.GreylistTries, DelayWarnings: r.DelayWarnings,
			Explanation: explain(r), Salvaged: ts(r.Salvaged), History: make([]Attempt, 0, len(r.History))}
		for _, a := range r.History {
			rj.History = append(rj.History, Attempt{Start: a.Start, End: ts(a.End),
				SourceIP: a.SourceIP, MXHost: a.MXHost, MXAddr: a.MXAddr, Stage: a.Stage,
				Outcome: a.Outcome, Reason: a.Reason, Reply: replyOf(a.Reply), TLS: a.TLS})
		}
		out.Recipients = append(out.Recipients, rj)
	}
	return out
}

func suspensionOf(s queue.Suspension) *Suspension {
	return &Suspension{Domain: s.Domain, Reason: s.Reason, Since: s.Since, Until: ts(s.Until), Node: s.Node}
}

func destinationOf(d *queue.Destination) Destination {
	out := Destination{Domain: d.Domain, Greylists: d.Greylists, GreylistSeen: d.GreylistSeen,
		GreylistPassed: d.GreylistPassed, LearnedDelaySeconds: d.LearnedDelay.Seconds(),
		GreylistLowSeconds: d.GreylistLow.Seconds(), PaceSeconds: d.PaceInterval.Seconds(),
		PaceRefused: ts(d.PaceRefused), GreylistLearned: ts(d.GreylistLearned),
		LastGreylisted: ts(d.LastGreylisted), ThrottleLevel: d.ThrottleLevel,
		ThrottledUntil: ts(d.ThrottledUntil), DeadHosts: make([]DeadHost, 0, len(d.DeadHosts)),
		LastReply: replyOf(d.LastReply), Updated: ts(d.Updated),
		GreyLike: d.GreyLike, GreyLikePassed: d.GreyLikePassed, GreyLikeRefused: d.GreyLikeRefused}
	for h, until := range d.DeadHosts {
		out.DeadHosts = append(out.DeadHosts, DeadHost{Host: h, Until: until})
	}
	sort.Slice(out.DeadHosts, func(i, j int) bool { return out.DeadHosts[i].Host < out.DeadHosts[j].Host })
	return out
}

func statsOf(st queue.Stats, dbBytes int64, now time.Time) Stats {
	out := Stats{Now: now, ByStatus: make(map[string]int, len(st.ByStatus)), ByReason: st.ByReason,
		Messages: st.Messages, Recipients: st.Recipients, Oldest: ts(st.Oldest), DBBytes: dbBytes}
	for k, v := range st.ByStatus {
		out.ByStatus[string(k)] = v
	}
	if out.ByReason == nil {
		out.ByReason = map[string]int{}
	}
	if !st.Oldest.IsZero() {
		out.OldestAgeSeconds = max(0, now.Sub(st.Oldest).Seconds())
	}
	return out
}

// ListQuery selects recipients, as the query of GET /api/queue does; zero
// fields do not filter.
type ListQuery struct {
	Status    queue.Status
	Reason    string
	Domain    string // destination domain
	Sender    string
	Tag       string        // the message's X-Greyrelay-Tag; with no status, finished messages too
	EnvID     string        // the message's ENVID; likewise
	MessageID string        // the message's Message-ID, angle brackets optional; likewise
	OlderThan time.Duration // only messages that arrived at least this long ago
	Offset    int
	Limit     int // 0: the API's default (100); at most 10000
}

// Values is lq as GET /api/queue's query string.
func (lq ListQuery) Values() url.Values {
	q := url.Values{}
	for name, v := range map[string]string{"status": string(lq.Status), "reason": lq.Reason,
		"domain": lq.Domain, "sender": lq.Sender, "tag": lq.Tag, "envid": lq.EnvID, "message_id": lq.MessageID} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if lq.OlderThan != 0 {
		q.Set("older_than", lq.OlderThan.String())
	}
	if lq.Offset != 0 {
		q.Set("offset", strconv.Itoa(lq.Offset))
	}
	if lq.Limit != 0 {
		q.Set("limit", strconv.Itoa(lq.Limit))
	}
	return q
}

// Statuses lists every recipient status a filter takes, in the order
// usage texts and errors list them.
func Statuses() []queue.Status { return statuses() }
