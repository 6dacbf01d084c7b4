// Package classifier turns the error of one delivery attempt into a Verdict:
// deferred or failed, why, at which stage, and what the peer said.
//
// Design notes:
//
//   - The SMTP reply code alone decides the outcome: 4xx is Deferred, 5xx is
//     Failed (RFC 5321 §4.2.1). The one exception is 552 at RCPT, which is
//     treated as 452 (RFC 5321 §4.5.3.1.10).
//   - Anything we cannot read with confidence (unknown error types, codes
//     outside 400-599, garbage) is Deferred. This is maddy's rule: an unknown
//     error is temporary, so a misunderstanding costs a retry, not a bounce.
//   - An ordered rule table (DefaultRules, plus operator rules tried first)
//     only chooses the Reason. It never turns a 4xx into a failure or back.
//   - Errors that are not replies are recognised by type: *DNSError,
//     *smtpvocab.TLSError, timeouts, refused or dropped connections. A
//     connection that drops mid-dialogue (EOF, reset) counts as a connect
//     problem: the host or the path failed, not the message (Exim calls
//     these host errors).
//   - The SMTP words it judges (Reply, its parser, Stage, TLSError) live in
//     internal/smtpvocab, a leaf shared with relay/smtpclient, which so
//     returns replies without importing the classifier.
//   - Explain (explain.go) turns a reason and status code into advice for
//     operators: what it means, who is at fault, what to do.
//
// The package is pure: no I/O, no clock, no package-level state.
package classifier

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"os"
	"syscall"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// Outcome says whether greyrelay retries (Deferred) or bounces (Failed).
type Outcome int

// Outcomes. The zero value is Deferred, the safe choice.
const (
	Deferred Outcome = iota
	Failed
)

// String returns "deferred" or "failed".
func (o Outcome) String() string {
	if o == Failed {
		return "failed"
	}
	return "deferred"
}

// Reason is the classified cause of a deferral or failure. Its values are
// stable: they appear in logs, metrics labels and configuration.
type Reason string

// Reasons. Protocol means the peer's reply was garbage or unparseable.
// SMTPUTF8Unsupported means the message needs SMTPUTF8 (RFC 6531: a
// non-ASCII address or UTF-8 header fields) and the next hop lacks it.
const (
	Greylisted    Reason = "greylisted"
	RateLimited   Reason = "rate-limited"
	MailboxFull   Reason = "mailbox-full"
	ServerConfig  Reason = "server-config"
	ServerError   Reason = "server-error"
	Policy        Reason = "policy"
	NoSuchUser    Reason = "no-such-user"
	DNS           Reason = "dns"
	Connect       Reason = "connect"
	TLS           Reason = "tls"
	Timeout       Reason = "timeout"
	MessageTooBig Reason = "message-too-big"
	Protocol      Reason = "protocol"
	Unknown       Reason = "unknown"

	SMTPUTF8Unsupported Reason = "smtputf8-unsupported"
)

// The operator's actions. They are not classifications of a reply: the
// queue and the delivery engine store them as a recipient's reason when
// the operator acts on it (greyrelay queue bounce, hold, release, delete),
// so that everything that explains a recipient's state explains the
// action rather than the last reply, which is only history then.
const (
	OperatorBounced  Reason = "operator"
	OperatorHeld     Reason = "held"
	OperatorReleased Reason = "released"
	OperatorDeleted  Reason = "deleted"
)

// Suppressed is the reason of a recipient bounced without an attempt
// because its address is on the suppression list (suppression.action
// "bounce"): not a classification of a reply either.
const Suppressed Reason = "suppressed"

// Reasons returns every Reason, in a fixed order.
func Reasons() []Reason {
	return []Reason{Greylisted, RateLimited, MailboxFull, ServerConfig, ServerError, Policy,
		NoSuchUser, DNS, Connect, TLS, Timeout, MessageTooBig, Protocol, Unknown, SMTPUTF8Unsupported}
}

// DNSKind says how a destination lookup failed.
type DNSKind int

// DNS failure kinds. Only NXDOMAIN and null MX are permanent.
const (
	DNSNXDomain DNSKind = iota
	DNSNullMX
	DNSServFail
	DNSTimeout
	DNSOther
)

