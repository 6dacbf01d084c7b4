// Package sendapi is the HTTP sending API: applications post a message,
// as JSON or as an RFC 5322 message with its envelope, with a bearer
// token, and get 202 with its queue id once the queue has it on disk.
//
// It takes no decision about a message itself. Every message goes through
// smtpd.Server.Submit, the intake an authenticated SMTP session uses, so
// the size limit, allowed senders, DKIM, REQUIRETLS, the Received header,
// events and the durable commit are the SMTP door's; this package turns
// HTTP into a submission and the SMTP reply into an HTTP status
// (httpStatus): never a 2xx unless the queue took the message.
//
// Tokens live in the same directory as the users (smtpd.Users), so a
// token's sender list and the ownership of addresses work as for SMTP AUTH,
// and a SIGHUP reload applies to both.
package sendapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/mail"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/emersion/go-smtp"
	"go.uber.org/zap"
	"golang.org/x/net/netutil"

	"github.com/greyrelay/greyrelay/internal/safetext"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/smtpd"
)

// Submitter takes a message in; *smtpd.Server implements it.
type Submitter interface {
	Submit(smtpd.Submission) (string, error)
}

// Options configure New. All but Logger and Now are required.
type Options struct {
	Config *config.Config
	Intake Submitter
	Users  *smtpd.Users // the directory holding the tokens
	// Find, if set, looks in the queue and its history for a message that
	// user submitted with messageID since the given time, for a request
	// whose earlier attempt a crash interrupted (idem.go).
	Find   func(user, messageID string, since time.Time) (queueID string, found bool, err error)
	Logger *zap.Logger
	Now    func() time.Time
}

// Server is the sending API's HTTP server.
type Server struct {
	cfg    *config.Config
	intake Submitter
	users  *smtpd.Users
	log    *zap.Logger
	now    func() time.Time
	idem   *idemStore
	find   func(user, messageID string, since time.Time) (string, bool, error)
	http   *http.Server
	stop   chan struct{}
	done   chan struct{}
}

// IdempotencyFile is where the idempotency records are kept: beside the
// queue, so they share its disk and its backups.
func IdempotencyFile(c *config.Config) string {
	return filepath.Join(filepath.Dir(c.Queue.Path), "idempotency.db")
}

// New opens the idempotency store. It binds nothing.
func New(opt Options) (*Server, error) {
	if opt.Config == nil || opt.Intake == nil || opt.Users == nil {
		return nil, errors.New("sendapi: Config, Intake and Users are required")
	}
	s := &Server{cfg: opt.Config, intake: opt.Intake, users: opt.Users, log: opt.Logger, now: opt.Now, find: opt.Find,
		stop: make(chan struct{}), done: make(chan struct{})}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.now == nil {
		s.now = time.Now
	}
	idem, err := openIdem(IdempotencyFile(s.cfg), s.cfg.API.IdempotencyTTL)
	if err != nil {
		return nil, err
	}
	s.idem = idem
	return s, nil
}

// route is one of the API's routes; docs/openapi.yaml describes each.
type route struct {
	method, path string
	handle       http.HandlerFunc
}

func (s *Server) routes() []route {
	return []route{{"POST", "/api/v1/messages", s.send}}
}

// Handler serves the API's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, r := range s.routes() {
		mux.HandleFunc(r.method+" "+r.path, r.handle)
	}
	return mux
}

// Start binds api.address and serves it (HTTPS with a certificate).
func (s *Server) Start() error {
	a := s.cfg.API
	ln, err := net.Listen("tcp", a.Address)
	if err != nil {
		return fmt.Errorf("sendapi: listen %s: %w", a.Address, err)
	}
	if a.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(a.TLSCert, a.TLSKey)
		if err != nil {
			ln.Close()
			return fmt.Errorf("sendapi: %w", err)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}
	// As many connections as the SMTP listeners take in all: enough for
	// any application, and a bound for clients that open and hold them.
	ln = netutil.LimitListener(ln, s.cfg.Limits.MaxConnections)
	s.http = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 10 * time.Minute, WriteTimeout: 10 * time.Minute, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, ErrorLog: zap.NewStdLog(s.log)}
	go s.http.Serve(ln)
	go s.pruneLoop()
	s.log.Info("sending API listening", zap.String("address", ln.Addr().String()), zap.Bool("tls", a.TLSCert != ""))
	return nil
}

