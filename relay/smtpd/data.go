package smtpd

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/emersion/go-smtp"
	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
)

// Message data policy.
//
//   - End of data is CRLF.CRLF only, as go-smtp finds it. Impostors
//     such as LF.LF or CR.CR stay inside the message, so at most one
//     transaction results from any smuggling attempt.
//   - A bare LF is taken as a line end and stored as CRLF (RFC 5321 §2.3.8
//     says lines end in CRLF; Postfix smtpd_forbid_bare_newline=normalize).
//   - A stray CR (not followed by LF) becomes a space with bare_cr:
//     normalize (Postfix cleanup_replace_stray_cr_lf). With bare_cr: reject
//     the message is refused with 521 5.5.2 and the connection closed
//     (chasquid). go-smtp drops the CR of CRLF.CR<x> and does not end data
//     on CR CRLF.CRLF; both leave a stray CR we then see and handle.
//   - NUL is refused with 554 5.6.0 (as mox does; RFC 2045 §2.8 and
//     RFC 6152 do not allow NUL even in 8-bit data, and a downstream MTA
//     that drops NULs could see an end-of-data that we did not).
//   - Lines of any length are accepted, up to the message size (Postfix
//     takes them too; lines.go), and stored unchanged, not split:
//     splitting would break DKIM signatures. They are folded when sent,
//     as Postfix does (delivery.line_length_limit).
//   - Size: go-smtp's reader checks max_message_bytes before it can see
//     the final dot, so a body of exactly that size gets 552 5.3.4; the
//     largest body accepted is one octet less (SIZE= up to the limit is
//     accepted at MAIL). The normalised body is held to the same limit.
//   - Every failure is answered only after the whole body was read (the
//     session stays in sync), except read errors, after which the
//     connection is closed so that no body line is ever read as a
//     command (go-smtp would answer 554 and read on).
//
// Nothing stored contains a CR or LF outside a CRLF pair, and the body
// always ends with CRLF (a BDAT body may not).

// Data reads the message, checks it and commits it to the queue; only then
// does it answer 250 with the queue id.
func (s *session) Data(r io.Reader) error {
	s.conn.productive()
	if refusal := s.refuseCutShort(); refusal != nil {
		return refusal
	}
	_, bdat := r.(*io.PipeReader)
	s.srv.inData.Add(1)
	defer s.srv.endData()
	s.conn.beginData(!bdat)
	defer s.conn.endData()
	if s.conn.isDraining() {
		s.conn.stop() // the rest of the body is not read: 421 then close
		return s.refuse(reasonShutdown, replyShutdown())
	}
	s.mu.Lock()
	env := s.env
	s.mu.Unlock()
	if env == nil || len(env.rcpts) == 0 {
		return s.refuse(reasonSequence, reply(503, 5, 5, 1, "RCPT first"))
	}
	if !bdat && s.smtpConn != nil {
		// go-smtp's reader is replaced when it may be (body.go).
		if fr := s.conn.fastBody(s.srv.cfg.Limits.MaxMessageBytes); fr != nil {
			r = fr
		}
	}
	buf := s.srv.getDataBuf()
	defer s.srv.putDataBuf(buf) // Enqueue has returned: nothing refers to it
	rb, err := s.readBody(r, buf, s.receivedInfo(env), env.size)
	if err != nil {
		return err
	}
	final := s.srv.now() // the final dot
	if err := s.checkBody(rb); err != nil {
		rb.discard()
		return err
	}
	if rb, err = s.sign(env, rb); err != nil {
		rb.discard()
		return err
	}
	return s.commit(env, rb, final)
}

// checkBody applies the checks made once the whole body is in.
func (s *session) checkBody(rb readResult) error {
	if rb.received > s.srv.cfg.Limits.MaxReceivedHeaders {
		// RFC 5321 §6.3 loop detection; RFC 3463 X.4.6 "Routing loop detected".
		return s.refuse(reasonLoop, reply(554, 5, 4, 6, "Too many Received headers (mail loop)"))
	}
	// A body kept in memory took little time and no disk space: the check
	// may reuse a young measurement, as at MAIL. A spooled one may have
	// taken long and has written to the disk: measure again.
	return s.checkDisk(rb.file == nil)
}