// DNSError is returned by greyrelay's resolver for the recipient domain.
type DNSError struct {
	Domain string
	Kind   DNSKind
	Err    error // underlying cause; may be nil
}

// Error implements error.
func (e *DNSError) Error() string {
	what := "lookup failed"
	switch e.Kind {
	case DNSNXDomain:
		what = "no such domain"
	case DNSNullMX:
		what = "null MX, domain accepts no mail (RFC 7505)"
	case DNSServFail:
		what = "server failure"
	case DNSTimeout:
		what = "lookup timed out"
	}
	if e.Err != nil {
		return fmt.Sprintf("dns %s: %s: %v", e.Domain, what, e.Err)
	}
	return fmt.Sprintf("dns %s: %s", e.Domain, what)
}

// Unwrap returns the underlying cause.
func (e *DNSError) Unwrap() error { return e.Err }

// Verdict is the classified result of one failed attempt.
type Verdict struct {
	Outcome Outcome
	Reason  Reason
	Stage   smtpvocab.Stage
	Code    int // SMTP reply code; 0 if no reply was involved
	// Enhanced is the RFC 3463 code from the reply ("" if it had none). For
	// local failures (Code 0) it is the code greyrelay assigns, e.g. 5.1.10
	// for a null MX (RFC 7505) or 4.4.1 for a refused connection.
	Enhanced string
	Text     string        // reply or error text; no CR/LF/NUL, at most 512 bytes
	Hint     time.Duration // retry hint found in a deferral's text; 0 if none
}

// Permanent reports whether the attempt failed for good.
func (v Verdict) Permanent() bool { return v.Outcome == Failed }

// Status returns the RFC 3463 status to report, e.g. in a DSN. Its class
// always follows the Outcome (a 552 deferred at RCPT reports 4.x.x); the
// subject and detail come from Enhanced, or from the Reason if there is none.
func (v Verdict) Status() string {
	class := 4
	if v.Outcome == Failed {
		class = 5
	}
	if e, ok := smtpvocab.ParseEnhanced(v.Enhanced); ok {
		return fmt.Sprintf("%d.%d.%d", class, e[1], e[2])
	}
	return fmt.Sprintf("%d.%s", class, reasonStatus(v.Reason, v.Outcome))
}

// reasonStatus maps a reason to an RFC 3463 subject.detail, for verdicts
// whose reply carried no enhanced code and for local failures.
func reasonStatus(r Reason, o Outcome) string {
	if r == DNS && o == Failed {
		return "1.2" // bad destination system address
	}
	s, ok := map[Reason]string{Greylisted: "7.1", RateLimited: "4.5", MailboxFull: "2.2", ServerConfig: "3.5",
		ServerError: "3.0", Policy: "7.0", NoSuchUser: "1.1", DNS: "4.3", Connect: "4.1", TLS: "7.5",
		Timeout: "4.2", MessageTooBig: "3.4", Protocol: "5.0", SMTPUTF8Unsupported: "6.7"}[r]
	if !ok {
		return "0.0"
	}
	return s
}

// Classifier holds the compiled rule table. Build it with New; it is safe
// for concurrent use.
type Classifier struct {
	rules []rule
}

// New compiles extra (tried first, in order) followed by DefaultRules. It
// rejects a rule with a bad pattern, code, enhanced code or reason, naming it.
func New(extra []Rule) (*Classifier, error) {
	c := &Classifier{}
	for i, r := range append(append([]Rule(nil), extra...), DefaultRules()...) {
		cr, err := compileRule(r)
		if err != nil {
			return nil, fmt.Errorf("classifier: rule %d (pattern %q, reason %q): %w", i, r.Pattern, r.Reason, err)
		}
		c.rules = append(c.rules, cr)
	}
	return c, nil
}

