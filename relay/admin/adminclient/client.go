// Package adminclient talks to the admin API of a running relay
// (relay/admin) and decodes its answers into the views relay/admin defines,
// so that a view has one definition on both sides. The CLI commands
// (relay/admin/admincli) and the probe use it because the daemon holds the
// queue file's lock; another node's status page uses it (NodeStats) to
// show this node's queue.
//
// Errors: a relay that does not answer at all is an *UnreachableError
// (callers tell "not running" from "answered with an error"); an answer
// other than 2xx is an error carrying the API's {"error": ...} text and
// status code.
package adminclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/config"
)

// Client talks to the admin API of a running relay. The CLI commands use
// it because the daemon holds the queue file's lock.
type Client struct {
	Base  string       // e.g. "http://127.0.0.1:8025"; "" when the admin server is disabled
	Token string       // bearer token; "" for none
	HTTP  *http.Client // nil: a client with a 60 s timeout
}

// clientTimeout bounds one CLI request.
const (
	clientTimeout = 60 * time.Second
	maxResponse   = 256 << 20
)

// New returns a client for the admin server that c configures. An
// unspecified listen address (0.0.0.0, [::]) is reached on loopback.
func New(c *config.Config) *Client {
	cl := &Client{Token: c.Admin.Token, HTTP: &http.Client{Timeout: clientTimeout}}
	host, port, err := net.SplitHostPort(c.Admin.Address)
	if c.Admin.Address == "" || err != nil {
		return cl
	}
	if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if err == nil && ip.Is6() {
			host = "::1"
		}
	}
	cl.Base = "http://" + net.JoinHostPort(host, port)
	return cl
}

// UnreachableError says that the admin API did not answer at all: it is
// disabled (Base is "") or nothing answers at Base. Usually the relay is
// not running.
type UnreachableError struct {
	Base string // "" when the admin server is disabled
	Err  error  // why the connection failed; nil when disabled
}

func (e *UnreachableError) Error() string {
	if e.Base == "" {
		return "the admin server is disabled (admin.address is empty)"
	}
	return fmt.Sprintf("greyrelay is not reachable at %s: %v", e.Base, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// apiError is an error answer of the admin API.
type apiError struct {
	Code int
	Msg  string
}

func (e *apiError) Error() string {
	if e.Code == http.StatusUnauthorized {
		return fmt.Sprintf("%s (HTTP 401): set admin.token or admin.token_file to the relay's token", e.Msg)
	}
	return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.Code)
}

// call performs one request and returns the body of a 2xx answer. Any
// other answer becomes an *apiError carrying the server's message.
func (c *Client) call(ctx context.Context, method, path string, q url.Values) ([]byte, error) {
	resp, err := c.open(ctx, method, path, q)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, fmt.Errorf("reading the answer from %s: %w", c.Base, err)
	}
	return body, nil
}

// Ready is GET /readyz: the server's answer when it is ready to serve,
// an error otherwise.
func (c *Client) Ready(ctx context.Context) (string, error) {
	body, err := c.call(ctx, http.MethodGet, "/readyz", nil)
	return strings.TrimSpace(string(body)), err
}

// open performs one request and returns a 2xx answer with its body still
// to be read (and closed) by the caller. Any other answer becomes an
// *apiError carrying the server's message.
func (c *Client) open(ctx context.Context, method, path string, q url.Values) (*http.Response, error) {
	if c.Base == "" {
		return nil, &UnreachableError{}
	}
	u := strings.TrimRight(c.Base, "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, fmt.Errorf("admin request: %w", err)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: clientTimeout}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, &UnreachableError{Base: c.Base, Err: unwrapURL(err)}
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
		if err != nil {
			return nil, fmt.Errorf("reading the answer from %s: %w", c.Base, err)
		}
		return nil, &apiError{Code: resp.StatusCode, Msg: errorMessage(body)}
	}
	return resp, nil
}

// unwrapURL drops *url.Error's "Get \"http://…\":" prefix: the message
// already names the address.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// errorMessage extracts {"error": …} or, failing that, the text body.
func errorMessage(body []byte) string {
	var e admin.ErrorAnswer
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	if s := admin.Cell(strings.TrimSpace(string(body)), 200); s != "-" {
		return s
	}
	return "no message"
}

// getJSON fetches path and decodes its answer into out.
func (c *Client) getJSON(ctx context.Context, method, path string, q url.Values, out any) error {
	body, err := c.call(ctx, method, path, q)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("unexpected answer from %s%s: %w", c.Base, path, err)
	}
	return nil
}

