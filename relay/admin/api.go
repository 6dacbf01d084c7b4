package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/config"
)

// Paging bounds for GET /api/queue: a page is rendered in one response, so
// it is capped; the total is always reported.
const (
	DefaultLimit = 100
	MaxLimit     = 10000
)

// badRequest marks errors caused by the request (HTTP 400).
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func badf(format string, a ...any) error { return &badRequest{fmt.Sprintf(format, a...)} }

// statusOf maps an error to an HTTP status: the request's fault, the
// queue's typed errors, or 500.
func statusOf(err error) int {
	var br *badRequest
	switch {
	case errors.As(err, &br), errors.Is(err, queue.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, queue.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, queue.ErrState):
		return http.StatusConflict
	case errors.Is(err, queue.ErrClosed), errors.As(err, new(*queue.UnsettledError)):
		// Unsettled: a message the database does not hold, while it
		// cannot take the accepted ones (a full disk), may be among them.
		return http.StatusServiceUnavailable
	case noSpace(err):
		// RFC 4918 §11.5: the write needs room the queue's disk lacks;
		// it was not done, and may be tried again once deliveries have
		// freed some.
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// noSpace reports whether err is a full disk (or a file size or quota
// limit, which stands for one).
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EDQUOT)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = EncodeJSON(w, v) // the client went away; nothing to do
}

// EncodeJSON writes v as the API answers it; `-json` in the CLI prints
// with it too.
func EncodeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // served as JSON with nosniff; keeps replies readable
	return enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, ErrorAnswer{Error: err.Error()})
}

// fail answers an error and logs the ones that are not the client's fault.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := statusOf(err)
	if code >= 500 {
		s.log.Error("admin request failed", zap.String("path", r.URL.Path), zap.Error(err))
	}
	writeError(w, code, err)
}

// parseFilter reads the list filters of GET /api/queue.
func parseFilter(q url.Values, now time.Time) (queue.Filter, error) {
	f := queue.Filter{Status: queue.Status(q.Get("status")), Reason: q.Get("reason"),
		Domain: q.Get("domain"), Sender: q.Get("sender"), Tag: q.Get("tag"), EnvID: q.Get("envid"),
		MessageID: q.Get("message_id"), Limit: DefaultLimit}
	if f.Domain != "" {
		f.Domain = address.DomainKey(f.Domain) // recipients are queued under it
	}
	if f.Status != "" && !slices.Contains(statuses(), f.Status) {
		return f, badf("unknown status %q (want queued, deferred, active, held, delivered, relayed or failed)", f.Status)
	}
	if f.Reason != "" && !slices.Contains(classifier.Reasons(), classifier.Reason(f.Reason)) {
		return f, badf("unknown reason %q (want one of %s)", f.Reason, reasonList())
	}
	if s := q.Get("older_than"); s != "" {
		d, err := config.ParseDuration(s)
		if err != nil || d < 0 {
			return f, badf("older_than: %q is not a duration like 30m, 2h or 2d", s)
		}
		f.ArrivedBefore = now.Add(-d)
	}
	var err error
	if f.Offset, err = intParam(q, "offset", 0, 0, 1<<31-1); err != nil {
		return f, err
	}
	if f.Limit, err = intParam(q, "limit", DefaultLimit, 1, MaxLimit); err != nil {
		return f, err
	}
	return f, nil
}

// reasonList names every reason a recipient can have, for an error that
// shows the operator what to type instead of a typo that matches nothing.
func reasonList() string {
	var names []string
	for _, r := range classifier.Reasons() {
		names = append(names, string(r))
	}
	return strings.Join(names, ", ")
}

func intParam(q url.Values, name string, def, lo, hi int) (int, error) {
	s := q.Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, badf("%s: %q is not a number from %d to %d", name, s, lo, hi)
	}
	return n, nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	now := s.opt.Now()
	f, err := parseFilter(r.URL.Query(), now)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out, err := s.local.list(f, now)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func parseID(s string) (queue.ID, error) {
	id, err := queue.ParseID(s)
	if err != nil || id == 0 {
		return 0, badf("%q is not a queue id (hex, as shown by queue list)", s)
	}
	return id, nil
}

