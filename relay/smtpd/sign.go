package smtpd

import (
	"bytes"
	"errors"
	"io"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/dkim"
)

// DKIM signing at intake (relay/dkim has the policy). The signatures go in
// front of the stored message, above our Received header, which they do
// not cover; they are made once, before the commit, so every delivery
// attempt sends the same ones. Without any key, refusal policy or
// authenticated user nothing here reads the message; otherwise a message
// costs one scan of its header section, and no copy unless it is signed.
//
// Who gets what signed. A signature d=example.com tells every receiver
// (DMARC, RFC 7489 §3.1) that example.com vouches for the From address, so
// the relay signs only for clients entitled to that From:
//
//   - An authenticated user's From and Sender addresses are held to the
//     same rule as MAIL FROM (senderAllowed, Users.ownedByOther): a message
//     naming an address the user may not send as is refused with 550 5.7.1
//     (foreign_header_from: refuse) or relayed unsigned (unsigned). The
//     envelope alone is not enough: MAIL FROM:<bob@b.test> with
//     From: alice@a.test would otherwise leave signed d=a.test.
//     A bounce (MAIL FROM:<>) with a foreign From is relayed unsigned
//     rather than refused: its From names the reporting MTA.
//   - A client relaying without AUTH (trusted_networks) gets signatures
//     only for the From domains dkim.trusted_clients grants its network
//     (dkim.Keys.Granted), as OpenDKIM signs only for its InternalHosts.
//   - A message nobody may have signed is treated as one whose domain has
//     no key: relayed unsigned, or refused under dkim.without_key: refuse.
//
// Bounces and DSNs the relay makes itself never pass through here.

// maxSignHead is how much of a spooled body is read to find its header
// section: what intake held in memory before spooling it.
const maxSignHead = queue.SpoolThreshold

// sign checks the header From and Sender of an authenticated user's
// message, then adds the DKIM signatures for rb's From domain when the
// client may have it signed, or refuses the message when no key signs it
// and dkim.without_key is refuse.
func (s *session) sign(env *envelope, rb readResult) (readResult, error) {
	keys := s.srv.dkim.Keys()
	authed := env.user != "" && s.srv.users != nil
	if !keys.Active() && !authed {
		return rb, nil
	}
	head := rb.body
	if rb.file != nil {
		var err error
		if head, err = readHead(rb.file); err != nil {
			s.srv.log.Error("reading the spooled body to sign it failed", zap.String("client", s.clientS), zap.Error(err))
			return rb, s.refuse(reasonStorage, replyLocalError())
		}
	}
	entitled := true
	if authed {
		whole := rb.file == nil || int64(len(head)) >= rb.file.Len()
		if foreign := s.foreignAuthor(env, head, whole); foreign != "" {
			// A bounce (MAIL FROM:<>, which the user may send, or MAIL
			// would have refused it) names its reporting MTA in From,
			// MAILER-DAEMON@its-host-name (RFC 3464 §2, RFC 5321 §4.5.5):
			// a smarthost client's bounces must still go out, so a foreign
			// From on a bounce costs only the signature.
			if s.srv.cfg.ForeignHeaderFrom != "unsigned" && env.from != "" {
				// RFC 3463 X.7.1 "Delivery not authorized, message
				// refused"; permanent: the same message would be refused
				// again.
				return rb, s.refuse(reasonSender, reply(550, 5, 7, 1,
					printable("Header "+foreign+": Sender address rejected: not owned by user "+env.user)))
			}
			s.srv.log.Info("header sender not owned by the user: relayed unsigned", zap.String("client", s.clientS),
				zap.String("user", printable(env.user)), zap.String("header", printable(foreign)))
			entitled = false
		}
	}
	if !keys.Active() {
		return rb, nil
	}
	plan, domain, err := keys.Match(head)
	if plan != nil && !authed && !keys.Granted(s.client.Addr(), domain) {
		plan = nil // a trusted network without a grant for this domain
	}
	if !entitled {
		plan = nil
	}
	if plan == nil {
		if !keys.RefuseUnsigned() {
			return rb, nil
		}
		// RFC 3463 X.7.1: not authorised. Permanent: the same message
		// would be refused again.
		text := "No DKIM key for the From domain " + domain + "; not relayed"
		switch {
		case errors.Is(err, dkim.ErrNoAuthor):
			text = "Message has no single From address to sign for; not relayed"
		case domain != "" && len(keys.For(domain)) > 0:
			text = "This client may not have the From domain " + domain + " signed; not relayed"
		}
		return rb, s.refuse(reasonDKIM, reply(550, 5, 7, 1, printable(text)))
	}
	return s.addSignatures(rb, plan, domain)
}

// foreignAuthor returns the first From or Sender address of the header
// section in head that env's user may not send as, described for the
// reply ("From <alice@a.test>"), or "" when there is none. A field that
// does not parse counts as foreign: what the relay cannot read, a receiver
// may read as someone else's address. So does a header section that does
// not end within head when head is not the whole message (whole): a From
// beyond it would go unchecked.
func (s *session) foreignAuthor(env *envelope, head []byte, whole bool) string {
	if !whole && !bytes.Contains(head, []byte("\r\n\r\n")) {
		return "From/Sender (header section too long to check)"
	}
	authors, err := dkim.Authors(head)
	if err != nil {
		return "From/Sender (not a list of addresses)"
	}
	for _, raw := range authors {
		a, err := address.Parse(raw, address.Options{SMTPUTF8: true, Sender: true, Decoded: true})
		if err != nil {
			return "From/Sender <" + raw + "> (not a valid address)"
		}
		if !senderAllowed(env.allowed, a.String(), a) || s.srv.users.ownedByOther(env.user, a) {
			return "From/Sender <" + a.String() + ">"
		}
	}
	return ""
}

// addSignatures signs rb by plan and puts the signatures in front of it.
func (s *session) addSignatures(rb readResult, plan *dkim.Plan, domain string) (readResult, error) {
	var msg io.Reader = bytes.NewReader(rb.body)
	if rb.file != nil {
		msg = io.NewSectionReader(rb.file, 0, rb.file.Len())
	}
	sig, err := plan.Sign(msg)
	if err != nil {
		s.srv.log.Error("dkim signing failed", zap.String("client", s.clientS), zap.String("domain", domain), zap.Error(err))
		return rb, s.refuse(reasonDKIM, replyLocalError())
	}
	if rb.file == nil {
		rb.body = append(sig, rb.body...)
	} else if rb, err = s.prependFile(rb, sig); err != nil {
		return rb, err
	}
	rb.size += int64(len(sig))
	return rb, nil
}

// readHead returns the start of a spooled body, which holds its header
// section.
func readHead(f *queue.BodyFile) ([]byte, error) {
	b := make([]byte, min(f.Len(), maxSignHead))
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}

// prependFile writes sig and then the spooled body into a new spool file
// (a file cannot grow at its start) and discards the old one.
func (s *session) prependFile(rb readResult, sig []byte) (readResult, error) {
	nf, err := s.srv.queue.(Spooler).CreateBody()
	if err == nil {
		if _, err = nf.Write(sig); err == nil {
			_, err = io.Copy(nf, io.NewSectionReader(rb.file, 0, rb.file.Len()))
		}
		if err != nil {
			nf.Discard()
		}
	}
	if err != nil {
		s.srv.log.Error("spooling the signed body failed", zap.String("client", s.clientS), zap.Error(err))
		return rb, s.bodyFault("", err)
	}
	rb.file.Discard()
	rb.file = nf
	return rb, nil
}