// Shutdown stops taking requests and waits for those under way (each
// either gets its 202 after the commit or its refusal), then closes the
// idempotency store. The queue must stay open until it returns.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	if s.http != nil {
		err = s.http.Shutdown(ctx)
		close(s.stop)
		<-s.done
	}
	return errors.Join(err, s.idem.close())
}

// pruneLoop forgets expired idempotency keys every hour.
func (s *Server) pruneLoop() {
	defer close(s.done)
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := s.idem.prune(s.now()); err != nil {
			s.log.Warn("pruning idempotency keys failed", zap.Error(err))
		} else if n > 0 {
			s.log.Debug("idempotency keys expired", zap.Int("keys", n))
		}
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// Receipt is the 202 answer.
type Receipt struct {
	QueueID    string      `json:"queue_id"`
	MessageID  string      `json:"message_id,omitempty"`
	Recipients []Recipient `json:"recipients"`
}

// Recipient is one recipient's place in the queue.
type Recipient struct {
	Address string `json:"address"`
	QueueID string `json:"queue_id"`
}

// apiError is the body of every refusal.
type apiError struct {
	Error string `json:"error"`
	SMTP  string `json:"smtp,omitempty"` // the SMTP door's reply for the same refusal
}

// maxIdempotencyKey bounds the Idempotency-Key header.
const maxIdempotencyKey = 255

func (s *Server) send(w http.ResponseWriter, r *http.Request) {
	user, allowed, ok := s.authenticate(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="greyrelay"`)
		writeJSON(w, http.StatusUnauthorized, apiError{Error: "missing or unknown bearer token"})
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if len(key) > maxIdempotencyKey || !utf8.ValidString(key) || strings.ContainsFunc(key, safetext.IsControl) {
		writeJSON(w, http.StatusBadRequest, apiError{Error: "Idempotency-Key: at most 255 printable characters"})
		return
	}
	body, err := s.readRequest(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	sub, messageID, err := s.submission(r, body)
	if err != nil {
		writeError(w, err)
		return
	}
	sub.User, sub.Allowed = user, allowed
	if key == "" {
		status, answer := s.submit(sub, messageID)
		writeAnswer(w, status, answer)
		return
	}
	s.sendOnce(w, r, storeKey(user, key), sub, messageID, body)
}

// sendOnce is send for a request with an Idempotency-Key.
func (s *Server) sendOnce(w http.ResponseWriter, r *http.Request, key string, sub smtpd.Submission, messageID string, body []byte) {
	fp := fingerprint(r.Header.Get("Content-Type"), r.URL.RawQuery, sub.User, body)
	prev, err := s.idem.begin(key, fp, messageID, s.now(), false)
	var ir *interrupted
	if errors.As(err, &ir) {
		var id string
		var done bool
		if id, done, err = s.settleInterrupted(ir, sub.User); err == nil && done {
			s.answerSettled(w, key, sub, id, ir.rec.MessageID)
			return
		}
		if err == nil { // never queued: this request takes the key over
			prev, err = s.idem.begin(key, fp, messageID, s.now(), true)
		}
	}
	var kc *keyConflict
	switch {
	case errors.As(err, &kc):
		writeJSON(w, kc.status, apiError{Error: kc.msg})
		return
	case err != nil:
		s.log.Error("idempotency store", zap.Error(err))
		writeUnavailable(w, http.StatusServiceUnavailable, "cannot record the Idempotency-Key")
		return
	case prev != nil:
		w.Header().Set("Idempotent-Replayed", "true")
		writeAnswer(w, prev.Status, json.RawMessage(prev.Body))
		return
	}
	status, answer := s.submit(sub, messageID)
	enc := marshal(answer)
	// Temporary refusals are forgotten, so the same request may try again.
	keep := status < 500 && status != http.StatusTooManyRequests
	if err := s.idem.finish(key, keep, status, enc); err != nil {
		// The message is (or is not) in the queue whatever the store says:
		// answer truthfully; a repetition then gets 409, not a second copy.
		s.log.Error("idempotency store: the answer was not recorded", zap.Error(err))
	}
	writeAnswer(w, status, json.RawMessage(enc))
}

// answerSettled answers a request whose interrupted earlier attempt was
// found queued as id, and records that answer for the key.
func (s *Server) answerSettled(w http.ResponseWriter, key string, sub smtpd.Submission, id, messageID string) {
	rc := Receipt{QueueID: id, MessageID: messageID}
	for _, to := range sub.To {
		rc.Recipients = append(rc.Recipients, Recipient{Address: to, QueueID: id})
	}
	enc := marshal(rc)
	if err := s.idem.finish(key, true, http.StatusAccepted, enc); err != nil {
		s.log.Error("idempotency store: the answer was not recorded", zap.Error(err))
	}
	w.Header().Set("Idempotent-Replayed", "true")
	writeAnswer(w, http.StatusAccepted, json.RawMessage(enc))
}

// settleInterrupted finds whether the request an interrupted key stood
// for was queued: its queue id, or done false when it was not. An error
// when that cannot be told.
func (s *Server) settleInterrupted(ir *interrupted, user string) (string, bool, error) {
	if s.find == nil || ir.rec.MessageID == "" {
		return "", false, &keyConflict{http.StatusConflict, ir.Error()}
	}
	// The message, if queued, arrived after the pending record was
	// written (a minute's slack for a clock step).
	id, found, err := s.find(user, ir.rec.MessageID, ir.rec.Created.Add(-time.Minute))
	if err != nil {
		return "", false, fmt.Errorf("looking up Message-ID %s: %w", ir.rec.MessageID, err)
	}
	return id, found, nil
}

// fingerprint identifies a request, to tell a repetition from another
// request that reuses its key.
func fingerprint(contentType, query, user string, body []byte) []byte {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", contentType, query, user)
	h.Write(body)
	return h.Sum(nil)
}

// submit hands sub to the intake and builds the answer.
func (s *Server) submit(sub smtpd.Submission, messageID string) (int, any) {
	id, err := s.intake.Submit(sub)
	if err != nil {
		var se *smtp.SMTPError
		if !errors.As(err, &se) {
			se = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Local error in processing"}
		}
		return httpStatus(se), apiError{Error: se.Message, SMTP: formatReply(se)}
	}
	rc := Receipt{QueueID: id, MessageID: messageID}
	for _, to := range sub.To {
		rc.Recipients = append(rc.Recipients, Recipient{Address: to, QueueID: id})
	}
	return http.StatusAccepted, rc
}

// authenticate finds the token's identity.
func (s *Server) authenticate(r *http.Request) (user string, allowed []string, ok bool) {
	tok, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !found {
		return "", nil, false
	}
	return s.users.AuthenticateToken(strings.TrimSpace(tok))
}

// readRequest reads the body, up to what the largest message could take
// as JSON (base64 grows attachments by a third).
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	max := s.cfg.Limits.MaxMessageBytes
	if !isRaw(r) {
		max = max*4/3 + 64<<10
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, &statusError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request larger than %d octets", max)}
	}
	if err != nil {
		return nil, &statusError{http.StatusBadRequest, "reading the request: " + err.Error()}
	}
	return body, nil
}

func isRaw(r *http.Request) bool {
	ct := strings.ToLower(strings.TrimSpace(strings.Split(r.Header.Get("Content-Type"), ";")[0]))
	return ct == "message/rfc822"
}

// statusError is a refusal made here, before the intake.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

// submission turns the request into what Submit takes.
func (s *Server) submission(r *http.Request, body []byte) (smtpd.Submission, string, error) {
	sub := smtpd.Submission{TLS: r.TLS}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		sub.Client = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ct := strings.ToLower(strings.TrimSpace(strings.Split(r.Header.Get("Content-Type"), ";")[0]))
	switch ct {
	case "message/rfc822":
		return rawSubmission(sub, r, body)
	case "application/json":
	default:
		return sub, "", &statusError{http.StatusUnsupportedMediaType, "Content-Type must be application/json or message/rfc822"}
	}
	var m Message
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return sub, "", badInput("JSON message: %v", err)
	}
	msg, env, err := compose(&m, s.cfg.Hostname, s.now())
	if err != nil {
		return sub, "", err
	}
	sub.From, sub.To, sub.Body = env.from, env.to, bytes.NewReader(msg)
	sub.Mail = smtp.MailOptions{UTF8: env.utf8, EnvelopeID: m.EnvID, RequireTLS: m.RequireTLS}
	if !isASCII(string(msg)) {
		sub.Mail.Body = smtp.Body8BitMIME
	}
	return sub, env.messageID, nil
}

// rawSubmission takes the envelope from the query: from (empty for <>),
// to (repeated), envid, ret (FULL or HDRS) and requiretls.
func rawSubmission(sub smtpd.Submission, r *http.Request, body []byte) (smtpd.Submission, string, error) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "from", "to", "envid", "ret", "requiretls":
		default:
			return sub, "", badInput("unknown query parameter %q (from, to, envid, ret, requiretls)", k)
		}
	}
	if !q.Has("from") {
		return sub, "", badInput("from: required (empty for the null sender <>)")
	}
	sub.From, sub.To = q.Get("from"), q["to"]
	if len(sub.To) == 0 {
		return sub, "", badInput("to: at least one recipient is required")
	}
	utf := !isASCII(sub.From)
	for _, t := range sub.To {
		utf = utf || !isASCII(t)
	}
	sub.Mail = smtp.MailOptions{UTF8: utf, EnvelopeID: q.Get("envid")}
	switch strings.ToUpper(q.Get("ret")) {
	case "":
	case "FULL":
		sub.Mail.Return = smtp.DSNReturnFull
	case "HDRS":
		sub.Mail.Return = smtp.DSNReturnHeaders
	default:
		return sub, "", badInput("ret: FULL or HDRS")
	}
	if v := q.Get("requiretls"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return sub, "", badInput("requiretls: true or false")
		}
		sub.Mail.RequireTLS = b
	}
	if !isASCII(string(body)) {
		sub.Mail.Body = smtp.Body8BitMIME
	}
	sub.Body = bytes.NewReader(body)
	var messageID string
	if m, err := mail.ReadMessage(bytes.NewReader(body)); err == nil {
		messageID = strings.TrimSpace(m.Header.Get("Message-Id"))
	}
	return sub, messageID, nil
}

// httpStatus maps the SMTP door's reply to the HTTP door's status: a
// temporary refusal is 503 (507 when the disk is full) with Retry-After,
// never 2xx; the size limit 413; authentication 401; a sender or policy
// refusal 403; an identity over its user_limits 429 with Retry-After;
// anything else the client must change 400.
func httpStatus(se *smtp.SMTPError) int {
	e := se.EnhancedCode
	switch {
	case se.Code == 451 && e == smtp.EnhancedCode{4, 7, 1},
		se.Code == 452 && e == smtp.EnhancedCode{4, 5, 3} && strings.HasPrefix(se.Message, "Recipient rate limit"):
		return http.StatusTooManyRequests
	case se.Code == 452 && e == smtp.EnhancedCode{4, 3, 1}:
		return http.StatusInsufficientStorage
	case se.Code == 452 && e == smtp.EnhancedCode{4, 5, 3}:
		return http.StatusBadRequest // too many recipients: a smaller request is the fix
	case se.Code/100 == 4:
		return http.StatusServiceUnavailable
	case se.Code == 552:
		return http.StatusRequestEntityTooLarge
	case se.Code == 530 || se.Code == 535:
		if e == (smtp.EnhancedCode{5, 7, 10}) {
			return http.StatusForbidden // REQUIRETLS over plain HTTP
		}
		return http.StatusUnauthorized
	case e[1] == 7:
		return http.StatusForbidden
	}
	return http.StatusBadRequest
}

func formatReply(se *smtp.SMTPError) string {
	e := se.EnhancedCode
	return fmt.Sprintf("%d %d.%d.%d %s", se.Code, e[0], e[1], e[2], se.Message)
}

func writeError(w http.ResponseWriter, err error) {
	var se *statusError
	var ie *inputError
	switch {
	case errors.As(err, &se):
		writeJSON(w, se.status, apiError{Error: se.msg})
	case errors.As(err, &ie):
		writeJSON(w, http.StatusBadRequest, apiError{Error: ie.msg})
	default:
		writeUnavailable(w, http.StatusServiceUnavailable, "local error")
	}
}

// retryAfter is the Retry-After of a temporary refusal, in seconds.
const retryAfter = "60"

func writeUnavailable(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Retry-After", retryAfter)
	writeJSON(w, status, apiError{Error: msg})
}

// writeAnswer writes an intake answer, with Retry-After on a 5xx or 429.
func writeAnswer(w http.ResponseWriter, status int, v any) {
	if status >= 500 || status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", retryAfter)
	}
	writeJSON(w, status, v)
}

// marshal encodes v as writeJSON does (without escaping <, > and &,
// which Message-IDs have).
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return bytes.TrimSpace(b.Bytes())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