// List returns one page of the recipients lq selects (GET /api/queue).
func (c *Client) List(ctx context.Context, lq admin.ListQuery) (admin.ListResult, error) {
	var l admin.ListResult
	err := c.getJSON(ctx, http.MethodGet, "/api/queue", lq.Values(), &l)
	return l, err
}

// Message returns one message with every recipient and its attempts (GET
// /api/queue/{id}).
func (c *Client) Message(ctx context.Context, id string) (admin.Message, error) {
	var m admin.Message
	err := c.getJSON(ctx, http.MethodGet, "/api/queue/"+url.PathEscape(id), nil, &m)
	return m, err
}

// Target selects the recipients of a queue action: a message id, the
// filters (every one given must match), or All alone for the whole
// queue. DryRun counts what the action would change without changing it.
type Target struct {
	ID        string
	Domain    string
	Status    queue.Status
	Reason    string
	Sender    string
	Tag       string
	OlderThan time.Duration
	All       bool
	DryRun    bool
}

// values is t's selection as the query of POST /api/queue/….
func (t Target) values() url.Values {
	q := url.Values{}
	for name, v := range map[string]string{"domain": t.Domain, "status": string(t.Status), "reason": t.Reason,
		"sender": t.Sender, "tag": t.Tag} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if t.OlderThan != 0 {
		q.Set("older_than", t.OlderThan.String())
	}
	if t.All {
		q.Set("all", "1")
	}
	if t.DryRun {
		q.Set("dry_run", "1")
	}
	return q
}

// filtered reports whether t has a filter besides ID and All.
func (t Target) filtered() bool {
	return t.Domain != "" || t.Status != "" || t.Reason != "" || t.Sender != "" || t.Tag != "" || t.OlderThan != 0
}

// Act applies action (retry, hold, release, delete, bounce or requeue) to
// the recipients t selects (POST /api/queue/…).
func (c *Client) Act(ctx context.Context, action string, t Target) (admin.ActionResult, error) {
	var path string
	switch {
	case t.All && (t.ID != "" || t.filtered()):
		return admin.ActionResult{}, errors.New("a queue action on the whole queue takes no other selection")
	case t.ID != "":
		path = "/api/queue/" + url.PathEscape(t.ID) + "/" + url.PathEscape(action)
	case t.All || t.filtered():
		path = "/api/queue/" + url.PathEscape(action)
	default:
		return admin.ActionResult{}, errors.New("a queue action needs a message id, a selection or all")
	}
	var res admin.ActionResult
	err := c.getJSON(ctx, http.MethodPost, path, t.values(), &res)
	return res, err
}

// Suspend stops delivery to domain (POST /api/destinations/suspend), for
// d (0: until Resume), saying why.
func (c *Client) Suspend(ctx context.Context, domain, reason string, d time.Duration) (admin.SuspendResult, error) {
	q := url.Values{"domain": {domain}}
	if reason != "" {
		q.Set("reason", reason)
	}
	if d != 0 {
		q.Set("for", d.String())
	}
	var res admin.SuspendResult
	err := c.getJSON(ctx, http.MethodPost, "/api/destinations/suspend", q, &res)
	return res, err
}

// Resume ends the suspension of domain (POST /api/destinations/resume).
func (c *Client) Resume(ctx context.Context, domain string) (admin.SuspendResult, error) {
	var res admin.SuspendResult
	err := c.getJSON(ctx, http.MethodPost, "/api/destinations/resume", url.Values{"domain": {domain}}, &res)
	return res, err
}

// Destinations returns what the relay learned about every destination
// (GET /api/destinations).
func (c *Client) Destinations(ctx context.Context) (admin.Destinations, error) {
	var d admin.Destinations
	err := c.getJSON(ctx, http.MethodGet, "/api/destinations", nil, &d)
	return d, err
}

// Destination returns what the relay learned about domain, or nil, nil
// when it learned nothing (GET /api/destinations/{domain} answers 404).
func (c *Client) Destination(ctx context.Context, domain string) (*admin.Destination, error) {
	d, err := c.DestinationsOf(ctx, domain)
	var ae *apiError
	if errors.As(err, &ae) && ae.Code == http.StatusNotFound {
		return nil, nil
	}
	if err != nil || len(d.Destinations) == 0 {
		return nil, err
	}
	return &d.Destinations[0], nil
}

// DestinationsOf is GET /api/destinations/{domain}: the one destination
// with the server's clock, which the CLI's relative times need; 404 is an
// error.
func (c *Client) DestinationsOf(ctx context.Context, domain string) (admin.Destinations, error) {
	var d admin.Destinations
	err := c.getJSON(ctx, http.MethodGet, "/api/destinations/"+url.PathEscape(domain), nil, &d)
	return d, err
}

