// Package address parses envelope addresses (RFC 5321 §4.1.2 Mailbox)
// strictly, for a relay that must never be talked into routing mail
// somewhere it did not mean to.
//
// Design notes:
//
//   - go-smtp unquotes local parts and drops source routes before the
//     session sees an address: <"user@target"@relay> and
//     <user@target@relay> both arrive as user@target@relay, and <"a b"@x>
//     as a b@x. So the domain is what follows the LAST "@", and any "@"
//     left in the local part (quoted or not) is refused rather than guessed
//     at. So are "%" and "!", the Sendmail and UUCP routing operators: a
//     downstream parser could reroute on them even though RFC 5321 allows
//     them as atext. What go-smtp hands over is parsed with
//     Options.Decoded: its local part is already unquoted, so any qtextSMTP
//     or quoted-pair character is taken (RFC 5321 §4.1.2 Quoted-string)
//     and String quotes it again.
//   - Every refusal is an *Error carrying the exact SMTP reply to give, so
//     the server has nothing to decide. The codes are chosen here, once.
//   - Local parts are preserved byte for byte (RFC 5321 §2.4: they are case
//     sensitive); domains are lowercased for routing (§2.4: domains are not).
//   - Address.String re-quotes a local part that is not a dot-string, so an
//     address can always be written back into an SMTP command or a header.
//   - Non-ASCII is accepted only when the transaction uses SMTPUTF8
//     (RFC 6531). Internationalised domains are then kept as U-labels and
//     lowercased. A domain with a U-label or an A-label ("xn--") must be a
//     valid IDNA2008 name (RFC 5891 §4 and §5.4, checked by
//     golang.org/x/net/idna's registration profile: PVALID code points,
//     NFC, no leading combining mark, the CONTEXTJ and bidi (RFC 5893)
//     rules, labels of at most 63 octets as A-labels). Nothing is mapped:
//     a name that needs mapping is refused, not rewritten.
package address

