package delivery

import (
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
)

// Suppressed recipients accepted and bounced (suppression.action
// "bounce").
//
// With that action intake accepts a recipient on the suppression list
// (the client sees 250, as from a relay that learns of the failure only
// later), and the first attempt of its message fails it at once, without
// a connection: a permanent failure whose reply names the suppression
// (550 5.1.1, RFC 3463 X.1.1 "bad destination mailbox address", as the
// destination answered), settled like any other, so it gets its RFC 3464
// DSN, its bounced event, its log line and its counter. A recipient whose
// address was suppressed while its message waited in the queue fails the
// same way at its next attempt.

// bounceSuppressed takes the suppressed recipients out of j and fails
// them. j keeps the others.
func (e *Engine) bounceSuppressed(d *dest, j *job, msg queue.Message, body []byte) {
	if e.opt.Suppressed == nil {
		return
	}
	verdicts := map[queue.Key]classifier.Verdict{}
	var keep, gone []queue.Recipient
	for _, r := range j.rcpts {
		since, reason, reply, ok := e.opt.Suppressed(msg.From, r.Addr)
		if !ok {
			keep = append(keep, r)
			continue
		}
		gone = append(gone, r)
		verdicts[r.Key] = suppressedVerdict(r.Addr, since, reason, reply)
	}
	if len(gone) == 0 {
		return
	}
	j.rcpts = keep
	sj := &job{id: j.id, domain: j.domain, want: j.want, rcpts: gone, fresh: j.fresh}
	a := &attempt{msg: msg, body: body, start: e.now()}
	if !e.begin(sj, a, target{}, 1) {
		return
	}
	outs := make([]outcome, len(sj.rcpts))
	for i, r := range sj.rcpts {
		outs[i] = outcome{r: r, v: verdicts[r.Key]}
	}
	e.settleAttempt(d, a, outs)
}

// suppressedVerdict is the failure of a recipient on the suppression list:
// the reply intake gives it with suppression.action "refuse", with the
// entry's reason added, so the DSN names the suppression whole (date,
// reason, the reply that caused it).
func suppressedVerdict(rcpt string, since time.Time, reason, reply string) classifier.Verdict {
	if reply == "" {
		reply = "no reply (added by the operator)"
	}
	text := "<" + rcpt + ">: Recipient address suppressed since " + since.UTC().Format(time.DateOnly) +
		" (reason: " + reason + "): " + strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' || r == 0 {
			return ' '
		}
		return r
	}, reply)
	if len(text) > maxVerdictText {
		text = strings.ToValidUTF8(text[:maxVerdictText], "")
	}
	return classifier.Verdict{Outcome: classifier.Failed, Reason: classifier.Suppressed, Stage: smtpvocab.StageRCPT,
		Code: 550, Enhanced: "5.1.1", Text: text}
}

// maxVerdictText is the longest text a Verdict carries.
const maxVerdictText = 512
