package delivery

import (
	"github.com/greyrelay/greyrelay/queue"
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
		n := l.r.Attempts + 1
		if a.none {
			n = l.r.Attempts
		}
		s.u.Results[i].Events = e.opt.Events.Outcome(events.Outcome{Msg: a.msg, Head: a.body, Rcpt: l.r,
			Result: s.u.Results[i], Attempt: n, Status: l.status, Expired: l.expired, Suppressed: l.suppressed})
	}
}

// attachBounceEvents gives the results of an operator's bounce (u.Results,
// one per recipient of rs, in order) their bounced events.
func (e *Engine) attachBounceEvents(msg queue.Message, body []byte, rs []queue.Recipient, u *queue.Update) {
	if !e.opt.Events.Enabled() || len(rs) != len(u.Results) {
		return
	}
	for i := range u.Results {
		u.Results[i].Events = e.opt.Events.Outcome(events.Outcome{Msg: msg, Head: body, Rcpt: rs[i],
			Result: u.Results[i], Attempt: rs[i].Attempts, Status: BounceStatus})
	}
}