import (
	"fmt"
	"net/netip"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// Limits from RFC 5321 §4.5.3.1.
const (
	MaxLocal  = 64  // §4.5.3.1.1: octets in a local part
	MaxDomain = 255 // §4.5.3.1.2: octets in a domain
	MaxPath   = 256 // §4.5.3.1.3: octets in a path, including "<" and ">"
	maxLabel  = 63  // RFC 1035 §2.3.4
)

// Options say in which context an address is parsed.
type Options struct {
	// SMTPUTF8 allows UTF-8 in the local part and the domain (RFC 6531 §3.3);
	// set when MAIL carried the SMTPUTF8 parameter.
	SMTPUTF8 bool
	// Sender marks a reverse-path (MAIL FROM): syntax errors then carry
	// X.1.7 "bad sender's mailbox address syntax" instead of X.1.3
	// (RFC 3463 §3.2).
	Sender bool
	// Postmaster accepts the domainless "postmaster" (any case), which
	// RFC 5321 §4.5.1 requires every server to take in RCPT. The result has
	// an empty Domain.
	Postmaster bool
	// Decoded says the local part arrives already unquoted, as go-smtp
	// hands it to the session: everything before the last "@" is the
	// local part's content, and any character a Quoted-string may carry
	// (RFC 5321 §4.1.2 qtextSMTP and quoted-pairSMTP: printable ASCII and
	// space; UTF-8 with SMTPUTF8) is accepted. String quotes it again
	// when it is not a Dot-string.
	Decoded bool
}

// Address is a parsed mailbox. Local is the decoded local part (no quotes or
// backslashes); Domain is lowercased, or an address literal in canonical
// form ("[192.0.2.1]", "[IPv6:2001:db8::1]"), or empty for a bare postmaster.
type Address struct {
	Local, Domain string
}

// String writes the address as an RFC 5321 Mailbox, quoting the local part
// when it is not a dot-string.
func (a Address) String() string {
	local := a.Local
	if !isDotString(local) {
		local = quote(local)
	}
	if a.Domain == "" {
		return local
	}
	return local + "@" + a.Domain
}

// Literal reports whether the domain is an address literal ("[192.0.2.1]",
// "[IPv6:2001:db8::1]"), which names a host rather than a domain.
func (a Address) Literal() bool { return strings.HasPrefix(a.Domain, "[") }

// Error is a refused address together with the SMTP reply to give for it.
type Error struct {
	Code     int    // basic reply code (RFC 5321 §4.2)
	Enhanced [3]int // enhanced status code (RFC 3463)
	Msg      string // reply text, safe to send (no control characters)
}

// Error formats the reply as it would go on the wire.
func (e *Error) Error() string {
	return fmt.Sprintf("%d %d.%d.%d %s", e.Code, e.Enhanced[0], e.Enhanced[1], e.Enhanced[2], e.Msg)
}

// The replies. Each carries the section that justifies it.

// syntaxErr: RFC 5321 §4.2.3 "501 Syntax error in parameters or arguments";
// RFC 3463 §3.2 X.1.3 "Bad destination mailbox address syntax" or, for the
// reverse-path, X.1.7 "Bad sender's mailbox address syntax".
func syntaxErr(opt Options, msg string) *Error {
	return &Error{Code: 501, Enhanced: mailboxCode(opt), Msg: msg}
}

// routingErr refuses routing tricks (source routes, "%", "!", embedded "@"):
// RFC 5321 §4.2.3 "553 Requested action not taken: mailbox name not
// allowed", with X.1.3/X.1.7 as for syntax errors. 553 rather than 501
// because the command is well formed; it is the mailbox we will not take.
func routingErr(opt Options, msg string) *Error {
	return &Error{Code: 553, Enhanced: mailboxCode(opt), Msg: msg}
}

// tooLongErr: RFC 5321 §4.5.3.1 gives "501 Path too long" as the reply for
// exceeded size limits; RFC 3463 §3.6 X.5.4 "Invalid command arguments"
// covers arguments that are out of range.
func tooLongErr(msg string) *Error {
	return &Error{Code: 501, Enhanced: [3]int{5, 5, 4}, Msg: msg}
}

// nonASCIIErr: RFC 6531 §3.5 answers a non-ASCII address without SMTPUTF8
// with 553 and X.6.7 "Non-ASCII addresses not permitted for that
// sender/recipient" (added to the RFC 5248 registry by RFC 6531 §4).
func nonASCIIErr() *Error {
	return &Error{Code: 553, Enhanced: [3]int{5, 6, 7}, Msg: "Non-ASCII address without SMTPUTF8"}
}

// mailboxCode is X.1.7 for the sender and X.1.3 for a recipient.
func mailboxCode(opt Options) [3]int {
	if opt.Sender {
		return [3]int{5, 1, 7}
	}
	return [3]int{5, 1, 3}
}

// Parse parses s, an RFC 5321 Mailbox without angle brackets, as go-smtp
// hands it to the session or as written in a configuration file. The null
// sender "<>" is the caller's business (it is only valid in MAIL).
func Parse(s string, opt Options) (Address, error) {
	if err := checkBytes(s, opt); err != nil {
		return Address{}, err
	}
	if len(s)+2 > MaxPath {
		return Address{}, tooLongErr(fmt.Sprintf("Path too long (max %d octets)", MaxPath))
	}
	if s == "" {
		return Address{}, syntaxErr(opt, "Empty address")
	}
	// RFC 5321 §4.1.2 and Appendix C: source routes are obsolete; we refuse
	// them rather than silently dropping the route as go-smtp does.
	if s[0] == '@' {
		return Address{}, routingErr(opt, "Source routes are not accepted")
	}
	if opt.Postmaster && strings.EqualFold(s, "postmaster") {
		return Address{Local: s}, nil
	}
	rawLocal, local, rest, err := splitLocal(s, opt)
	if err != nil {
		return Address{}, err
	}
	if len(rawLocal) > MaxLocal {
		return Address{}, tooLongErr(fmt.Sprintf("Local part too long (max %d octets)", MaxLocal))
	}
	if strings.Contains(rest, "@") {
		return Address{}, routingErr(opt, "More than one @ in address")
	}
	// "user@example.com." names the same domain as "user@example.com":
	// the root's dot (RFC 1034 §3.1). RFC 5321's Domain has no room for
	// it, but clients write it, and Postfix's trivial-rewrite strips it
	// and accepts the address; so one trailing dot is dropped here, and
	// every rule and record then sees the one spelling. Two dots, or a
	// dot alone, are still refused.
	if len(rest) > 1 && rest[0] != '[' && strings.HasSuffix(rest, ".") && !strings.HasSuffix(rest, "..") {
		rest = rest[:len(rest)-1]
	}
	domain, err := ParseDomain(rest, opt)
	if err != nil {
		return Address{}, err
	}
	if len(rawLocal)+1+len(domain)+2 > MaxPath {
		// A decoded local part is longer once quoted again.
		return Address{}, tooLongErr(fmt.Sprintf("Path too long (max %d octets)", MaxPath))
	}
	return Address{Local: local, Domain: domain}, nil
}

// checkBytes refuses what no part of an address may contain: control
// characters (NUL, CR and LF among them: header and command injection),
// invalid UTF-8, and non-ASCII outside SMTPUTF8.
func checkBytes(s string, opt Options) error {
	ascii := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == 0x7f {
			return syntaxErr(opt, "Control character in address")
		}
		if c >= 0x80 {
			ascii = false
		}
	}
	if ascii {
		return nil
	}
	if !utf8.ValidString(s) {
		return syntaxErr(opt, "Invalid UTF-8 in address")
	}
	for _, r := range s {
		if r >= 0x80 && r <= 0x9f { // C1 controls
			return syntaxErr(opt, "Control character in address")
		}
	}
	if !opt.SMTPUTF8 {
		return nonASCIIErr()
	}
	return nil
}