// Classify turns the error that ended an attempt at stage into a Verdict.
// A nil error or one it does not recognise yields a Deferred verdict.
func (c *Classifier) Classify(stage smtpvocab.Stage, err error) Verdict {
	if err == nil {
		return local(stage, Unknown, Deferred, "", "no error reported")
	}
	var de *DNSError
	if errors.As(err, &de) {
		switch de.Kind {
		case DNSNXDomain:
			return local(stage, DNS, Failed, "5.1.2", err.Error())
		case DNSNullMX:
			return local(stage, DNS, Failed, "5.1.10", err.Error())
		}
		return local(stage, DNS, Deferred, "", err.Error())
	}
	var te *smtpvocab.TLSError
	if errors.As(err, &te) {
		// A TLS failure stays deferred even if STARTTLS got a 5xx: another
		// attempt or MX may succeed (Postfix treats TLS failures as soft too).
		v := local(stage, TLS, Deferred, "", err.Error())
		if r, ok := asReply(err); ok {
			v.Code, v.Enhanced, v.Text = r.Code, smtpvocab.NormEnhanced(r.Enhanced), sanitize(r.Text)
		}
		return v
	}
	if r, ok := asReply(err); ok {
		return c.classifyReply(stage, r)
	}
	return local(stage, errorReason(stage, err), Deferred, "", err.Error())
}

// errorReason recognises errors that are not SMTP replies.
func errorReason(stage smtpvocab.Stage, err error) Reason {
	var ne net.Error
	var op *net.OpError
	var pe textproto.ProtocolError
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return Timeout
	case isTLS(err):
		return TLS
	case errors.As(err, &op) && op.Op == "dial",
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return Connect
	case errors.As(err, &pe):
		return Protocol
	}
	// Unrecognised: the stage is the best clue we have.
	switch stage {
	case smtpvocab.StageDNS:
		return DNS
	case smtpvocab.StageConnect:
		return Connect
	case smtpvocab.StageSTARTTLS:
		return TLS
	}
	return Unknown
}

// isTLS recognises standard library TLS and certificate errors that reach us
// without a *smtpvocab.TLSError wrapper.
func isTLS(err error) bool {
	var cv *tls.CertificateVerificationError
	var rh tls.RecordHeaderError
	var al tls.AlertError
	var hn x509.HostnameError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	return errors.As(err, &cv) || errors.As(err, &rh) || errors.As(err, &al) ||
		errors.As(err, &hn) || errors.As(err, &ua) || errors.As(err, &ci)
}

// local builds the verdict for a failure that carries no SMTP reply.
func local(stage smtpvocab.Stage, r Reason, o Outcome, enhanced, text string) Verdict {
	v := Verdict{Outcome: o, Reason: r, Stage: stage, Enhanced: enhanced, Text: sanitize(text)}
	if v.Enhanced == "" {
		v.Enhanced = v.Status()
	}
	return v
}

// classifyReply applies the code rules and the rule table to a reply.
func (c *Classifier) classifyReply(stage smtpvocab.Stage, r smtpvocab.Reply) Verdict {
	v := Verdict{Stage: stage, Code: r.Code, Enhanced: smtpvocab.NormEnhanced(r.Enhanced), Text: sanitize(r.Text)}
	code := r.Code
	if code < 400 || code > 599 {
		// Not a failure code: the peer or our client misbehaved. Retry.
		v.Reason = Protocol
		return v
	}
	// RFC 5321 §4.5.3.1.10: RFC 821 listed "too many recipients" as 552;
	// the correct code is 452, and clients SHOULD treat 552 at RCPT as such.
	if code == 552 && stage == smtpvocab.StageRCPT {
		code = 452
	}
	if code >= 500 {
		v.Outcome = Failed
	}
	v.Reason = Unknown
	for _, rl := range c.rules {
		if rl.match(code, v.Enhanced, v.Text) {
			v.Reason = rl.reason
			break
		}
	}
	if v.Outcome == Deferred {
		v.Hint = Hint(v.Text)
	}
	return v
}

// asReply extracts an SMTP reply from err: a *smtpvocab.Reply anywhere in
// its chain, as relay/smtpclient returns them.
func asReply(err error) (smtpvocab.Reply, bool) {
	var r *smtpvocab.Reply
	if errors.As(err, &r) {
		return *r, true
	}
	return smtpvocab.Reply{}, false
}
