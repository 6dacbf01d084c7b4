// Package dsn composes RFC 3464 delivery status notifications and caps how
// many of them one envelope sender may receive per hour.
//
// Design notes:
//
//   - Compose is pure and deterministic: the caller supplies the clock
//     (Report.Now), the Message-ID and every input, and the MIME boundary is
//     derived from the Message-ID. The same Report always yields the same
//     bytes, which is what the golden tests rely on.
//   - A DSN is sent from the null reverse-path to the original envelope
//     sender only, and never to "<>" (RFC 5321 §6.1: never bounce a bounce).
//     Compose refuses an empty Report.To with ErrNullSender, so a caller bug
//     cannot start a bounce loop.
//   - Everything that came from outside (the remote reply, addresses, ENVID,
//     host names, the original headers) is treated as hostile. Generated
//     header fields are reduced to one line of printable text, folded per
//     RFC 5322 §2.2.3 and capped, so the output never holds a CR, LF or NUL
//     other than our own CRLF line ends, and no line reaches 998 octets
//     (RFC 5322 §2.1.1).
//   - A DSN for a non-SMTPUTF8 message is 7-bit clean. The human part is
//     UTF-8 in quoted-printable when it holds non-ASCII text (for example a
//     remote reply in another language); machine-readable fields replace
//     non-ASCII with '?', except addresses, which become RFC 6533 "utf-8"
//     typed addresses in their utf-8-addr-xtext form. A RET=FULL original
//     whose body carries 8-bit data is returned as headers only, with a note
//     in the human part, because message/rfc822 may not be re-encoded
//     (RFC 2046 §5.2.1).
//   - A DSN for an SMTPUTF8 message (Report.UTF8) uses the RFC 6533 types
//     message/global-delivery-status, message/global-headers and
//     message/global, carries UTF-8 as 8bit and types non-ASCII addresses
//     "utf-8". It must be sent with SMTPUTF8.
//   - Recipient.Original holds the ORCPT parameter as "addr-type;address"
//     with the xtext encoding already removed, which is what go-smtp's
//     RcptOptions yields (OriginalRecipientType + ";" + OriginalRecipient).
//     Compose does not decode xtext again: a decoded address may legitimately
//     contain "+2B" (e.g. "user+2Bx@example.org"), which a second decoding
//     would corrupt. Report.EnvID is likewise the decoded ENVID, as Postfix
//     writes it in Original-Envelope-Id.
package dsn

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Action is the RFC 3464 §2.3.3 Action field of a recipient.
type Action string

// The actions a DSN can report.
const (
	Failed    Action = "failed"    // permanent failure or lifetime expired
	Delayed   Action = "delayed"   // still being retried (delay warning)
	Relayed   Action = "relayed"   // handed to a system that does not send DSNs
	Delivered Action = "delivered" // delivered (only with NOTIFY=SUCCESS)
)

// Return selects how much of the original message the DSN carries
// (RFC 3461 §4.3, the RET parameter).
type Return int

const (
	// ReturnHeaders returns the original headers only (RET=HDRS and the
	// default when RET was not given).
	ReturnHeaders Return = iota
	// ReturnFull returns the whole original message (RET=FULL), up to
	// Report.MaxReturned octets.
	ReturnFull
)

// DefaultMaxReturned is the cap on a returned original when
// Report.MaxReturned is zero, like Postfix's bounce_size_limit.
const DefaultMaxReturned = 50000

// ErrNullSender is returned by Compose when the DSN would go to the null
// reverse-path "<>" (RFC 5321 §6.1).
var ErrNullSender = errors.New("dsn: no DSN for a null sender")

// Recipient is one recipient's entry in a DSN.
type Recipient struct {
	Final          string    // Final-Recipient address, without angle brackets
	Original       string    // ORCPT as "addr-type;address", xtext-decoded; "" = none
	Action         Action    // what happened; equal for all recipients of a Report
	Status         string    // RFC 3463 code, e.g. "5.1.1" or "4.4.7"
	RemoteMTA      string    // MX host name that answered, "" if none
	Diagnostic     string    // the remote reply verbatim, e.g. "550 5.1.1 <x@y>: no such user"
	LastAttempt    time.Time // Last-Attempt-Date; zero = omit
	WillRetryUntil time.Time // Will-Retry-Until, used for Delayed only; zero = omit
	Explanation    string    // one human sentence: what it means, what to do
}

// Report is everything Compose needs to build one DSN for one message and
// one event.
type Report struct {
	ReportingMTA string      // our host name: Reporting-MTA and the From address
	To           string      // envelope sender of the original, the DSN's recipient
	EnvID        string      // Original-Envelope-Id (xtext-decoded ENVID); "" = omit
	Arrival      time.Time   // Arrival-Date; zero = omit
	Now          time.Time   // Date header
	MessageID    string      // Message-ID of the DSN, without angle brackets
	Recipients   []Recipient // all with the same Action
	Original     []byte      // original message, headers and body, CRLF
	Return       Return      // RET=HDRS (default) or RET=FULL
	MaxReturned  int         // cap on a RET=FULL original; 0 = DefaultMaxReturned
	UTF8         bool        // the original was SMTPUTF8: use RFC 6533 types
}

