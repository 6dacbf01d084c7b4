package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Knowledge is step 5: what the running relay learned about the
// destination and what it holds for it. The JSON names are the admin API's.
type Knowledge struct {
	Destination *Destination `json:"destination"` // nil: nothing learned yet
	Queued      []Queued     `json:"queued"`      // live recipients (a sample; see QueuedTotal)
	QueuedTotal int          `json:"queued_total"`
}

// Destination is the admin API's view of one destination domain.
type Destination struct {
	Greylists           bool       `json:"greylists"`
	GreylistSeen        int        `json:"greylist_seen"`
	GreylistPassed      int        `json:"greylist_passed"`
	LearnedDelaySeconds float64    `json:"learned_delay_seconds"`
	LastGreylisted      *time.Time `json:"last_greylisted,omitempty"`
	ThrottleLevel       int        `json:"throttle_level"`
	ThrottledUntil      *time.Time `json:"throttled_until,omitempty"`
	DeadHosts           []DeadHost `json:"dead_hosts"`
	LastReply           *Reply     `json:"last_reply,omitempty"`
	Updated             *time.Time `json:"updated,omitempty"`
}

// DeadHost is a host the relay skips until Until.
type DeadHost struct {
	Host  string    `json:"host"`
	Until time.Time `json:"until"`
}

// Reply is a stored SMTP reply.
type Reply struct {
	Code     int    `json:"code,omitempty"`
	Enhanced string `json:"enhanced,omitempty"`
	Text     string `json:"text,omitempty"`
}

// Queued is one live recipient for the destination, as GET /api/queue lists it.
type Queued struct {
	ID          string     `json:"id"`
	Recipient   string     `json:"recipient"`
	Sender      string     `json:"sender"`
	Status      string     `json:"status"`
	Reason      string     `json:"reason,omitempty"`
	Attempts    int        `json:"attempts"`
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
	LastReply   *Reply     `json:"last_reply,omitempty"`
	MXHost      string     `json:"mx_host,omitempty"`
	SourceIP    string     `json:"source_ip,omitempty"`
	Arrival     time.Time  `json:"arrival"`
}

// ErrNotRunning says that the relay's admin API did not answer.
var ErrNotRunning = errors.New("relay not running")

// maxQueued is how many recipients per status a probe lists.
const maxQueued = 20

// AdminKnown returns an Options.Known that asks a running relay's admin API
// (base such as "http://127.0.0.1:8025", bearer token or "") with GET
// /api/destinations/{domain} and GET /api/queue?domain=D. The queue file is
// locked by the daemon, so this is the only way in. An unreachable API is
// ErrNotRunning.
func AdminKnown(base, token string, hc *http.Client) func(ctx context.Context, domain string) (*Knowledge, error) {
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	a := adminAPI{base: strings.TrimRight(base, "/"), token: token, hc: hc}
	return a.known
}

type adminAPI struct {
	base, token string
	hc          *http.Client
}

func (a adminAPI) known(ctx context.Context, domain string) (*Knowledge, error) {
	if a.base == "" {
		return nil, fmt.Errorf("%w: the admin API is disabled (admin.address is empty)", ErrNotRunning)
	}
	k := &Knowledge{Queued: []Queued{}}
	var d struct {
		Destinations []Destination `json:"destinations"`
	}
	found, err := a.get(ctx, "/api/destinations/"+url.PathEscape(domain), nil, &d)
	if err != nil {
		return nil, err
	}
	if found && len(d.Destinations) > 0 {
		k.Destination = &d.Destinations[0]
	}
	// The live states: what is still to be delivered.
	for _, st := range []string{"deferred", "queued", "active", "held"} {
		var l struct {
			Total int      `json:"total"`
			Rows  []Queued `json:"rows"`
		}
		q := url.Values{"domain": {domain}, "status": {st}, "limit": {fmt.Sprint(maxQueued)}}
		if _, err := a.get(ctx, "/api/queue", q, &l); err != nil {
			return nil, err
		}
		k.Queued = append(k.Queued, l.Rows...)
		k.QueuedTotal += l.Total
	}
	return k, nil
}

// get fetches path into out; a 404 is (false, nil).
func (a adminAPI) get(ctx context.Context, path string, q url.Values, out any) (bool, error) {
	u := a.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, fmt.Errorf("admin API: %w", err)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return false, fmt.Errorf("%w (admin API at %s: %v)", ErrNotRunning, a.base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	switch {
	case err != nil:
		return false, fmt.Errorf("admin API %s: %w", path, err)
	case resp.StatusCode == http.StatusNotFound:
		return false, nil
	case resp.StatusCode/100 != 2:
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		return false, fmt.Errorf("admin API %s: HTTP %d: %s", path, resp.StatusCode, e.Error)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return false, fmt.Errorf("admin API %s: unexpected answer: %w", path, err)
	}
	return true, nil
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