// splitLocal separates the local part from "@domain". It returns the local
// part as written (for the length limit), decoded, and the text after "@".
func splitLocal(s string, opt Options) (raw, local, rest string, err error) {
	if opt.Decoded {
		return splitDecoded(s, opt)
	}
	if s[0] == '"' {
		local, n, err := unquote(s, opt)
		if err != nil {
			return "", "", "", err
		}
		if err := checkLocal(local, opt); err != nil {
			return "", "", "", err
		}
		raw, rest = s[:n], s[n:]
		if !strings.HasPrefix(rest, "@") {
			return "", "", "", syntaxErr(opt, "Expected @ after quoted local part")
		}
		return raw, local, rest[1:], nil
	}
	at := strings.LastIndexByte(s, '@')
	if at < 0 {
		return "", "", "", syntaxErr(opt, "Address has no @domain")
	}
	local = s[:at]
	if err := checkLocal(local, opt); err != nil {
		return "", "", "", err
	}
	if !isDotString(local) {
		return "", "", "", syntaxErr(opt, "Bad local part syntax")
	}
	return local, local, s[at+1:], nil
}

// splitDecoded is splitLocal for a local part go-smtp already unquoted.
// checkBytes has refused control characters, so what is left is qtextSMTP
// or a quoted-pair's character; the length limit applies to the local part
// as it will be written again (quoted if need be).
func splitDecoded(s string, opt Options) (raw, local, rest string, err error) {
	at := strings.LastIndexByte(s, '@')
	if at < 0 {
		return "", "", "", syntaxErr(opt, "Address has no @domain")
	}
	local = s[:at]
	if err := checkLocal(local, opt); err != nil {
		return "", "", "", err
	}
	raw = local
	if !isDotString(local) {
		raw = quote(local)
	}
	return raw, local, s[at+1:], nil
}

