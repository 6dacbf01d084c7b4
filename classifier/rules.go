package classifier

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// Rule maps matching SMTP replies to a Reason. All set fields must match;
// the first matching rule wins. A rule chooses the Reason only: the reply
// code alone decides whether the verdict is Deferred or Failed.
// Operators add rules through the configuration (retry.rules).
type Rule struct {
	// Pattern is a case-insensitive regular expression (RE2) searched in the
	// sanitized reply text (lines joined by spaces, at most 512 bytes); ""
	// matches any text.
	Pattern string `yaml:"pattern"`
	// Code is 0 (any), a class digit (4 or 5), a two-digit prefix (50 is
	// 500-509) or a full code such as 421.
	Code int `yaml:"code"`
	// Enhanced is "" (any) or an RFC 3463 code whose parts may be "x"
	// wildcards: "4.7.1" exact, "x.7.1" either class, "4.7.x", "x.2.x".
	Enhanced string `yaml:"enhanced"`
	// Reason is the Reason assigned to matching replies.
	Reason Reason `yaml:"reason"`
}

// DefaultRules returns greyrelay's built-in table, the one place where reply
// texts and codes become reasons. Order matters: specific texts first, then
// enhanced codes, then vague texts, then bare reply codes. The reply lines
// each rule is meant for are in the package tests.
func DefaultRules() []Rule {
	return []Rule{
		// Specific texts, whatever the code.
		{Pattern: `local error in processing|temporary (server|system|local) (error|failure|problem)|internal (server )?error|server error|queue file write error|insufficient system (storage|resources)`, Reason: ServerError},
		{Pattern: `mailbox (is )?full|quota|storage allocation|out of storage`, Reason: MailboxFull},
		// RFC 5321 §4.2.3: 450 "mailbox unavailable (e.g., mailbox busy …)":
		// the recipient's server has a temporary problem with the mailbox.
		{Code: 4, Pattern: `mailbox (is )?(busy|locked|temporarily unavailable)`, Reason: ServerError},
		{Pattern: `rate[ -]limit|at a rate|unusual rate|too many (connections|recipients|messages|mails|requests|sessions|concurrent)|throttl|slow down|limit exceeded|exceeded the (rate|limit)`, Reason: RateLimited},
		{Pattern: `(message|mail) (size|is too (big|large))|too (big|large)|size (limit|exceeds)|exceeds .*size`, Reason: MessageTooBig},
		{Pattern: `time(d)?[ -]?out`, Reason: Timeout},
		{Pattern: `\b(start)?tls\b|encryption|certificate`, Reason: TLS},
		// Gmail and Yahoo close the session with 421 4.7.0 when they throttle.
		{Code: 421, Enhanced: "4.7.0", Reason: RateLimited},
		{Enhanced: "x.7.28", Reason: RateLimited}, // mail flood detected
		{Enhanced: "x.4.5", Reason: RateLimited},  // mail system congestion
		// Greylisting: postgrey, rspamd, greylistd, milter-greylist, sqlgrey,
		// Microsoft "server busy", postscreen's "service currently unavailable".
		{Code: 4, Pattern: `gr[ae]y-?list|try (again )?later|try again in|please retry|retry later|temporarily (deferred|rejected)|come back (later|in)|not yet authori[sz]ed|server busy|service currently unavailable`, Reason: Greylisted},
		{Code: 4, Enhanced: "4.7.500", Reason: Greylisted},
		{Pattern: `user unknown|unknown (user|recipient|local part|mailbox)|no such (user|mailbox|recipient|account)|does not exist|doesn't exist|recipient (address rejected: access denied|not found)|invalid (recipient|mailbox)`, Reason: NoSuchUser},
		// Enhanced codes (RFC 3463 and its registry).
		{Enhanced: "x.1.10", Reason: DNS}, // recipient domain has a null MX (RFC 7505)
		{Enhanced: "x.1.7", Reason: Policy},
		{Enhanced: "x.1.8", Reason: Policy},
		{Enhanced: "x.1.x", Reason: NoSuchUser},
		{Enhanced: "x.2.2", Reason: MailboxFull},
		{Enhanced: "x.2.3", Reason: MessageTooBig},
		{Enhanced: "x.2.1", Reason: NoSuchUser},
		{Enhanced: "x.3.4", Reason: MessageTooBig},
		{Enhanced: "x.3.5", Reason: ServerConfig},
		{Enhanced: "x.3.x", Reason: ServerError},
		{Enhanced: "x.4.1", Reason: Connect},
		{Enhanced: "x.4.2", Reason: Connect},
		{Enhanced: "x.4.3", Reason: DNS},
		{Enhanced: "x.4.4", Reason: DNS},
		{Enhanced: "x.4.6", Reason: ServerConfig}, // routing loop
		{Enhanced: "x.4.7", Reason: Timeout},
		{Enhanced: "x.5.3", Reason: RateLimited}, // too many recipients
		{Enhanced: "x.5.x", Reason: Protocol},
		// RFC 6531 §3.7.1 / RFC 6533: the message needs SMTPUTF8 (a
		// non-ASCII address or UTF-8 header fields) where it is missing;
		// 553 5.6.7 is also what smtpclient reports itself when the next
		// hop does not offer the extension (RFC 6531 §3.2).
		{Enhanced: "x.6.7", Reason: SMTPUTF8Unsupported},
		{Enhanced: "x.6.8", Reason: SMTPUTF8Unsupported},
		{Enhanced: "x.6.9", Reason: SMTPUTF8Unsupported},
		{Enhanced: "x.6.x", Reason: Policy},
		{Enhanced: "x.7.4", Reason: TLS},
		{Enhanced: "x.7.5", Reason: TLS},
		{Enhanced: "x.7.10", Reason: TLS},
		{Enhanced: "x.7.11", Reason: TLS},
		{Enhanced: "x.7.x", Reason: Policy},
		// Vague texts, for replies without a useful enhanced code.
		{Pattern: `block|black ?list|spam|banned|denied|not (allowed|permitted|authori[sz]ed)|rejected|reputation|policy|refused`, Reason: Policy},
		// Bare reply codes (RFC 5321 §4.2.2 and §4.2.3).
		{Code: 421, Reason: ServerError},
		{Code: 451, Reason: ServerError},
		{Code: 452, Reason: ServerError},
		{Code: 50, Reason: Protocol},
		{Code: 538, Reason: TLS},
		{Code: 53, Reason: Policy},
		{Code: 552, Reason: MessageTooBig}, // 552 at RCPT arrives here as 452
		{Code: 554, Reason: Policy},
	}
}

