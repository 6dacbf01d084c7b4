package delivery

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
)

// transact sends rcpts over s: one transaction for all of them, then, if
// the peer refused some with "too many recipients" while accepting others,
// follow-up transactions for those right away on the same connection (RFC
// 5321 §4.5.3.1.10; the first one completed, so no RSET goes between).
// Each transaction's definite outcomes are settled before the next starts.
// t is s's target as the message's own TLS policy shapes it (s.t for the
// message that opened s, session.rides for a later one): the attempt
// records the rule that applied to this message. It returns s if it can
// be reused, and what is left for the next host when the connection failed
// before some recipients got their answer.
func (e *Engine) transact(ctx context.Context, d *dest, a *attempt, s *session, t target, rcpts []queue.Recipient) (*session, leftover) {
	a.t, a.tried, a.relay = t, t, s.relay
	for round := 0; ; round++ {
		res, err := send(ctx, s, envelope(a.msg, rcpts), e.opt.Events.Wire(a.body))
		s.count++
		a.peerDSN = res.DSN
		if res.NoRequireTLS {
			// RFC 8689 §4.2.1: this host cannot take a REQUIRETLS message
			// but the next MX may; the 5.7.30 holds only when none can.
			e.closeSession(ctx, s)
			return nil, leftover{rcpts: rcpts, v: e.opt.Classifier.Classify(smtpvocab.StageMAIL, &res.Mail), noRequireTLS: true}
		}
		jd := e.judge(rcpts, res, err, round < maxFollowUps)
		outs := jd.outs
		if ctx.Err() != nil {
			outs = definite(outs) // the rest stays Active and is recovered
		}
		e.settleAttempt(d, a, outs)
		if err != nil {
			e.closeSession(ctx, s)
			return nil, jd.rest
		}
		if len(jd.again) == 0 {
			return s, leftover{}
		}
		rcpts = jd.again
	}
}

// send runs one transaction on s. The body may be a mapped spool file
// (queue.OpenBody), where an I/O error while reading it is a memory fault
// (SIGBUS), not an error: it is turned into a panic for this goroutine
// only (debug.SetPanicOnFault) and then into a connection-level error, so
// that a bad sector defers the message instead of killing the relay at
// every start.
func send(ctx context.Context, s *session, env smtpclient.Envelope, body []byte) (res smtpclient.TxResult, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if _, fault := r.(interface{ Addr() uintptr }); !fault {
			panic(r)
		}
		s.c.Close() // left in the middle of DATA
		err = &smtpclient.Error{Stage: smtpvocab.StageDATA, Err: fmt.Errorf("reading the queued message failed: %v", r)}
	}()
	return s.c.Send(ctx, env, body)
}

// judgement is what one transaction decided.
type judgement struct {
	outs  []outcome         // definite outcomes, to store now
	again []queue.Recipient // refused as "too many recipients": for a follow-up transaction
	rest  leftover          // no answer yet: the connection failed first; for the next host
}

// judge turns one transaction's replies into per-recipient outcomes.
// Recipients refused with "too many recipients" go to again when followUp
// is allowed and the transaction delivered to someone (progress);
// otherwise they are deferred like any 4xx. When the connection failed
// (an *smtpclient.Error: 421, I/O error, timeout), a recipient without a
// definite answer goes to rest: one never asked, one answered with the
// 421, and one accepted at RCPT whose data did not get through. A
// recipient whose data was sent in full but whose final reply never came
// may have been delivered (RFC 1047), so it is deferred instead of being
// offered to another host at once.
func (e *Engine) judge(rs []queue.Recipient, res smtpclient.TxResult, err error, followUp bool) judgement {
	var jd judgement
	var errV classifier.Verdict
	if err != nil {
		errV = e.classifyErr(smtpvocab.StageMAIL, err)
		jd.rest.v = errV
	}
	var se *smtpclient.Error
	connFailed := errors.As(err, &se)
	end := txEnd{data: res.Data, errV: errV, inline: res.Inline,
		lostAfterDot: connFailed && se.Stage == smtpvocab.StageEndOfData && res.Data == nil}
	if res.Mail.Code >= 400 && res.Mail.Code != 421 {
		// MAIL refused: one verdict for everyone (a 5xx at MAIL bounces all).
		jd.outs = outcomesOf(rs, e.opt.Classifier.Classify(smtpvocab.StageMAIL, &res.Mail))
		return jd
	}
	var tooMany []outcome
	for i, r := range rs {
		var rep smtpvocab.Reply
		if i < len(res.Rcpts) {
			rep = res.Rcpts[i].Reply
		}
		o, answered := e.judgeOne(r, rep, end)
		switch {
		case !answered && connFailed:
			jd.rest.rcpts = append(jd.rest.rcpts, r)
		case answered && tooManyRecipients(rep):
			tooMany = append(tooMany, o)
		default:
			jd.outs = append(jd.outs, o)
		}
	}
	delivered := res.Data != nil && res.Data.Code/100 == 2
	if followUp && delivered && err == nil {
		for _, o := range tooMany {
			jd.again = append(jd.again, o.r)
		}
		return jd
	}
	jd.outs = append(jd.outs, tooMany...)
	return jd
}

// txEnd is how a transaction's DATA phase ended, for judgeOne.
type txEnd struct {
	data         *smtpvocab.Reply   // the final reply; nil if none
	errV         classifier.Verdict // the verdict on the transaction's error, if any
	lostAfterDot bool               // the whole body went out and the final reply never came
	inline       bool               // the body went out with MAIL and RCPT (smtpclient.TxResult.Inline)
}

// judgeOne decides the recipient r whose RCPT got rep (zero if none) in a
// transaction that ended as end says. answered is false when r has no
// definite answer (see judge); o then carries end.errV.
func (e *Engine) judgeOne(r queue.Recipient, rep smtpvocab.Reply, end txEnd) (o outcome, answered bool) {
	o = outcome{r: r, v: end.errV}
	data := end.data
	switch {
	case rep.Code == 0 && end.inline && end.lostAfterDot:
		// Its RCPT went out with the whole body and no reply came back:
		// as with a lost reply to the final dot, the peer may have it
		// (RFC 1047). Deferred, not offered to the next MX.
		return o, true
	case rep.Code == 0 || rep.Code == 421: // never asked, or the server closed instead of answering
		return o, false
	case rep.Code/100 != 2:
		o.v = e.opt.Classifier.Classify(smtpvocab.StageRCPT, &rep)
	case data == nil: // accepted at RCPT; the DATA phase failed
		return o, end.lostAfterDot
	case data.Code/100 == 2:
		o.ok, o.reply = true, *data
	case data.Code == 421:
		return o, false
	default:
		o.v = e.opt.Classifier.Classify(smtpvocab.StageEndOfData, data)
	}
	return o, true
}

// tooManyRecipients recognises RFC 5321 §4.5.3.1.10's "too many
// recipients": 452 (or the historical 552) at RCPT, with enhanced code
// X.5.3 or none. A 452 4.2.2 (mailbox full) is an ordinary deferral.
func tooManyRecipients(r smtpvocab.Reply) bool {
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
