package admin

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/suppress"
)

// SuppressionList is the suppression list as the admin API serves it
// (*suppress.List implements it):
//
//	GET  /api/suppressions                         the entries in force
//	POST /api/suppressions?address=A[&scope=D][&reason=R][&ttl=DUR]  add one
//	POST /api/suppressions/remove?address=A[&scope=D]               take one off
type SuppressionList interface {
	List() ([]suppress.Entry, error)
	Put(suppress.Entry) error
	Remove(scope, addr string) error
}

// Suppressions is GET /api/suppressions.
type Suppressions struct {
	Now     time.Time        `json:"now"`
	Entries []suppress.Entry `json:"entries"`
}

// SuppressionResult answers an addition or removal.
type SuppressionResult struct {
	Action string         `json:"action"`
	Entry  suppress.Entry `json:"entry"`
}

func (s *Server) suppressions(w http.ResponseWriter, r *http.Request) {
	es, err := s.opt.Suppressions.List()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, Suppressions{Now: s.opt.Now(), Entries: es})
}

func (s *Server) suppressAdd(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	e := suppress.Entry{Address: strings.TrimSpace(q.Get("address")), Scope: strings.TrimSpace(q.Get("scope")),
		Reason: q.Get("reason"), Since: s.opt.Now().UTC()}
	if e.Reason == "" {
		e.Reason = "operator"
	}
	if v := q.Get("ttl"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			s.fail(w, r, badf("ttl: %q is not a positive duration like 720h", v))
			return
		}
		e.Expires = e.Since.Add(d)
	}
	if err := s.opt.Suppressions.Put(e); err != nil {
		s.fail(w, r, badf("%v", err))
		return
	}
	s.log.Info("address suppressed by the operator", zap.String("address", e.Address), zap.String("scope", e.Scope),
		zap.String("remote", r.RemoteAddr))
	writeJSON(w, http.StatusOK, SuppressionResult{Action: "suppress", Entry: e})
}

func (s *Server) suppressRemove(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	e := suppress.Entry{Address: strings.TrimSpace(q.Get("address")), Scope: strings.TrimSpace(q.Get("scope"))}
	err := s.opt.Suppressions.Remove(e.Scope, e.Address)
	if errors.Is(err, suppress.ErrNotFound) {
		writeError(w, http.StatusNotFound, err)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("suppression removed by the operator", zap.String("address", e.Address), zap.String("scope", e.Scope),
		zap.String("remote", r.RemoteAddr))
	writeJSON(w, http.StatusOK, SuppressionResult{Action: "remove", Entry: e})
}