func (s *session) receivedInfo(env *envelope) receivedInfo {
	ri := receivedInfo{helo: env.helo, heloOK: env.heloOK, heloSafe: env.heloSafe, ip: s.client.Addr(),
		host: s.srv.hostSafe, tls: s.tlsState, auth: env.user != "", smtputf8: env.utf8, date: s.srv.now()}
	if len(env.rcpts) == 1 {
		ri.rcpt = env.rcpts[0].Addr
	}
	return ri
}

// commit enqueues the message and builds the 250 reply.
func (s *session) commit(env *envelope, rb readResult, final time.Time) error {
	msg := queue.NewMessage{
		From: env.from, To: env.rcpts, Body: rb.body, File: rb.file, Arrival: final,
		ClientAddr: s.clientIP, AuthUser: env.user, Helo: env.heloSafe,
		RET: env.ret, EnvID: env.envID, SMTPUTF8: env.utf8, EightBit: env.eightBit || rb.eightBit,
		// RFC 8689 §5: REQUIRETLS wins over a TLS-Required field.
		RequireTLS: env.requireTLS, TLSOptional: rb.tlsOptional && !env.requireTLS,
	}
	withNames(&msg, rb)
	id, err := s.srv.queue.Enqueue(msg)
	if err != nil {
		rb.discard()
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			// The queue keeps its disk reserve (queue.reserve_percent), or
			// the disk filled during the commit: the same condition as
			// the free-space check's, and the same reply.
			return s.refuse(reasonStorage, replyNoStorage())
		}
		s.srv.log.Error("enqueue failed", zap.String("client", s.clientS), zap.Error(err))
		return s.refuse(reasonQueue, replyLocalError())
	}
	s.srv.metrics.IntakeLatency.Observe(s.srv.now().Sub(final).Seconds())
	idS := id.String()
	s.mu.Lock()
	s.queued = idS
	s.mu.Unlock()
	s.accepted(env, idS, int(rb.size))
	s.countUser(env)
	s.conn.forgiveJunk()
	return reply(250, 2, 0, 0, "OK queued as "+idS)
}

func (s *session) accepted(env *envelope, id string, size int) {
	m := s.srv.metrics
	m.Accepted.Inc()
	m.AcceptedBytes.Add(float64(size))
	s.mu.Lock()
	first := !s.submitted
	s.submitted = true
	s.mu.Unlock()
	if first {
		label := "no"
		if s.tlsState != nil {
			label = "yes"
		}
		m.TLSIn.WithLabelValues(label).Inc()
	}
	from := env.from
	if from == "" {
		from = "<>"
	}
	s.srv.log.Info("accepted", zap.String("queue_id", id), zap.String("client", s.clientS),
		zap.String("user", printable(env.user)), zap.String("from", printable(from)),
		zap.Int("rcpts", len(env.rcpts)), zap.Int("size", size), zap.Bool("tls", s.tlsState != nil))
}

// readBody reads r to its end: the Received header ri describes, then the
// normalised body, into buf.body or, past queue.SpoolThreshold, into a
// spool file written as the data arrives, so a large message never sits
// whole in memory (20 sessions of 10 MiB took the heap to hundreds of MiB
// and bbolt's mapping to gigabytes). A refusal is returned as the reply
// to give.
func (s *session) readBody(r io.Reader, buf *dataBuf, ri receivedInfo, declared int64) (readResult, error) {
	s.sizeBodyBuf(buf, declared)
	hdr := appendReceived(buf.body[:0], ri)
	n := normalizer{out: hdr, base: len(hdr),
		max: s.srv.cfg.Limits.MaxMessageBytes, rejectCR: s.srv.cfg.BareCR == config.BareCRReject}
	sp := bodySpill{q: s.srv.queue}
	for {
		k, err := r.Read(buf.read)
		s.conn.dataTaken(k)
		n.write(buf.read[:k])
		sp.maybeSpill(&n)
		if err == io.EOF {
			break
		}
		if err != nil {
			sp.discard()
			return readResult{}, s.readFailed(err)
		}
	}
	n.finish()
	sp.flush(&n)
	buf.body = n.out // it may have grown
	if err := s.bodyFault(n.fault, sp.err); err != nil {
		sp.discard()
		return readResult{}, err
	}
	head := sp.head
	if sp.file == nil {
		head = scanHeader(n.out[n.base:])
	}
	rb := readResult{size: n.total(), eightBit: n.eightBit, received: head.received,
		tlsOptional: head.tlsOptional, file: sp.file}
	if sp.file == nil {
		rb.body = n.out
	}
	return rb, nil
}

