package smtpd

import (
	"bytes"
	"errors"
	"io"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dkim"
)

// DKIM signing at intake (relay/dkim has the policy). The signatures go in
// front of the stored message, above our Received header, which they do
// not cover; they are made once, before the commit, so every delivery
// attempt sends the same ones. Without any key or refusal policy nothing
// here reads the message; with keys, a message whose From domain has none
// costs one scan of its header section and no copy.

// maxSignHead is how much of a spooled body is read to find its header
// section: what intake held in memory before spooling it.
const maxSignHead = queue.SpoolThreshold

// sign adds the DKIM signatures for rb's From domain, or refuses the
// message when no key signs it and dkim.without_key is refuse.
func (s *session) sign(rb readResult) (readResult, error) {
	keys := s.srv.dkim.Keys()
	if !keys.Active() {
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
	plan, domain, err := keys.Match(head)
	if plan == nil {
		if !keys.RefuseUnsigned() {
			return rb, nil
		}
		// RFC 3463 X.7.1: not authorised. Permanent: the same message
		// would be refused again.
		text := "No DKIM key for the From domain " + domain + "; not relayed"
		if errors.Is(err, dkim.ErrNoAuthor) {
			text = "Message has no single From address to sign for; not relayed"
		}
		return rb, s.refuse(reasonDKIM, reply(550, 5, 7, 1, printable(text)))
	}
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
