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
	helo     string
	ip       netip.Addr
	host     string
	tls      *tls.ConnectionState
	auth     bool
	smtputf8 bool
	rcpt     string // the only recipient, or ""
	date     time.Time
}

// receivedHeader returns the header, CRLF line ends, folded with tabs.
func receivedHeader(ri receivedInfo) []byte {
	var b bytes.Buffer
	b.WriteString("Received: from ")
	if helo, ok := validHelo(ri.helo); ok {
		b.WriteString(helo + " (" + ipLiteral(ri.ip) + ")")
	} else {
		b.WriteString("unknown (" + ipLiteral(ri.ip) + ") (helo=" + sanitizeHelo(ri.helo) + ")")
	}
	if ri.tls != nil {
		b.WriteString("\r\n\t(using " + tls.VersionName(ri.tls.Version) + " with cipher " +
			tls.CipherSuiteName(ri.tls.CipherSuite) + ")")
	}
	b.WriteString("\r\n\tby " + sanitizeHelo(ri.host) + " (greyrelay) with " + protocolKeyword(ri))
	if ri.rcpt != "" {
		b.WriteString("\r\n\tfor <" + ri.rcpt + ">")
	}
	// RFC 5322 §3.3 date-time.
	b.WriteString("; " + ri.date.Format("Mon, 02 Jan 2006 15:04:05 -0700") + "\r\n")
	return b.Bytes()
}

// protocolKeyword is the "with" value: ESMTP plus S for TLS and A for AUTH
// (RFC 3848), or UTF8SMTP with the same suffixes for SMTPUTF8 transactions
// (RFC 6531 §4.3).
func protocolKeyword(ri receivedInfo) string {
	p := "ESMTP"
	if ri.smtputf8 {
		p = "UTF8SMTP"
	}
	if ri.tls != nil {
		p += "S"
	}
	if ri.auth {
		p += "A"
	}
	return p
}

// ipLiteral writes the client address as an RFC 5321 §4.1.3 literal.
func ipLiteral(ip netip.Addr) string {
	if ip.Is6() {
		return "[IPv6:" + ip.String() + "]"
	}
	return "[" + ip.String() + "]"
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

// countReceived counts Received fields in the header section of msg (up to
// the first empty line). RFC 5321 §6.3: a loop shows as many of them.
func countReceived(msg []byte) int {
	n := 0
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
		name, _, ok := bytes.Cut(line, []byte(":"))
		// RFC 5322 §4.5 (obsolete syntax) allows blanks before the colon.
		if ok && bytes.EqualFold(bytes.TrimRight(name, " \t"), []byte("Received")) {
			n++
		}
	}
	return n
}
