package smtpd

import (
	"crypto/tls"
	"io"
	"net/netip"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/relay/config"
)

// The HTTP sending API's way in. A message posted over HTTP goes through
// the very methods an authenticated SMTP session runs (Mail, Rcpt, Data),
// in a session that has no SMTP connection under it: the same address
// parsing, allowed-sender and ownership rules, REQUIRETLS and TLS-Required
// handling, size limit, Received header, DKIM signature, disk-space checks
// and durable Enqueue, and the same refusals, counted and logged the same
// way. A rule added to the SMTP door is thereby added to the HTTP door.

// Submission is one message handed in through the HTTP door.
type Submission struct {
	Client  netip.AddrPort       // the HTTP client
	TLS     *tls.ConnectionState // nil over plain HTTP
	User    string               // the authenticated identity (the token's name)
	Allowed []string             // its allowed senders (nil: any nobody else lists)
	From    string               // the envelope sender; "" is <>
	To      []string             // the envelope recipients
	Mail    smtp.MailOptions     // SMTPUTF8, 8BITMIME, ENVID, RET, REQUIRETLS as on MAIL FROM
	Body    io.Reader            // the message (RFC 5322), read to its end
}

// Submit takes one message in as an SMTP session would take it after AUTH,
// and returns its queue id once the queue has it on disk. A refusal is the
// *smtp.SMTPError the SMTP door would have answered.
func (s *Server) Submit(sub Submission) (string, error) {
	sess := &session{srv: s, lis: &listenerInfo{mode: config.ModeSubmission},
		conn: &conn{lim: s.lim}, client: sub.Client, tlsState: sub.TLS,
		user: sub.User, allowed: sub.Allowed}
	sess.clientS, sess.clientIP = sess.client.String(), sess.client.Addr().String()
	// The name in the Received header: the client's address literal,
	// which is all HTTP tells about the client.
	sess.greeted = "[" + sess.client.Addr().String() + "]"
	if a := sess.client.Addr(); a.Is6() && !a.Is4In6() {
		sess.greeted = "[IPv6:" + a.String() + "]"
	}
	mail := sub.Mail
	if err := sess.Mail(sub.From, &mail); err != nil {
		return "", err
	}
	for _, to := range sub.To {
		if err := sess.Rcpt(to, nil); err != nil {
			return "", err
		}
	}
	// Data answers with its reply, 250 included.
	if err := sess.Data(sub.Body); err != nil {
		if se, ok := err.(*smtp.SMTPError); !ok || se.Code != 250 {
			return "", err
		}
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.queued, nil
}
