package admin

import (
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/config"
)

// maxSuspendReason bounds the operator's words stored with a suspension
// and shown on every view of it.
const maxSuspendReason = 200

// suspendDomain reads and canonicalises the domain=D of a suspend or
// resume: a suspension is kept under the form recipients are queued
// under, so every spelling of a name (case, trailing dot, U-labels)
// suspends the same mail.
func suspendDomain(r *http.Request) (string, error) {
	raw := strings.TrimSpace(r.URL.Query().Get("domain"))
	if raw == "" {
		return "", badf("give domain=D")
	}
	d, err := address.CanonicalDomain(raw)
	if err != nil || strings.HasPrefix(d, "[") {
		return "", badf("%q is not a domain name", raw)
	}
	return d, nil
}

// suspend handles POST /api/destinations/suspend?domain=D[&reason=TEXT][&for=DUR].
func (s *Server) suspend(w http.ResponseWriter, r *http.Request) {
	dom, err := suspendDomain(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	reason := strings.TrimSpace(q.Get("reason"))
	if len(reason) > maxSuspendReason || strings.ContainsFunc(reason, unicode.IsControl) {
		s.fail(w, r, badf("reason: at most %d characters, no control characters", maxSuspendReason))
		return
	}
	now := s.opt.Now()
	var until time.Time
	if v := q.Get("for"); v != "" {
		d, err := config.ParseDuration(v)
		if err != nil || d <= 0 {
			s.fail(w, r, badf("for: %q is not a positive duration like 30m, 2h or 2d", v))
			return
		}
		until = now.Add(d)
	}
	if s.opt.Engine == nil {
		writeError(w, http.StatusServiceUnavailable, errors.New("suspend is not available: no delivery engine"))
		return
	}
	sp, err := s.opt.Engine.Suspend(dom, reason, until, now)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("destination suspended", zap.String("domain", dom), zap.String("reason", reason),
		zap.Time("until", until), zap.String("remote", r.RemoteAddr))
	writeJSON(w, http.StatusOK, SuspendResult{Action: "suspend", Domain: dom, Suspension: suspensionOf(sp)})
}

// resume handles POST /api/destinations/resume?domain=D.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	dom, err := suspendDomain(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if s.opt.Engine == nil {
		writeError(w, http.StatusServiceUnavailable, errors.New("resume is not available: no delivery engine"))
		return
	}
	was, n, err := s.opt.Engine.Resume(dom, s.opt.Now())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("destination resumed", zap.String("domain", dom), zap.Bool("was_suspended", was),
		zap.Int("recipients", n), zap.String("remote", r.RemoteAddr))
	writeJSON(w, http.StatusOK, SuspendResult{Action: "resume", Domain: dom, WasSuspended: was, Recipients: n})
}

// SuspendedText says what a suspension means for the mail it holds, for
// the next-attempt column and the destinations list: "suspended until
// resumed" or "suspended for 2h", with the operator's reason.
func SuspendedText(s *Suspension, now time.Time) string {
	out := "suspended until resumed"
	if s.Until != nil {
		out = "suspended, resumes " + RelTime(*s.Until, now)
	}
	if s.Reason != "" {
		out += " (" + s.Reason + ")"
	}
	return out
}
