package admin

import (
	"sort"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
)

// The JSON shapes of the API. The server encodes them and the CLI decodes
// them, so one definition serves both. Names are snake_case; zero times are
// omitted (a never-attempted recipient has no last_attempt).

type replyJSON struct {
	Code     int    `json:"code,omitempty"`
	Enhanced string `json:"enhanced,omitempty"`
	Text     string `json:"text,omitempty"`
}

type explanationJSON struct {
	Meaning string `json:"meaning"`
	Fault   string `json:"fault"`
	Action  string `json:"action"`
}

// rowJSON is one recipient of one message: a line of `queue list`.
type rowJSON struct {
	ID          string     `json:"id"`   // message id
	Key         string     `json:"key"`  // id/recipient-index
	Rcpt        int        `json:"rcpt"` // recipient index
	Status      string     `json:"status"`
	Reason      string     `json:"reason,omitempty"`
	Attempts    int        `json:"attempts"`
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
	LastAttempt *time.Time `json:"last_attempt,omitempty"`
	LastReply   *replyJSON `json:"last_reply,omitempty"`
	SourceIP    string     `json:"source_ip,omitempty"`
	MXHost      string     `json:"mx_host,omitempty"`
	MXAddr      string     `json:"mx_addr,omitempty"`
	Sender      string     `json:"sender"` // "" is the null sender <>
	Recipient   string     `json:"recipient"`
	Domain      string     `json:"domain"`
	Arrival     time.Time  `json:"arrival"`
	AgeSeconds  float64    `json:"age_seconds"`
}

type listJSON struct {
	Now    time.Time `json:"now"` // the server's clock, for relative times
	Total  int       `json:"total"`
	Offset int       `json:"offset"`
	Limit  int       `json:"limit"`
	Rows   []rowJSON `json:"rows"`
}

type attemptJSON struct {
	Start    time.Time  `json:"start"`
	End      *time.Time `json:"end,omitempty"`
	SourceIP string     `json:"source_ip,omitempty"`
	MXHost   string     `json:"mx_host,omitempty"`
	MXAddr   string     `json:"mx_addr,omitempty"`
	Stage    string     `json:"stage,omitempty"`
	Outcome  string     `json:"outcome"`
	Reason   string     `json:"reason,omitempty"`
	Reply    *replyJSON `json:"reply,omitempty"`
}

type recipientJSON struct {
	rowJSON
	Notify          string           `json:"notify,omitempty"`
	ORCPT           string           `json:"orcpt,omitempty"`
	FirstAttempt    *time.Time       `json:"first_attempt,omitempty"`
	FirstGreylisted *time.Time       `json:"first_greylisted,omitempty"`
	GreylistTries   int              `json:"greylist_tries,omitempty"`
	DelayWarnings   int              `json:"delay_warnings,omitempty"`
	Explanation     *explanationJSON `json:"explanation,omitempty"`
	History         []attemptJSON    `json:"history"`
}

type messageJSON struct {
	Now        time.Time       `json:"now"`
	ID         string          `json:"id"`
	Sender     string          `json:"sender"`
	Arrival    time.Time       `json:"arrival"`
	Size       int64           `json:"size"`
	ClientAddr string          `json:"client_addr,omitempty"`
	AuthUser   string          `json:"auth_user,omitempty"`
	Helo       string          `json:"helo,omitempty"`
	RET        string          `json:"ret,omitempty"`
	EnvID      string          `json:"envid,omitempty"`
	SMTPUTF8   bool            `json:"smtputf8,omitempty"`
	EightBit   bool            `json:"8bitmime,omitempty"`
	DSN        bool            `json:"dsn,omitempty"`
	Recipients []recipientJSON `json:"recipients"`
}

type actionJSON struct {
	Action     string `json:"action"`
	Recipients int    `json:"recipients"` // how many recipients changed
}

type deadHostJSON struct {
	Host  string    `json:"host"`
	Until time.Time `json:"until"`
}

type destinationJSON struct {
	Domain              string         `json:"domain"`
	Greylists           bool           `json:"greylists"`
	GreylistSeen        int            `json:"greylist_seen"`
	GreylistPassed      int            `json:"greylist_passed"`
	LearnedDelaySeconds float64        `json:"learned_delay_seconds"`
	LastGreylisted      *time.Time     `json:"last_greylisted,omitempty"`
	ThrottleLevel       int            `json:"throttle_level"`
	ThrottledUntil      *time.Time     `json:"throttled_until,omitempty"`
	DeadHosts           []deadHostJSON `json:"dead_hosts"`
	LastReply           *replyJSON     `json:"last_reply,omitempty"`
	Updated             *time.Time     `json:"updated,omitempty"`
}

