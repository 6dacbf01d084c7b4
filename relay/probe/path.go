package probe

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
)

// PathReport is one SMTP session with one address of one host (step 4).
type PathReport struct {
	Host    string `json:"host"`
	Pref    uint16 `json:"pref"`
	Address string `json:"address"` // ip:port we connected to
	// Source is the local ip:port of the connection: the pinned source
	// address, or the kernel's choice.
	Source     string   `json:"source,omitempty"`
	Steps      []Step   `json:"steps"`
	Extensions []string `json:"extensions"` // EHLO keywords with parameters (after STARTTLS, if any)
	TLS        *TLSInfo `json:"tls,omitempty"`
	// Outcome is Accepted, Deferred, Refused or Unreachable; Reason is the
	// classified reason of the step that decided it.
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
}

// Step is one exchange: a command and its reply, or a connect.
type Step struct {
	Name    string `json:"name"` // connect, greeting, EHLO, STARTTLS, tls, AUTH, MAIL, RCPT, RSET, QUIT
	Elapsed Millis `json:"elapsed_ms"`
	Sent    string `json:"sent,omitempty"`  // the command line (AUTH secrets redacted)
	Reply   string `json:"reply,omitempty"` // the reply, one line per reply line
	Code    int    `json:"code,omitempty"`
	OK      bool   `json:"ok"`
	// Error is a failure without a reply: I/O, timeout, TLS handshake.
	Error string `json:"error,omitempty"`
	Note  string `json:"note,omitempty"`
	// Reason and Explanation classify a failed step as the relay would.
	Reason      string       `json:"reason,omitempty"`
	Explanation *Explanation `json:"explanation,omitempty"`
}

// TLSInfo describes the TLS session and the peer's certificate.
type TLSInfo struct {
	Version    string    `json:"version,omitempty"`
	Cipher     string    `json:"cipher,omitempty"`
	Subject    string    `json:"subject"`
	Issuer     string    `json:"issuer"`
	DNSNames   []string  `json:"dns_names"`
	NotAfter   time.Time `json:"not_after"`
	Expired    bool      `json:"expired"`
	ServerName string    `json:"server_name"` // the name the certificate was checked for (the MX host)
	// VerifiesFor: the certificate chains to a trusted root and is valid
	// for ServerName now. Under TLS policy "may" or "encrypt" the relay
	// sends anyway (RFC 7435); under "verify" it would not.
	VerifiesFor bool   `json:"verifies_for"`
	VerifyError string `json:"verify_error,omitempty"`
}

// session is what one host's dialogue needs besides the address.
type session struct {
	host   string
	policy smtpclient.TLSPolicy
	config *tls.Config // replaces Options.TLSConfig under a DANE or MTA-STS policy
	user   string
	pass   string
}