// rule is a compiled Rule.
type rule struct {
	re     *regexp.Regexp // nil: any text
	code   int
	enh    [3]int // -1: wildcard
	anyEnh bool
	reason Reason
}

// compileRule validates r and compiles its pattern.
func compileRule(r Rule) (rule, error) {
	c := rule{code: r.Code, reason: r.Reason, anyEnh: r.Enhanced == ""}
	if !slices.Contains(Reasons(), r.Reason) {
		return c, fmt.Errorf("unknown reason %q", r.Reason)
	}
	if n := r.Code; n != 0 && !(n >= 2 && n <= 5) && !(n >= 20 && n <= 59) && !(n >= 200 && n <= 599) {
		return c, fmt.Errorf("bad code %d: want 0, a class digit, a two-digit prefix or a reply code", n)
	}
	if !c.anyEnh {
		parts := strings.Split(r.Enhanced, ".")
		if len(parts) != 3 {
			return c, fmt.Errorf("bad enhanced code %q", r.Enhanced)
		}
		for i, p := range parts {
			c.enh[i] = -1
			if p == "x" || p == "X" {
				continue
			}
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 || n > 999 || (i == 0 && n != 2 && n != 4 && n != 5) {
				return c, fmt.Errorf("bad enhanced code %q", r.Enhanced)
			}
			c.enh[i] = n
		}
	}
	if r.Pattern != "" {
		re, err := regexp.Compile("(?i)" + r.Pattern)
		if err != nil {
			return c, err
		}
		c.re = re
	}
	return c, nil
}

// match reports whether the rule matches a reply.
func (r rule) match(code int, enhanced, text string) bool {
	switch {
	case r.code == 0:
	case r.code < 10 && code/100 != r.code,
		r.code >= 10 && r.code < 100 && code/10 != r.code,
		r.code >= 100 && code != r.code:
		return false
	}
	if !r.anyEnh {
		e, ok := smtpvocab.ParseEnhanced(enhanced)
		if !ok {
			return false
		}
		for i := range e {
			if r.enh[i] >= 0 && r.enh[i] != e[i] {
				return false
			}
		}
	}
	return r.re == nil || r.re.MatchString(text)
}