type destinationsJSON struct {
	Now          time.Time         `json:"now"`
	Destinations []destinationJSON `json:"destinations"`
}

type statsJSON struct {
	Now              time.Time      `json:"now"`
	ByStatus         map[string]int `json:"by_status"`
	ByReason         map[string]int `json:"by_reason"`
	Messages         int            `json:"messages"`
	Recipients       int            `json:"recipients"`
	Oldest           *time.Time     `json:"oldest,omitempty"`
	OldestAgeSeconds float64        `json:"oldest_age_seconds"`
	DBBytes          int64          `json:"db_bytes"`
}

type errorJSON struct {
	Error string `json:"error"`
}

func ts(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func replyOf(r queue.Reply) *replyJSON {
	if r == (queue.Reply{}) {
		return nil
	}
	return &replyJSON{Code: r.Code, Enhanced: r.Enhanced, Text: r.Text}
}

func rowOf(m *queue.Message, r *queue.Recipient, now time.Time) rowJSON {
	return rowJSON{
		ID: m.ID.String(), Key: r.Key.String(), Rcpt: r.Key.Rcpt,
		Status: string(r.Status), Reason: r.Reason, Attempts: r.Attempts,
		NextAttempt: ts(r.NextAttempt), LastAttempt: ts(r.LastAttempt), LastReply: replyOf(r.Reply),
		SourceIP: r.SourceIP, MXHost: r.MXHost, MXAddr: r.MXAddr,
		Sender: m.From, Recipient: r.Addr, Domain: r.Domain,
		Arrival: m.Arrival, AgeSeconds: now.Sub(m.Arrival).Seconds(),
	}
}

// explain describes the last reply of a recipient that has one and is not
// delivered; it returns nil otherwise.
func explain(r *queue.Recipient) *explanationJSON {
	if r.Reason == "" || r.Status == queue.Delivered || r.Status == queue.Relayed {
		return nil
	}
	e := classifier.Explain(classifier.Reason(r.Reason), r.Reply.Enhanced)
	return &explanationJSON{Meaning: e.Meaning, Fault: string(e.Fault), Action: e.Action}
}

func messageOf(m *queue.Message, now time.Time) messageJSON {
	out := messageJSON{Now: now, ID: m.ID.String(), Sender: m.From, Arrival: m.Arrival, Size: m.Size,
		ClientAddr: m.ClientAddr, AuthUser: m.AuthUser, Helo: m.Helo, RET: m.RET, EnvID: m.EnvID,
		SMTPUTF8: m.SMTPUTF8, EightBit: m.EightBit, DSN: m.DSN,
		Recipients: make([]recipientJSON, 0, len(m.Recipients))}
	for i := range m.Recipients {
		r := &m.Recipients[i]
		rj := recipientJSON{rowJSON: rowOf(m, r, now), Notify: r.Notify, ORCPT: r.ORCPT,
			FirstAttempt: ts(r.FirstAttempt), FirstGreylisted: ts(r.FirstGreylisted),
			GreylistTries: r.GreylistTries, DelayWarnings: r.DelayWarnings,
			Explanation: explain(r), History: make([]attemptJSON, 0, len(r.History))}
		for _, a := range r.History {
			rj.History = append(rj.History, attemptJSON{Start: a.Start, End: ts(a.End),
				SourceIP: a.SourceIP, MXHost: a.MXHost, MXAddr: a.MXAddr, Stage: a.Stage,
				Outcome: a.Outcome, Reason: a.Reason, Reply: replyOf(a.Reply)})
		}
		out.Recipients = append(out.Recipients, rj)
	}
	return out
}

func destinationOf(d *queue.Destination) destinationJSON {
	out := destinationJSON{Domain: d.Domain, Greylists: d.Greylists, GreylistSeen: d.GreylistSeen,
		GreylistPassed: d.GreylistPassed, LearnedDelaySeconds: d.LearnedDelay.Seconds(),
		LastGreylisted: ts(d.LastGreylisted), ThrottleLevel: d.ThrottleLevel,
		ThrottledUntil: ts(d.ThrottledUntil), DeadHosts: make([]deadHostJSON, 0, len(d.DeadHosts)),
		LastReply: replyOf(d.LastReply), Updated: ts(d.Updated)}
	for h, until := range d.DeadHosts {
		out.DeadHosts = append(out.DeadHosts, deadHostJSON{Host: h, Until: until})
	}
	sort.Slice(out.DeadHosts, func(i, j int) bool { return out.DeadHosts[i].Host < out.DeadHosts[j].Host })
	return out
}

func statsOf(st queue.Stats, dbBytes int64, now time.Time) statsJSON {
	out := statsJSON{Now: now, ByStatus: make(map[string]int, len(st.ByStatus)), ByReason: st.ByReason,
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