// sizeBodyBuf gives buf.body room for the body the client declared with
// SIZE= (capped at the limit, and at what is held before spooling), so a
// large message is read into one allocation instead of a chain of
// doublings that leaves twice its size behind for the collector.
func (s *session) sizeBodyBuf(buf *dataBuf, declared int64) {
	want := int64(bodyBufSize)
	if declared > bodyBufSize-receivedRoom {
		// A little room for bare LFs that become CRLF.
		want = receivedRoom + min(declared+declared/64, s.srv.cfg.Limits.MaxMessageBytes+1024)
	}
	if _, ok := s.srv.queue.(Spooler); ok {
		want = min(want, queue.SpoolThreshold+readBufSize+receivedRoom)
	}
	if int64(cap(buf.body)) < want {
		buf.body = make([]byte, 0, want)
	}
}

// bodyFault turns what went wrong while reading into the reply to give.
func (s *session) bodyFault(fault string, spoolErr error) error {
	switch fault {
	case faultBareCR:
		// chasquid's reply; RFC 3463 X.5.2 syntax error. 521 closes.
		return s.refuseAndClose(reasonSmuggling, reply(521, 5, 5, 2, "Bare CR in message data is not accepted, closing connection"))
	case faultNUL:
		return s.refuse(reasonData, reply(554, 5, 6, 0, "NUL in message data is not accepted"))
	case faultSize:
		return s.refuse(reasonSize, reply(552, 5, 3, 4, "Maximum message size exceeded"))
	}
	if spoolErr != nil {
		// Never 5xx for our own storage trouble: the client keeps the
		// message and tries again.
		s.srv.log.Error("spooling the body failed", zap.String("client", s.clientS), zap.Error(spoolErr))
		if errors.Is(spoolErr, syscall.ENOSPC) {
			return s.refuse(reasonStorage, replyNoStorage())
		}
		return s.refuse(reasonStorage, replyLocalError())
	}
	return nil
}

// dataBuf is the memory one Data call works in. Server.dataBufs keeps it
// between messages: allocated fresh, the two buffers were nearly all the
// garbage the intake made (64 KiB for a 4 KiB message). The body is handed
// to Queue.Enqueue, which must not keep it after it returns.
type dataBuf struct {
	read []byte // what go-smtp's reader fills
	body []byte // the Received header and the normalised body
}

const (
	readBufSize   = 32 << 10
	receivedRoom  = 1 << 10 // more than the Received header needs
	bodyBufSize   = 32<<10 + receivedRoom
	maxPooledBody = 256 << 10 // larger buffers are left to the collector
)

// getDataBuf takes a dataBuf from the pool; readBody sizes its body.
func (s *Server) getDataBuf() *dataBuf {
	if b, ok := s.dataBufs.Get().(*dataBuf); ok {
		return b
	}
	return &dataBuf{read: make([]byte, readBufSize)}
}

// putDataBuf returns b to the pool, without a body buffer too large to
// keep around.
func (s *Server) putDataBuf(b *dataBuf) {
	if cap(b.body) > maxPooledBody {
		b.body = nil
	}
	b.body = b.body[:0]
	s.dataBufs.Put(b)
}

// readFailed picks the reply for an error reading the body.
func (s *session) readFailed(err error) error {
	var se *smtp.SMTPError
	var ne net.Error
	switch {
	case errors.As(err, &se) && se.Code == 552:
		// go-smtp's 552 5.3.4: it reads the rest of the body itself, under
		// our data-rate deadline, and the session goes on.
		return s.refuse(reasonSize, err)
	case errors.As(err, &se):
		// The connection's own sticky reply: 421 4.3.2 from Shutdown.
		return s.refuseAndClose(reasonShutdown, err)
	case errors.Is(err, smtp.ErrTooLongLine):
		// RFC 5321 §4.5.3.1: "500 Line too long"; X.6.0 content error.
		return s.refuseAndClose(reasonData, reply(500, 5, 6, 0, "Line too long, closing connection"))
	case errors.Is(err, smtp.ErrDataReset):
		return s.refuse(reasonData, reply(451, 4, 3, 0, "Message transfer aborted"))
	case errors.As(err, &ne) && ne.Timeout():
		return s.refuseAndClose(reasonTimeout, replyDataTimeout())
	}
	return s.refuseAndClose(reasonData, reply(451, 4, 4, 2, "Error reading message data, closing connection"))
}
