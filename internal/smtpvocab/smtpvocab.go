// Package smtpvocab holds the SMTP words other packages share: a reply and
// its parser, the reader that takes one off a connection, enhanced status
// codes, the stage of the dialogue and the error for a failed TLS step. It
// is a leaf, like mox's smtp package: it imports only the standard library
// and internal/safetext, so relay/smtpclient, the classifier, relay/dsn,
// relay/probe and the test peers speak it without importing each other.
//
// Design notes:
//
//   - Parser is greyrelay's one SMTP reply parser. It is strict and does no
//     I/O; Read reads the lines under limits of its own (a peer may be
//     hostile) and hands them over, for relay/smtpclient and for tests that
//     talk SMTP by hand alike.
//   - Malformed input is a textproto.ProtocolError; the classifier treats it
//     as temporary.
//   - Reply text is kept as the peer sent it: sanitising is the job of
//     whoever prints or stores it (Reply.Error does, for its one line).
package smtpvocab

import (
	"fmt"
	"strconv"
	"strings"
)

// Stage is the step of the SMTP dialogue at which an attempt ended.
type Stage int

// The stages of one delivery attempt, in dialogue order.
const (
	StageDNS Stage = iota
	StageConnect
	StageGreeting
	StageEHLO
	StageSTARTTLS
	StageAuth
	StageMAIL
	StageRCPT
	StageDATA
	StageEndOfData
)

var stageNames = [...]string{"dns", "connect", "greeting", "ehlo", "starttls", "auth", "mail", "rcpt", "data", "end-of-data"}

// String returns the stage's lower-case name, e.g. "rcpt".
func (s Stage) String() string {
	if s >= 0 && int(s) < len(stageNames) {
		return stageNames[s]
	}
	return fmt.Sprintf("stage(%d)", int(s))
}

// TLSError wraps any failure during STARTTLS, the handshake or certificate
// verification, so that the stage is unambiguous whatever the cause.
type TLSError struct{ Err error }

// Error implements error.
func (e *TLSError) Error() string { return fmt.Sprintf("tls: %v", e.Err) }

// Unwrap returns the underlying cause.
func (e *TLSError) Unwrap() error { return e.Err }

// ParseEnhanced parses an RFC 3463 enhanced status code: class 2, 4 or 5,
// then subject and detail of one to three digits each (RFC 3463 §2).
func ParseEnhanced(s string) ([3]int, bool) {
	var e [3]int
	parts := strings.Split(s, ".")
	if len(parts) != 3 || (parts[0] != "2" && parts[0] != "4" && parts[0] != "5") {
		return e, false
	}
	for i, p := range parts {
		if len(p) < 1 || len(p) > 3 || strings.Trim(p, "0123456789") != "" {
			return e, false
		}
		e[i], _ = strconv.Atoi(p)
	}
	return e, true
}

// NormEnhanced returns s in canonical form ("4.07.1" is "4.7.1"), or "" if
// it is not a valid enhanced status code.
func NormEnhanced(s string) string {
	if e, ok := ParseEnhanced(s); ok {
		return fmt.Sprintf("%d.%d.%d", e[0], e[1], e[2])
	}
	return ""
}
