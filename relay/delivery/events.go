package delivery

import (
	"github.com/greyrelay/greyrelay/relay/events"
)

// attachEvents gives each result of s the application events stored with
// it (relay/events): in the outcome's own transaction, so an event exists
// iff its outcome was stored. s.lines holds one line per result, in the
// same order (settleOne).
func (e *Engine) attachEvents(a *attempt, s *settlement) {
	if !e.opt.Events.Enabled() || len(s.lines) != len(s.u.Results) {
		return
	}
	for i := range s.u.Results {
		l := s.lines[i]
		if l.kind == postponed {
			continue // nothing happened that an application is told of
		}
		if action := l.kind.action(); action != "" {
			r, res := l.r, s.u.Results[i]
			r.Status, r.Reason, r.NextAttempt = res.Status, res.Reason, res.NextAttempt
			s.u.Results[i].Events = e.opt.Events.Operator(action, &a.msg, &r, a.body)
			continue
		}
		n := l.r.Attempts + 1
		if a.none {
			n = l.r.Attempts
		}
		s.u.Results[i].Events = e.opt.Events.Outcome(events.Outcome{Msg: a.msg, Head: a.body, Rcpt: l.r,
			Result: s.u.Results[i], Attempt: n, Status: l.status, Expired: l.expired, Suppressed: l.suppressed})
	}
}