// paths probes the hops in order. Within a host the next address is tried
// only when one cannot be reached, as delivery does.
func (p *prober) paths(ctx context.Context, rt mx.Route) {
	s := session{policy: p.opt.TLS}
	if rt.Kind == mx.KindSmarthost {
		s = session{policy: p.opt.SmarthostTLS, user: p.opt.Username, pass: p.opt.Password}
	}
	base := s.policy
	for _, h := range rt.Hops {
		s.host, s.policy = h.Host, base
		if err := p.applyRule(&s); err != nil {
			p.rep.Paths = append(p.rep.Paths, p.refusedPath(h.Host, err))
			continue
		}
		for _, a := range h.Addrs {
			pr := p.path(ctx, s, netip.AddrPortFrom(a, uint16(h.Port)))
			pr.Pref = h.Pref
			p.rep.Paths = append(p.rep.Paths, pr)
			if pr.Outcome != Unreachable || ctx.Err() != nil {
				break
			}
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// path runs one session: handshake, MAIL, RCPT, then RSET and QUIT. Never DATA.
func (p *prober) path(ctx context.Context, s session, addr netip.AddrPort) PathReport {
	pr := PathReport{Host: s.host, Address: addr.String()}
	rec := &recorder{now: p.opt.Now, open: -1}
	d := p.opt.Dialer4
	if addr.Addr().Is6() {
		d = p.opt.Dialer6
	}
	if d == nil {
		rec.add(Step{Name: "connect", Error: "no IPv6 source address configured (delivery.source_ipv6)"}, smtpvocab.StageConnect)
		pr.Outcome, pr.Reason = Unreachable, string(classifier.Connect)
	} else if c, err := p.dial(ctx, s, addr, rec, d); err != nil {
		pr.Outcome, pr.Reason = p.failed(rec, err)
		pr.TLS = p.tlsFailure(err, s.host)
	} else {
		pr.Source = c.LocalAddr().String()
		if st, ok := c.TLS(); ok {
			pr.TLS = p.tlsInfo(st.PeerCertificates, s.host)
			pr.TLS.Version, pr.TLS.Cipher = tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite)
		}
		pr.Outcome, pr.Reason = p.transaction(c, rec)
	}
	p.classifyReplies(rec)
	pr.Steps, pr.Extensions = rec.steps, rec.extensions()
	return pr
}

// classifyReplies explains the failure replies that did not end the
// session, such as a 454 to STARTTLS under opportunistic TLS.
func (p *prober) classifyReplies(rec *recorder) {
	for i := range rec.steps {
		s := &rec.steps[i]
		if s.Code >= 400 && s.Reason == "" {
			s.Reason, s.Explanation, _ = p.explain(rec.stages[i], rec.replies[i])
		}
	}
}

// dial connects and runs the handshake. When opportunistic TLS fails, it
// records why and redials in plaintext, as smtpclient.DialWithFallback
// does for the relay (RFC 7435 §4).
func (p *prober) dial(ctx context.Context, s session, addr netip.AddrPort, rec *recorder, d smtpclient.Dialer) (*smtpclient.Client, error) {
	o := smtpclient.Options{Hostname: p.opt.Hostname, TLS: s.policy, TLSConfig: p.sessionConfig(s),
		Username: s.user, Password: s.pass, ConnectTimeout: p.opt.ConnectTimeout,
		GreetingTimeout: p.opt.GreetingTimeout, CommandTimeout: p.opt.CommandTimeout, Trace: rec.trace}
	td := &tracingDialer{d: d, rec: rec}
	c, err := smtpclient.Dial(ctx, td, addr, s.host, o)
	var e *smtpclient.Error
	var te *smtpvocab.TLSError
	if err == nil || (o.TLS != smtpclient.TLSMay && o.TLS != "") ||
		!errors.As(err, &e) || e.Stage != smtpvocab.StageSTARTTLS || !errors.As(err, &te) {
		return c, err
	}
	i := rec.failure(err)
	rec.steps[i].Reason, rec.steps[i].Explanation, _ = p.explain(smtpvocab.StageSTARTTLS, err)
	rec.steps[i].Note = "TLS policy is \"may\": the relay retries in plaintext"
	o.TLS = smtpclient.TLSNone
	return smtpclient.Dial(ctx, td, addr, s.host, o)
}

// transaction sends MAIL and RCPT and ends the session without DATA.
func (p *prober) transaction(c *smtpclient.Client, rec *recorder) (string, string) {
	outcome, reason := Accepted, ""
	r, err := c.Mail(p.rep.Sender)
	if err == nil && r.Code/100 == 2 {
		r, err = c.Rcpt(p.rep.Recipient)
	}
	switch {
	case err != nil: // the client closed the connection (Close is idempotent)
		_ = c.Close()
		return p.failed(rec, err)
	case r.Code/100 != 2:
		outcome, reason = p.failed(rec, r)
	}
	// RFC 5321 §4.1.1.5 and §4.1.1.10: end the transaction and the session
	// politely; the probe never reaches DATA.
	if c.Reset() == nil {
		_ = c.Quit()
	}
	return outcome, reason
}

// failed classifies err (which ended the session or the transaction),
// annotates the step it happened at, and returns the path's outcome.
func (p *prober) failed(rec *recorder, err error) (string, string) {
	stage := smtpvocab.StageConnect
	var e *smtpclient.Error
	if errors.As(err, &e) {
		stage = e.Stage
	} else if i := rec.last(); i >= 0 {
		stage = rec.stages[i]
	}
	i := rec.failure(err)
	reason, x, permanent := p.explain(stage, err)
	rec.steps[i].Reason, rec.steps[i].Explanation = reason, x
	var r *smtpvocab.Reply
	switch {
	case permanent:
		return Refused, reason
	case errors.As(err, &r) && r.Code >= 400:
		return Deferred, reason
	}
	return Unreachable, reason
}

// tlsInfo describes a peer certificate chain and verifies it for host
// against the configured roots (nil: the system's).
func (p *prober) tlsInfo(chain []*x509.Certificate, host string) *TLSInfo {
	if len(chain) == 0 {
		return &TLSInfo{ServerName: host, DNSNames: []string{}, VerifyError: "no certificate presented"}
	}
	leaf, now := chain[0], p.opt.Now()
	t := &TLSInfo{Subject: leaf.Subject.String(), Issuer: leaf.Issuer.String(), DNSNames: append([]string{}, leaf.DNSNames...),
		NotAfter: leaf.NotAfter, Expired: now.After(leaf.NotAfter), ServerName: host}
	vo := x509.VerifyOptions{DNSName: host, Intermediates: x509.NewCertPool(), CurrentTime: now}
	if p.opt.TLSConfig != nil {
		vo.Roots = p.opt.TLSConfig.RootCAs
	}
	for _, c := range chain[1:] {
		vo.Intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(vo); err != nil {
		t.VerifyError = err.Error()
	} else {
		t.VerifiesFor = true
	}
	return t
}

// tlsFailure describes the certificate of a handshake that failed
// verification (TLS policy "verify"), if that is what happened.
func (p *prober) tlsFailure(err error, host string) *TLSInfo {
	var cv *tls.CertificateVerificationError
	if !errors.As(err, &cv) {
		return nil
	}
	t := p.tlsInfo(cv.UnverifiedCertificates, host)
	t.VerifyError = cv.Err.Error()
	return t
}

// tracingDialer records the connect step and the source address.
type tracingDialer struct {
	d   smtpclient.Dialer
	rec *recorder
}

// DialContext implements smtpclient.Dialer.
func (t *tracingDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	start := t.rec.now()
	conn, err := t.d.DialContext(ctx, network, addr)
	s := Step{Name: "connect", Elapsed: Millis(t.rec.now().Sub(start)), OK: err == nil}
	if err != nil {
		s.Error = err.Error()
	} else {
		s.Note = "from " + conn.LocalAddr().String() + " to " + conn.RemoteAddr().String()
	}
	t.rec.add(s, smtpvocab.StageConnect)
	return conn, err
}

// recorder turns smtpclient trace events into steps.
type recorder struct {
	now     func() time.Time
	steps   []Step
	stages  []smtpvocab.Stage  // per step
	replies []*smtpvocab.Reply // per step: the reply, or nil
	open    int                // the step waiting for its reply; -1 for none
	ehlo    []string           // lines of the last EHLO reply
}

func (r *recorder) add(s Step, stage smtpvocab.Stage) {
	r.steps = append(r.steps, s)
	r.stages = append(r.stages, stage)
	r.replies = append(r.replies, nil)
	r.open = -1
}

// trace implements smtpclient.Options.Trace.
func (r *recorder) trace(e smtpclient.Event) {
	if e.Sent != "" {
		r.add(Step{Name: commandName(e), Sent: e.Sent}, e.Stage)
		r.open = len(r.steps) - 1
		return
	}
	if r.open < 0 { // a reply nobody asked for: the greeting
		r.add(Step{Name: "greeting"}, e.Stage)
		r.open = len(r.steps) - 1
	}
	s := &r.steps[r.open]
	s.Elapsed = Millis(e.Elapsed)
	if e.Reply != nil {
		s.Code, s.Reply, r.replies[r.open] = e.Reply.Code, rawReply(e.Reply), e.Reply
		s.OK = e.Reply.Code < 400
		if s.Name == "EHLO" && s.OK {
			r.ehlo = strings.Split(e.Reply.Text, "\n")
		}
	}
	if e.Err != nil {
		s.Error, s.OK = e.Err.Error(), false
	}
	r.open = -1
}

// last returns the index of the last step, or -1.
func (r *recorder) last() int { return len(r.steps) - 1 }

// failure returns the index of the step err belongs to: the last step
// with that reply or with an error; a failure no step shows (a TLS
// handshake, a refusal to send credentials) gets a step of its own.
func (r *recorder) failure(err error) int {
	var reply *smtpvocab.Reply
	isReply := errors.As(err, &reply)
	for i := len(r.steps) - 1; i >= 0; i-- {
		s := r.steps[i]
		if s.Name == "QUIT" && s.Reply == "" {
			continue // the QUIT sent before hanging up
		}
		if (isReply && s.Code == reply.Code) || (!isReply && s.Error != "") {
			return i
		}
		break
	}
	name, stage := "error", smtpvocab.StageConnect
	var e *smtpclient.Error
	if errors.As(err, &e) {
		name, stage = e.Stage.String(), e.Stage
		if e.Stage == smtpvocab.StageSTARTTLS {
			name = "tls"
		}
	}
	r.add(Step{Name: name, Error: err.Error()}, stage)
	return len(r.steps) - 1
}

// extensions returns the EHLO keywords the peer advertised.
func (r *recorder) extensions() []string {
	if len(r.ehlo) < 2 {
		return []string{}
	}
	return r.ehlo[1:]
}

// commandName names a step by its verb; AUTH continuation lines are AUTH.
func commandName(e smtpclient.Event) string {
	if e.Stage == smtpvocab.StageAuth {
		return "AUTH"
	}
	verb, _, _ := strings.Cut(e.Sent, " ")
	verb, _, _ = strings.Cut(verb, ":")
	return strings.ToUpper(verb)
}

// rawReply writes a reply back in wire form, one line per reply line.
func rawReply(r *smtpvocab.Reply) string {
	lines := strings.Split(r.Text, "\n")
	var b strings.Builder
	for i, l := range lines {
		sep := "-"
		if i == len(lines)-1 {
			sep = " "
		}
		if i == 0 && r.Enhanced != "" {
			l = strings.TrimSpace(r.Enhanced + " " + l)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(strings.TrimRight(fmtCode(r.Code)+sep+l, " "))
	}
	return b.String()
}

func fmtCode(c int) string {
	return string([]byte{byte('0' + c/100%10), byte('0' + c/10%10), byte('0' + c%10)})
}