func (s *Server) show(w http.ResponseWriter, r *http.Request) {
	m, err := s.local.Message(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// Actions names the queue actions, in the order usage texts list them.
var Actions = []string{"retry", "hold", "release", "delete", "bounce", "requeue"}

func (s *Server) actionOne(w http.ResponseWriter, r *http.Request) {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sel, err := parseSelector(r.URL.Query(), s.opt.Now(), false)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sel.ID = id
	s.act(w, r, r.PathValue("action"), sel)
}

// actionMany handles POST /api/queue/{action} with a selection: all=1, or
// one or more of the filters (domain, status, reason, sender, tag,
// older_than). At least one is required, so that a forgotten parameter
// never acts on the whole queue.
func (s *Server) actionMany(w http.ResponseWriter, r *http.Request) {
	sel, err := parseSelector(r.URL.Query(), s.opt.Now(), true)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.act(w, r, r.PathValue("action"), sel)
}

// parseSelector reads the selection of an action: the filters GET
// /api/queue takes (validated the same way), tag, all and dry_run. With
// need, a selection is required: all=1 alone or at least one filter.
func parseSelector(q url.Values, now time.Time, need bool) (queue.Selector, error) {
	for name := range q {
		if !slices.Contains([]string{"domain", "status", "reason", "sender", "older_than", "tag", "all", "dry_run"}, name) {
			return queue.Selector{}, badf("unknown parameter %q (want domain, status, reason, sender, tag, older_than, all or dry_run)", name)
		}
	}
	f, err := parseFilter(q, now)
	if err != nil {
		return queue.Selector{}, err
	}
	sel := queue.Selector{Domain: strings.TrimSpace(f.Domain), Status: f.Status, Reason: f.Reason, Sender: f.Sender,
		ArrivedBefore: f.ArrivedBefore, Tag: q.Get("tag")}
	if sel.DryRun, err = boolParam(q, "dry_run"); err != nil {
		return sel, err
	}
	if sel.All, err = boolParam(q, "all"); err != nil {
		return sel, err
	}
	filtered := sel.Domain != "" || sel.Status != "" || sel.Reason != "" || sel.Sender != "" ||
		!sel.ArrivedBefore.IsZero() || sel.Tag != ""
	switch {
	case sel.All && (filtered || !need):
		return sel, badf("all=1 selects the whole queue and takes no other selection")
	case need && !sel.All && !filtered:
		return sel, badf("give a selection (domain, status, reason, sender, tag, older_than) or all=1")
	}
	return sel, nil
}

// boolParam reads a flag parameter: absent, "1"/"true" or "0"/"false".
func boolParam(q url.Values, name string) (bool, error) {
	switch v := q.Get(name); v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	default:
		return false, badf("%s: %q is not 1 or 0", name, v)
	}
}

func (s *Server) act(w http.ResponseWriter, r *http.Request, action string, sel queue.Selector) {
	now := s.opt.Now()
	var n int
	var err error
	eng := s.opt.Engine
	switch action {
	case "retry":
		if eng != nil && !sel.DryRun {
			n, err = eng.Retry(sel, now)
		} else {
			n, err = s.opt.Queue.Retry(sel, now)
		}
	case "hold", "release", "delete":
		n, err = s.operate(action, sel, now)
	case "requeue":
		if eng != nil && !sel.DryRun {
			n, err = eng.Requeue(sel, now)
		} else {
			n, err = s.opt.Queue.Requeue(sel, now, RecipientDomain, nil)
		}
	case "bounce":
		switch {
		case sel.DryRun:
			n, err = bounceable(s.opt.Queue, sel)
		case eng == nil:
			writeError(w, http.StatusServiceUnavailable, errors.New("bounce is not available: no delivery engine"))
			return
		default:
			n, err = eng.Bounce(sel, now)
		}
	default:
		writeError(w, http.StatusNotFound, fmt.Errorf("unknown action %q (want %s)", action, strings.Join(Actions, ", ")))
		return
	}
	var unsettled Unsettled
	if sel.ID == 0 { // by ID, an unsettled message is one the action could not reach
		unsettled, err = unsettledOf(err) // a full disk: done on what the database holds
	}
	switch {
	case noSpace(err):
		// Not done for want of room (507, as statusOf explains), also
		// when the message is one the full disk keeps out of the database.
		s.log.Warn("queue action not done: the queue's disk is full", zap.String("action", action),
			zap.String("selector", selString(sel)), zap.Error(err))
		writeError(w, http.StatusInsufficientStorage, err)
		return
	case err != nil:
		s.fail(w, r, err)
		return
	}
	if eng != nil && !sel.DryRun && (action == "retry" || action == "release" || action == "requeue") && n > 0 {
		eng.Kick()
	}
	if !sel.DryRun {
		s.log.Info("queue action", zap.String("action", action), zap.String("selector", selString(sel)),
			zap.Int("recipients", n), zap.String("remote", r.RemoteAddr))
	}
	writeJSON(w, http.StatusOK, ActionResult{Action: action, Recipients: n, DryRun: sel.DryRun, Unsettled: unsettled})
}

// operate holds, releases or deletes sel: through the engine, which
// reports each change as an outcome, unless there is none or sel is a dry
// run (which changes nothing, so reports nothing).
func (s *Server) operate(action string, sel queue.Selector, now time.Time) (int, error) {
	reason := map[string]string{"hold": queue.ReasonHeld, "release": queue.ReasonReleased, "delete": queue.ReasonDeleted}[action]
	if eng := s.opt.Engine; eng != nil && !sel.DryRun {
		return eng.Operate(reason, sel, now)
	}
	return s.opt.Queue.Operate(reason, sel, now, nil)
}

// bounceable counts the recipients a bounce of sel would fail: those
// Engine.Bounce fails (live, not in flight).
func bounceable(q *queue.Queue, sel queue.Selector) (int, error) {
	rs, err := q.Select(sel)
	n := 0
	for _, r := range rs {
		if r.Status != queue.Active {
			n++
		}
	}
	return n, err
}

// RecipientDomain is the canonical domain of a recipient address (the
// part after its last "@"), as requeue recomputes it.
func RecipientDomain(addr string) string {
	i := strings.LastIndexByte(addr, '@')
	if i < 0 {
		return ""
	}
	return address.DomainKey(addr[i+1:])
}

func selString(sel queue.Selector) string {
	if sel.All {
		return "all"
	}
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, name+" "+v)
		}
	}
	if sel.ID != 0 {
		add("id", sel.ID.String())
	}
	add("domain", sel.Domain)
	add("status", string(sel.Status))
	add("reason", sel.Reason)
	add("sender", sel.Sender)
	add("tag", sel.Tag)
	if !sel.ArrivedBefore.IsZero() {
		add("arrived before", sel.ArrivedBefore.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, ", ")
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	st, err := s.opt.Queue.Stats()
	unsettled, err := unsettledOf(err) // a full disk: the database's counts, and what they lack
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := statsOf(st, s.opt.Queue.DBSize(), s.opt.Now())
	out.Unsettled = unsettled
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) destinations(w http.ResponseWriter, r *http.Request) {
	out, err := s.local.Destinations(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) destination(w http.ResponseWriter, r *http.Request) {
	dom := address.DomainKey(r.PathValue("domain")) // destinations are kept under it
	d, err := s.local.Destination(r.Context(), dom)
	if err == nil && d == nil {
		err = fmt.Errorf("nothing learned about %q yet: %w", dom, queue.ErrNotFound)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, Destinations{Now: s.opt.Now(), Destinations: []Destination{*d}})
}
