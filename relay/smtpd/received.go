package smtpd

import (
	"bytes"
	"crypto/tls"
	"net/netip"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/relay/address"
)

// The Received header (RFC 5321 §4.4) greyrelay prepends to every message.
// It is built only from data we checked: the HELO name if it is a valid
// domain or address literal (otherwise a sanitised copy in a comment), the
// client's IP address, our hostname, the protocol keyword, the TLS version
// and cipher, and "for <rcpt>" only when there is exactly one recipient
// (more would disclose the other recipients, RFC 5321 §7.2). There is no
// "id" clause: the queue id does not exist before the commit, and the 250
// reply and the log carry it. The authenticated user is not shown (privacy;
// Postfix smtpd_sasl_authenticated_header is off by default too).

// receivedInfo is what the header says.
type receivedInfo struct {
	helo     string // as given
	heloOK   bool   // helo is a valid domain or address literal
	heloSafe string // sanitizeHelo(helo)
	ip       netip.Addr
	host     string // our hostname, sanitised
	tls      *tls.ConnectionState
	auth     bool
	smtputf8 bool
	rcpt     string // the only recipient, or ""
	date     time.Time
}

// appendReceived appends the header to b: CRLF line ends, folded with
// tabs. It is written straight into the message buffer (data.go).
func appendReceived(b []byte, ri receivedInfo) []byte {
	b = append(b, "Received: from "...)
	if ri.heloOK {
		b = append(b, ri.helo...)
		b = append(b, " ("...)
		b = appendIPLiteral(b, ri.ip)
		b = append(b, ')')
	} else {
		b = append(b, "unknown ("...)
		b = appendIPLiteral(b, ri.ip)
		b = append(b, ") (helo="...)
		b = append(b, ri.heloSafe...)
		b = append(b, ')')
	}
	if ri.tls != nil {
		b = append(b, "\r\n\t(using "...)
		b = append(b, tls.VersionName(ri.tls.Version)...)
		b = append(b, " with cipher "...)
		b = append(b, tls.CipherSuiteName(ri.tls.CipherSuite)...)
		b = append(b, ')')
	}
	b = append(b, "\r\n\tby "...)
	b = append(b, ri.host...)
	b = append(b, " (greyrelay) with "...)
	b = appendProtocol(b, ri)
	if ri.rcpt != "" {
		b = append(b, "\r\n\tfor <"...)
		b = append(b, ri.rcpt...)
		b = append(b, '>')
	}
	// RFC 5322 §3.3 date-time.
	b = append(b, "; "...)
	b = ri.date.AppendFormat(b, "Mon, 02 Jan 2006 15:04:05 -0700")
	return append(b, "\r\n"...)
}

// appendProtocol appends the "with" value: ESMTP plus S for TLS and A for
// AUTH (RFC 3848), or UTF8SMTP with the same suffixes for SMTPUTF8
// transactions (RFC 6531 §4.3).
func appendProtocol(b []byte, ri receivedInfo) []byte {
	if ri.smtputf8 {
		b = append(b, "UTF8SMTP"...)
	} else {
		b = append(b, "ESMTP"...)
	}
	if ri.tls != nil {
		b = append(b, 'S')
	}
	if ri.auth {
		b = append(b, 'A')
	}
	return b
}

// appendIPLiteral appends the client address as an RFC 5321 §4.1.3
// literal.
func appendIPLiteral(b []byte, ip netip.Addr) []byte {
	if ip.Is6() {
		b = append(b, "[IPv6:"...)
	} else {
		b = append(b, '[')
	}
	if !ip.IsValid() {
		b = append(b, ip.String()...) // "invalid IP", as String has it
	}
	b = ip.AppendTo(b)
	return append(b, ']')
}

// validHelo returns h if it is an ASCII domain or address literal.
func validHelo(h string) (string, bool) {
	if h == "" {
		return "", false
	}
	if _, err := address.ParseDomain(h, address.Options{}); err != nil {
		return "", false
	}
	return h, true
}

// sanitizeHelo keeps what may appear in a domain or literal (letters,
// digits, "-", ".", "_", ":", "[", "]"), replaces anything else with "_"
// and truncates, so the result is safe in a header comment and a log.
func sanitizeHelo(h string) string {
	if _, ok := validHelo(h); ok {
		return h
	}
	var b strings.Builder
	for i := 0; i < len(h) && b.Len() < 64; i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.IndexByte("-._:[]", c) >= 0:
			b.WriteByte(c)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "unknown"
	}
	return b.String()
}

// headerFacts is what intake learns from the header section.
type headerFacts struct {
	received    int  // Received fields
	tlsOptional bool // "TLS-Required: No" (RFC 8689 §5)
}

// scanHeader reads the header section of msg (up to the first empty line).
func scanHeader(msg []byte) headerFacts {
	var h headerFacts
	for len(msg) > 0 {
		line := msg
		if i := bytes.Index(msg, []byte("\r\n")); i >= 0 {
			line, msg = msg[:i], msg[i+2:]
		} else {
			msg = nil
		}
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		// RFC 5322 §4.5 (obsolete syntax) allows blanks before the colon.
		name = bytes.TrimRight(name, " \t")
		switch {
		case !ok:
		case bytes.EqualFold(name, []byte("Received")):
			h.received++
		case bytes.EqualFold(name, []byte("TLS-Required")):
			// RFC 8689 §5: the only defined value is "No", case-insensitive.
			h.tlsOptional = bytes.EqualFold(bytes.TrimSpace(value), []byte("No"))
		}
	}
	return h
}