// checkLocal applies the rules that hold however the local part was
// written: not empty, and none of the routing characters (go-smtp has
// already stripped the quotes that made them harmless).
func checkLocal(local string, opt Options) error {
	switch {
	case local == "":
		return syntaxErr(opt, "Empty local part")
	case strings.Contains(local, "@"):
		return routingErr(opt, "@ in local part is not accepted")
	case strings.ContainsAny(local, "%!"):
		return routingErr(opt, "% and ! routing is not accepted")
	}
	return nil
}

// unquote decodes the Quoted-string at the start of s (RFC 5321 §4.1.2:
// qtextSMTP is %d32-33 / %d35-91 / %d93-126, quoted-pairSMTP is "\" followed
// by %d32-126; RFC 6531 §3.3 adds UTF8-non-ascii to qtextSMTP). It returns
// the decoded text and the length consumed, closing quote included.
func unquote(s string, opt Options) (string, int, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			return b.String(), i + 1, nil
		case c == '\\':
			i++
			if i >= len(s) || s[i] < 32 || s[i] > 126 {
				return "", 0, syntaxErr(opt, "Bad quoted-pair in local part")
			}
			b.WriteByte(s[i])
		default:
			// checkBytes already refused controls and, without SMTPUTF8,
			// non-ASCII; what is left is qtextSMTP.
			b.WriteByte(c)
		}
	}
	return "", 0, syntaxErr(opt, "Unterminated quoted local part")
}

// isDotString reports whether s is an RFC 5321 Dot-string: atoms of atext
// (RFC 5322 §3.2.3, extended with UTF8-non-ascii by RFC 6531 §3.3) joined by
// single dots.
func isDotString(s string) bool {
	if s == "" {
		return false
	}
	for atom := range strings.SplitSeq(s, ".") {
		if atom == "" {
			return false
		}
		for _, r := range atom {
			if !isAtext(r) {
				return false
			}
		}
	}
	return true
}

func isAtext(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	case r >= 0x80:
		return r != utf8.RuneError && !unicode.IsControl(r)
	}
	return strings.ContainsRune("!#$%&'*+-/=?^_`{|}~", r)
}

