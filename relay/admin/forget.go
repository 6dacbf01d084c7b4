package admin

import (
	"errors"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/address"
)

// ForgetResult is the answer to POST /api/destinations/forget.
type ForgetResult struct {
	Action       string `json:"action"`       // "forget"
	Destinations int    `json:"destinations"` // how many destinations changed
}

// forget handles POST /api/destinations/forget?domain=D or ?all=1: the
// engine drops what it learned (greylisting, throttling, dead hosts), in
// memory and in the queue. Exactly one selector is required, as for queue
// actions, so that a forgotten parameter never clears everything.
func (s *Server) forget(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	dom, all := strings.TrimSpace(q.Get("domain")), q.Get("all")
	isAll := all == "1" || all == "true"
	if (dom == "") == (all == "") || (all != "" && !isAll) {
		s.fail(w, r, badf("give exactly one of domain=D or all=1"))
		return
	}
	if s.opt.Engine == nil {
		writeError(w, http.StatusServiceUnavailable, errors.New("forget is not available: no delivery engine"))
		return
	}
	if dom != "" {
		dom = address.DomainKey(dom) // destinations are kept under it
	}
	n, err := s.opt.Engine.Forget(dom, isAll, s.opt.Now())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sel := "domain " + dom
	if isAll {
		sel = "all"
	}
	s.log.Info("destinations forgotten", zap.String("selector", sel), zap.Int("destinations", n),
		zap.String("remote", r.RemoteAddr))
	writeJSON(w, http.StatusOK, ForgetResult{Action: "forget", Destinations: n})
}
