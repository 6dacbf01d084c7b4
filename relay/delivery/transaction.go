package delivery

import (
	"context"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
)

// transact sends j over s: one transaction for all its recipients, then,
// if the peer refused some with "too many recipients" while accepting
// others, follow-up transactions for those right away on the same
// connection (RFC 5321 §4.5.3.1.10). Each transaction's outcomes are
// stored before the next starts. It returns s if it can be reused.
func (e *Engine) transact(ctx context.Context, d *dest, j *job, a *attempt, s *session) *session {
	a.t, a.tried, a.relay = s.t, s.t, s.relay
	rcpts := j.rcpts
	for round := 0; ; round++ {
		if round > 0 {
			if err := s.c.Reset(); err != nil {
				e.settle(d, a, outcomesOf(rcpts, e.classifyErr(classifier.StageMAIL, err)))
				e.closeSession(ctx, s)
				return nil
			}
		}
		res, err := s.c.Send(ctx, envelope(a.msg, rcpts), a.body)
		s.count++
		a.peerDSN = res.DSN
		outs, again := e.judge(rcpts, res, err, round < maxFollowUps)
		if ctx.Err() != nil {
			outs = definite(outs) // the rest stays Active and is recovered
		}
		e.settle(d, a, outs)
		if err != nil {
			e.closeSession(ctx, s)
			return nil
		}
		if len(again) == 0 {
			return s
		}
		rcpts = again
	}
}

// judge turns one transaction's replies into per-recipient outcomes.
// Recipients refused with "too many recipients" are returned in again when
// followUp is allowed and the transaction delivered to someone (progress);
// otherwise they are deferred like any 4xx.
func (e *Engine) judge(rs []queue.Recipient, res smtpclient.TxResult, err error, followUp bool) (outs []outcome, again []queue.Recipient) {
	var errV classifier.Verdict
	if err != nil {
		errV = e.classifyErr(classifier.StageMAIL, err)
	}
	if res.Mail.Code >= 400 {
		// MAIL refused: one verdict for everyone (a 5xx at MAIL bounces all).
		return outcomesOf(rs, e.opt.Classifier.Classify(classifier.StageMAIL, &res.Mail)), nil
	}
	delivered := res.Data != nil && res.Data.Code/100 == 2
	var tooMany []outcome
	for i, r := range rs {
		o := outcome{r: r}
		switch {
		case i >= len(res.Rcpts): // never answered: the connection failed first
			o.v = errV
		case res.Rcpts[i].Reply.Code/100 != 2:
			rep := res.Rcpts[i].Reply
			o.v = e.opt.Classifier.Classify(classifier.StageRCPT, &rep)
			if tooManyRecipients(rep) {
				tooMany = append(tooMany, o)
				continue
			}
		case delivered:
			o.ok, o.reply = true, *res.Data
		case res.Data != nil:
			o.v = e.opt.Classifier.Classify(classifier.StageEndOfData, res.Data)
		default: // accepted at RCPT, but the DATA phase failed
			o.v = errV
		}
		outs = append(outs, o)
	}
	if followUp && delivered && err == nil {
		for _, o := range tooMany {
			again = append(again, o.r)
		}
		return outs, again
	}
	return append(outs, tooMany...), nil
}

// tooManyRecipients recognises RFC 5321 §4.5.3.1.10's "too many
// recipients": 452 (or the historical 552) at RCPT, with enhanced code
// X.5.3 or none. A 452 4.2.2 (mailbox full) is an ordinary deferral.
func tooManyRecipients(r classifier.Reply) bool {
	if r.Code != 452 && r.Code != 552 {
		return false
	}
	return r.Enhanced == "" || r.Enhanced == "4.5.3" || r.Enhanced == "5.5.3"
}

// definite keeps the outcomes that rest on a reply from the peer, for a
// transaction cut short by shutdown.
func definite(outs []outcome) []outcome {
	var keep []outcome
	for _, o := range outs {
		if o.ok || o.v.Code != 0 {
			keep = append(keep, o)
		}
	}
	return keep
}