// part is one body part of the multipart/report: its header lines (each
// ending in CRLF) and its content (CRLF lines).
type part struct {
	header string
	body   []byte
}

// Compose builds the DSN described by r as a complete RFC 5322 message with
// CRLF line ends, ready to be sent with MAIL FROM:<> to r.To.
func Compose(r Report) ([]byte, error) {
	host, err := r.validate()
	if err != nil {
		return nil, err
	}
	ret, note := returnedPart(r)
	parts := []part{
		textPart(humanText(r, host, note)),
		statusPart(r, host),
	}
	if ret != nil {
		parts = append(parts, *ret)
	}
	boundary := pickBoundary(r.MessageID, parts)

	var b bytes.Buffer
	b.WriteString("From: Mail Delivery System <MAILER-DAEMON@" + host + ">\r\n")
	b.WriteString(field("To", "<"+cleanAddr(r.To)+">"))
	b.WriteString("Subject: " + subject(r.Recipients[0].Action) + "\r\n")
	b.WriteString("Date: " + date(r.Now) + "\r\n")
	b.WriteString(field("Message-ID", "<"+cleanMsgID(r.MessageID)+">"))
	// RFC 3834 §5: a DSN is an automatic response; auto-responders must
	// not answer it.
	b.WriteString("Auto-Submitted: auto-replied\r\n")
	b.WriteString("MIME-Version: 1.0\r\n")
	// RFC 6522 §3: multipart/report with report-type=delivery-status.
	b.WriteString("Content-Type: multipart/report; report-type=delivery-status;\r\n")
	b.WriteString("\tboundary=\"" + boundary + "\"\r\n")
	b.WriteString("\r\n")
	b.WriteString("This is a MIME-encapsulated message.\r\n")
	for _, p := range parts {
		b.WriteString("\r\n--" + boundary + "\r\n")
		b.WriteString(p.header)
		b.WriteString("\r\n")
		b.Write(p.body)
	}
	b.WriteString("\r\n--" + boundary + "--\r\n")
	return b.Bytes(), nil
}

// validate checks what Compose cannot repair and returns the sanitised
// reporting host name.
func (r Report) validate() (string, error) {
	if a := cleanAddr(r.To); a == "" {
		return "", ErrNullSender
	} else if !r.UTF8 && !isASCII(a) {
		return "", errors.New("dsn: non-ASCII sender needs Report.UTF8 (SMTPUTF8)")
	}
	host := cleanHost(r.ReportingMTA)
	if host == "" {
		return "", errors.New("dsn: empty ReportingMTA")
	}
	if cleanMsgID(r.MessageID) == "" {
		return "", errors.New("dsn: empty MessageID")
	}
	if len(r.Recipients) == 0 {
		return "", errors.New("dsn: no recipients")
	}
	action := r.Recipients[0].Action
	for i, rc := range r.Recipients {
		switch {
		case rc.Action != Failed && rc.Action != Delayed && rc.Action != Relayed && rc.Action != Delivered:
			return "", fmt.Errorf("dsn: recipient %d: unknown action %q", i, rc.Action)
		case rc.Action != action:
			return "", fmt.Errorf("dsn: recipient %d: action %q differs from %q (one DSN per event)", i, rc.Action, action)
		case cleanAddr(rc.Final) == "":
			return "", fmt.Errorf("dsn: recipient %d: empty Final address", i)
		}
	}
	return host, nil
}

// subject is the Subject line for a DSN about action.
func subject(a Action) string {
	switch a {
	case Failed:
		return "Undelivered Mail Returned to Sender"
	case Delayed:
		return "Delayed Mail (still being retried)"
	case Relayed:
		return "Relayed mail notification"
	default:
		return "Successful Mail Delivery Report"
	}
}

// date formats t as an RFC 5322 §3.3 date-time.
func date(t time.Time) string {
	return t.Format(time.RFC1123Z)
}

// pickBoundary derives the MIME boundary from the Message-ID, so the output
// is deterministic, and re-derives it in the (practically impossible) case
// that a part already contains it (RFC 2046 §5.1.1).
func pickBoundary(msgID string, parts []part) string {
	for i := 0; ; i++ {
		sum := sha256.Sum256([]byte(msgID + "\x00" + strconv.Itoa(i)))
		b := "=_dsn_" + hex.EncodeToString(sum[:16])
		clash := false
		for _, p := range parts {
			if bytes.Contains(p.body, []byte("--"+b)) {
				clash = true
				break
			}
		}
		if !clash {
			return b
		}
	}
}