// quote writes local as a Quoted-string, escaping only '"' and '\'.
func quote(local string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(local); i++ {
		if local[i] == '"' || local[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(local[i])
	}
	b.WriteByte('"')
	return b.String()
}

// ParseDomain parses an RFC 5321 Domain or address-literal and returns it in
// the form used for routing: lowercased, literals canonical.
func ParseDomain(s string, opt Options) (string, error) {
	if err := checkBytes(s, opt); err != nil {
		return "", err
	}
	if len(s) > MaxDomain && (isASCII(s) || len(s) > 4*MaxDomain) {
		// A name with U-labels is held to the limit in its A-label form,
		// as its labels are (checkLabel), by IDNA's registration profile
		// below; a command line's own limits bound it on the wire.
		return "", tooLongErr(fmt.Sprintf("Domain too long (max %d octets)", MaxDomain))
	}
	if s == "" {
		return "", syntaxErr(opt, "Empty domain")
	}
	if s[0] == '[' {
		return parseLiteral(s, opt)
	}
	idn := false
	for l := range strings.SplitSeq(s, ".") {
		if err := checkLabel(l, opt); err != nil {
			return "", err
		}
		idn = idn || !isASCII(l) || len(l) >= 4 && strings.EqualFold(l[:4], "xn--")
	}
	// The bidi rule (RFC 5893 §2) applies to the whole name, so the whole
	// name is checked, once its labels passed the checks above.
	if idn {
		if _, err := idna.Registration.ToASCII(strings.ToLower(s)); err != nil {
			return "", syntaxErr(opt, "Bad domain: not a valid internationalised domain name")
		}
	}
	// RFC 3696 §2 (a TLD is never all-numeric) and RFC 1123 §2.1 (a name
	// must not look like a dotted number): refusing a last label that does
	// not start with a letter stops 127.0.0.1 and 0x7f000001 written as
	// domains, which some resolvers (inet_aton) would take as addresses.
	// An A-label is judged by the U-label it stands for, so that both
	// spellings of one name get the same answer.
	last := strings.ToLower(s[strings.LastIndexByte(s, '.')+1:])
	if strings.HasPrefix(last, "xn--") {
		// Only an A-label decodes (and the decoder allocates for any
		// label: this runs for every MAIL and RCPT).
		if u, ok := decodeALabel(last); ok {
			last = u
		}
	}
	if first, _ := utf8.DecodeRuneInString(last); !unicode.IsLetter(first) {
		return "", syntaxErr(opt, "Bad domain: the last label must start with a letter")
	}
	return strings.ToLower(s), nil
}

// checkLabel validates one label: RFC 1035 §2.3.1 LDH (letters, digits,
// hyphens; no hyphen at either end), at most 63 octets (for a U-label,
// its A-label's); RFC 5891 §4.2.3.1: "--" in positions 3 and 4 is
// reserved, and only "xn--" A-labels that decode to a U-label may use it.
// Non-ASCII characters are left to the IDNA2008 check of the whole name
// (ParseDomain).
func checkLabel(l string, opt Options) error {
	if l == "" {
		return syntaxErr(opt, "Bad domain: empty label")
	}
	if len(l) > maxLabel && isASCII(l) {
		// A U-label's limit is that of its A-label (RFC 5890 §2.3.2.1),
		// which IDNA's registration profile checks with the whole name
		// (ParseDomain): sixteen four-octet characters are 64 octets of
		// UTF-8 and a 26-octet A-label.
		return syntaxErr(opt, fmt.Sprintf("Bad domain: label longer than %d octets", maxLabel))
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return syntaxErr(opt, "Bad domain: label starts or ends with a hyphen")
	}
	for _, r := range l {
		ok := r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r >= 0x80
		if !ok {
			return syntaxErr(opt, "Bad domain: invalid character")
		}
	}
	if len(l) >= 4 && l[2:4] == "--" {
		if !strings.EqualFold(l[:2], "xn") {
			return syntaxErr(opt, "Bad domain: reserved label")
		}
		if _, ok := decodeALabel(strings.ToLower(l)); !ok {
			return syntaxErr(opt, "Bad domain: invalid A-label")
		}
	}
	return nil
}

// decodeALabel returns the U-label an "xn--" label encodes, if it is a
// valid A-label: valid Punycode (RFC 3492) of a valid IDNA2008 label that
// needs the encoding (has non-ASCII; RFC 5890 §2.3.2.1).
func decodeALabel(l string) (string, bool) {
	u, err := idna.Registration.ToUnicode(l)
	if err != nil || isASCII(u) {
		return "", false
	}
	return u, true
}

// isASCII reports whether s is plain US-ASCII.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// parseLiteral accepts the two address literals RFC 5321 §4.1.3 defines
// for use: [IPv4] in strict dotted-decimal and [IPv6:...] (no zone). The
// General-address-literal ("[tag:...]") has no registered tags we could
// route, so it is refused.
func parseLiteral(s string, opt Options) (string, error) {
	if !strings.HasSuffix(s, "]") {
		return "", syntaxErr(opt, "Bad address literal")
	}
	inner := s[1 : len(s)-1]
	if len(inner) > 5 && strings.EqualFold(inner[:5], "IPv6:") {
		ip, err := netip.ParseAddr(inner[5:])
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return "", syntaxErr(opt, "Bad IPv6 address literal")
		}
		return "[IPv6:" + ip.String() + "]", nil
	}
	ip, err := netip.ParseAddr(inner)
	if err != nil || !ip.Is4() {
		return "", syntaxErr(opt, "Bad address literal")
	}
	return "[" + ip.String() + "]", nil
}
