package smtpd

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/config"
)

// Suppressions says which recipients are refused at RCPT: addresses whose
// mail failed permanently for a reason about the address (relay/suppress).
// Refusing them at the door, rather than accepting and bouncing, tells the
// client at once and sends nothing to a destination that already said the
// mailbox does not exist. With suppression.action "bounce" they are
// accepted instead, for applications that read bounces rather than SMTP
// replies, and the delivery engine fails them at once.
type Suppressions interface {
	// Suppressed returns when mail from sender to rcpt was suppressed and
	// the reply that caused it, if it is.
	Suppressed(sender, rcpt string) (since time.Time, reply string, ok bool)
}

// checkSuppressed refuses a suppressed recipient: 550 5.1.1, as the
// destination answered (RFC 3463 X.1.1 "Bad destination mailbox
// address"), with the date and the reply, so the sender can tell a
// suppression from a fresh refusal.
func (s *session) checkSuppressed(env *envelope, a address.Address) error {
	if s.srv.suppress == nil || a.Domain == "" {
		return nil
	}
	since, rep, ok := s.srv.suppress.Suppressed(env.from, a.String())
	if !ok {
		return nil
	}
	if s.srv.cfg.Suppression.Action == config.SuppressBounce {
		// Accepted: the delivery engine fails it at once, with a DSN
		// naming the suppression (relay/delivery, suppressed.go).
		s.srv.log.Info("recipient suppressed: accepted, to be bounced", zap.String("client", s.clientS),
			zap.String("rcpt", printable(a.String())), zap.Time("since", since))
		return nil
	}
	s.srv.log.Info("recipient suppressed", zap.String("client", s.clientS), zap.String("rcpt", printable(a.String())),
		zap.Time("since", since))
	r := reply(550, 5, 1, 1, "<"+a.String()+">: Recipient address suppressed since "+
		since.UTC().Format(time.DateOnly)+": "+rep)
	if s.srv.onRefused != nil {
		s.srv.onRefused(Refusal{From: env.from, Rcpt: a.String(), Reason: string(reasonSuppressed), Code: r.Code,
			Enhanced: fmt.Sprintf("%d.%d.%d", r.EnhancedCode[0], r.EnhancedCode[1], r.EnhancedCode[2]),
			Text:     r.Message, Time: s.srv.now()})
	}
	return s.refuse(reasonSuppressed, r)
}

// Refusal is a recipient refused for being suppressed, as
// Options.OnRefused is told of it (for the refused event).
type Refusal struct {
	From, Rcpt, Reason string
	Code               int
	Enhanced, Text     string
	Time               time.Time
}
