package smtpd

import (
	"errors"
	"strconv"
	"syscall"

	"github.com/emersion/go-smtp"
	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/internal/safetext"
	"github.com/greyrelay/greyrelay/relay/address"
)

// reply builds an SMTP reply. Every reply the backend gives goes through it
// (or through toReply), so the text is always one clean line.
func reply(code, class, subject, detail int, msg string) *smtp.SMTPError {
	return &smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCode{class, subject, detail}, Message: cleanText(msg)}
}

// The replies used in more than one place, each with its justification.

// replyShutdown: RFC 5321 §3.8 lets a server close with 421 at any time;
// RFC 3463 X.3.2 "System not accepting network messages".
func replyShutdown() *smtp.SMTPError {
	return reply(421, 4, 3, 2, "Service shutting down, try again later")
}

// replyLocalError: RFC 5321 §4.2.3 "451 Requested action aborted: local
// error in processing"; RFC 3463 X.3.0. Storage trouble is temporary: the
// client keeps the message and retries (never 5xx, never 250).
func replyLocalError() *smtp.SMTPError {
	return reply(451, 4, 3, 0, "Local error in processing, try again later")
}

// replyDataTimeout: a 4xx (the client keeps the message) and a closed
// connection, so no later body line is read as a command; RFC 3463 X.4.2 "Bad connection".
func replyDataTimeout() *smtp.SMTPError {
	return reply(451, 4, 4, 2, "Timeout reading message data, closing connection")
}

// replyNoStorage: RFC 5321 §4.2.3 "452 insufficient system storage";
// RFC 3463 X.3.1 "Mail system full".
func replyNoStorage() *smtp.SMTPError { return reply(452, 4, 3, 1, "Insufficient system storage") }

// toReply is the one place where an error becomes an SMTP reply (go-smtp
// type-asserts, so a wrapped *smtp.SMTPError would lose its
// code and a plain error would become 554 5.0.0 with our text in it).
// Anything unknown is a temporary local error (maddy's rule).
func toReply(err error) *smtp.SMTPError {
	var se *smtp.SMTPError
	if errors.As(err, &se) {
		return &smtp.SMTPError{Code: se.Code, EnhancedCode: se.EnhancedCode, Message: cleanText(se.Message)}
	}
	var ae *address.Error
	if errors.As(err, &ae) {
		return reply(ae.Code, ae.Enhanced[0], ae.Enhanced[1], ae.Enhanced[2], ae.Msg)
	}
	// The free-space check at MAIL and at the end of DATA cannot see every
	// commit coming: a disk that fills during the commit is the same
	// condition and gets the same reply.
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return replyNoStorage()
	}
	return replyLocalError()
}

// refusalReason is why intake refused something: the reason label of
// greyrelay_intake_rejections_total and of the "refused" log line. Only the
// constants below are used, so the metric's label set is fixed.
type refusalReason string

// Refusal reasons.
const (
	reasonAuth        refusalReason = "auth"        // AUTH failed, is required or is not offered
	reasonData        refusalReason = "data"        // bad message data (NUL, an over-long line, a read error)
	reasonDKIM        refusalReason = "dkim"        // no DKIM key for the message, or signing failed
	reasonLiteral     refusalReason = "literal"     // mail to an address literal
	reasonLoop        refusalReason = "loop"        // too many Received headers: a mail loop
	reasonQueue       refusalReason = "queue"       // the queue could not store the message
	reasonRecipients  refusalReason = "recipients"  // too many recipients
	reasonRelay       refusalReason = "relay"       // relaying denied
	reasonSender      refusalReason = "sender"      // a sender the client may not use
	reasonSequence    refusalReason = "sequence"    // a command out of sequence
	reasonShutdown    refusalReason = "shutdown"    // the server is shutting down
	reasonSize        refusalReason = "size"        // a message over the size limit
	reasonSmuggling   refusalReason = "smuggling"   // a stray CR with bare_cr: reject
	reasonStorage     refusalReason = "storage"     // no free disk space, or a local storage error
	reasonSyntax      refusalReason = "syntax"      // a malformed command or address
	reasonSuppressed  refusalReason = "suppressed"  // a recipient on the suppression list
	reasonUserLimit   refusalReason = "user-limit"  // over an identity's user_limits
	reasonTimeout     refusalReason = "timeout"     // message data slower than min_data_rate
	reasonConnections refusalReason = "connections" // over a connection cap
	reasonJunk        refusalReason = "junk"        // too many commands that did nothing
)

// refuseCutShort refuses a command that is only the start of an over-long
// line (conn.cutShort); nil when the command is whole.
func (s *session) refuseCutShort() *smtp.SMTPError {
	if !s.conn.cutShort() {
		return nil
	}
	// RFC 5321 §4.5.3.1.4: the command line limit; go-smtp's own wording.
	return s.refuse(reasonSyntax, reply(500, 5, 4, 0, "Too long line, closing connection"))
}

// refuse turns err into the reply to give, and logs and counts it. reason
// is one of the refusal reasons above.
func (s *session) refuse(reason refusalReason, err error) *smtp.SMTPError {
	r := toReply(err)
	class := "5xx"
	if r.Code/100 == 4 {
		class = "4xx"
	}
	s.srv.metrics.Rejected.WithLabelValues(class, string(reason)).Inc()
	level := zap.DebugLevel
	if reason == reasonRelay || reason == reasonAuth || reason == reasonQueue || reason == reasonStorage {
		level = zap.InfoLevel
	}
	fields := []zap.Field{zap.String("client", s.clientS), zap.String("reply", formatReply(r)),
		zap.String("reason", string(reason))}
	if r.Code/100 == 4 && reason == "queue" {
		fields = append(fields, zap.Error(err)) // our own error, not client data
	}
	s.srv.log.Log(level, "refused", fields...)
	return r
}

// refuseAndClose is refuse for replies after which the connection ends.
func (s *session) refuseAndClose(reason refusalReason, err error) *smtp.SMTPError {
	s.conn.closeAfterReply()
	return s.refuse(reason, err)
}

func formatReply(r *smtp.SMTPError) string {
	e := r.EnhancedCode
	return strconv.Itoa(r.Code) + " " + strconv.Itoa(e[0]) + "." + strconv.Itoa(e[1]) + "." +
		strconv.Itoa(e[2]) + " " + r.Message
}

// cleanText makes s safe as reply text: go-smtp splits replies on "\n"
// and would send a CR as is, so control characters (C1 included) and
// invalid UTF-8 become spaces, and the text is cut to 400 octets.
func cleanText(s string) string { return safetext.Replace(safetext.Cut(s, 400), ' ') }

// printable escapes control characters and invalid UTF-8 in client-supplied
// text before it reaches a log line, and bounds its length.
func printable(s string) string { return safetext.Escape(s, 512) }