// Shape counts the live recipients by destination or reason and age, as
// Postfix's qshape does (GET /api/shape).
func (c *Client) Shape(ctx context.Context, sq admin.ShapeQuery) (admin.Shape, error) {
	var sh admin.Shape
	err := c.getJSON(ctx, http.MethodGet, "/api/shape", sq.Values(), &sh)
	return sh, err
}

// Content copies a part ("headers" or "body") of a queued message's
// content to w as the server streams it, at most max octets (0: the API's
// default), and says how much of the part there was (GET
// /api/queue/{id}/headers or /body).
func (c *Client) Content(ctx context.Context, id, part string, max int64, w io.Writer) (admin.ContentInfo, error) {
	q := url.Values{}
	if max != 0 {
		q.Set("max", strconv.FormatInt(max, 10))
	}
	resp, err := c.open(ctx, http.MethodGet, "/api/queue/"+url.PathEscape(id)+"/"+url.PathEscape(part), q)
	if err != nil {
		return admin.ContentInfo{}, err
	}
	defer resp.Body.Close()
	info := admin.ContentInfo{Size: -1}
	if n, err := strconv.ParseInt(resp.Header.Get(admin.ContentSizeHeader), 10, 64); err == nil {
		info.Size = n
	}
	info.Sent, err = io.Copy(w, resp.Body)
	if err != nil {
		return info, fmt.Errorf("reading the answer from %s: %w", c.Base, err)
	}
	return info, nil
}

// Stats returns the queue's counters (GET /api/stats).
func (c *Client) Stats(ctx context.Context) (admin.Stats, error) {
	var st admin.Stats
	err := c.getJSON(ctx, http.MethodGet, "/api/stats", nil, &st)
	return st, err
}

// Forget drops what the relay learned about domain, or about every
// destination when all is set (POST /api/destinations/forget).
func (c *Client) Forget(ctx context.Context, domain string, all bool) (admin.ForgetResult, error) {
	q := url.Values{}
	switch {
	case domain != "" && !all:
		q.Set("domain", domain)
	case domain == "" && all:
		q.Set("all", "1")
	default:
		return admin.ForgetResult{}, errors.New("forget needs exactly one of a domain or all")
	}
	var res admin.ForgetResult
	err := c.getJSON(ctx, http.MethodPost, "/api/destinations/forget", q, &res)
	return res, err
}

// TLSReportSend asks the relay to send its TLS reports now and returns
// the API's JSON answer.
func (c *Client) TLSReportSend(ctx context.Context) (json.RawMessage, error) {
	var res json.RawMessage
	err := c.getJSON(ctx, http.MethodPost, "/api/tls-report/send", nil, &res)
	return res, err
}

// NodeStats returns what the admin server's Options.NodeStats asks of
// another node of the cluster: its queue's counters, asked from its admin
// API with token (the nodes share one).
func NodeStats(token string) func(ctx context.Context, n admin.ClusterNode) (admin.Stats, error) {
	return func(ctx context.Context, n admin.ClusterNode) (admin.Stats, error) {
		c := &Client{Base: n.AdminURL, Token: token, HTTP: &http.Client{Timeout: clientTimeout}}
		return c.Stats(ctx)
	}
}

// Suppressions lists the suppression list.
func (c *Client) Suppressions(ctx context.Context) (admin.Suppressions, error) {
	var s admin.Suppressions
	err := c.getJSON(ctx, http.MethodGet, "/api/suppressions", nil, &s)
	return s, err
}

// Suppress adds an address to the suppression list (scope "": every
// sender; ttl 0: the configured suppression.ttl).
func (c *Client) Suppress(ctx context.Context, addr, scope, reason string, ttl time.Duration) (admin.SuppressionResult, error) {
	q := url.Values{"address": {addr}}
	if scope != "" {
		q.Set("scope", scope)
	}
	if reason != "" {
		q.Set("reason", reason)
	}
	if ttl > 0 {
		q.Set("ttl", ttl.String())
	}
	var res admin.SuppressionResult
	err := c.getJSON(ctx, http.MethodPost, "/api/suppressions", q, &res)
	return res, err
}

// Unsuppress takes an address off the suppression list.
func (c *Client) Unsuppress(ctx context.Context, addr, scope string) (admin.SuppressionResult, error) {
	q := url.Values{"address": {addr}}
	if scope != "" {
		q.Set("scope", scope)
	}
	var res admin.SuppressionResult
	err := c.getJSON(ctx, http.MethodPost, "/api/suppressions/remove", q, &res)
	return res, err
}
