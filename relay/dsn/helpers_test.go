package dsn

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"net/textproto"
	"testing"
	"time"
)

// The helpers below parse a DSN with the standard library only (net/mail,
// mime/multipart, net/textproto), independently of the code under test.

var t0 = time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)

const origMsg = "Received: from client.example.org (client.example.org [192.0.2.7])\r\n" +
	"\tby relay.example.org with ESMTPSA; Sat, 14 Mar 2026 09:26:50 +0000\r\n" +
	"From: Alice <alice@example.org>\r\n" +
	"To: Bob <bob@example.com>\r\n" +
	"Subject: Quarterly numbers\r\n" +
	"Message-ID: <orig.42@example.org>\r\n" +
	"Date: Sat, 14 Mar 2026 09:26:49 +0000\r\n" +
	"\r\n" +
	"Hi Bob,\r\n" +
	"the numbers are attached.\r\n"

// report returns a realistic Report for action with one recipient.
func report(a Action) Report {
	r := Report{
		ReportingMTA: "relay.example.org",
		To:           "alice@example.org",
		EnvID:        "QQ314159",
		Arrival:      t0,
		Now:          t0.Add(2 * time.Minute),
		MessageID:    "20260314092853.dsn.1@relay.example.org",
		Original:     []byte(origMsg),
	}
	rc := Recipient{Final: "bob@example.com", Original: "rfc822;Bob@example.com", Action: a,
		RemoteMTA: "mx1.example.com", LastAttempt: t0.Add(time.Minute)}
	switch a {
	case Failed:
		rc.Status = "5.1.1"
		rc.Diagnostic = "550 5.1.1 <bob@example.com>: Recipient address rejected: User unknown"
		rc.Explanation = "The address does not exist at the destination. Check it for typos, or ask the recipient for a current address."
	case Delayed:
		r.Now = t0.Add(4 * time.Hour)
		rc.Status = "4.7.1"
		rc.Diagnostic = "451 4.7.1 Greylisted, please try again later"
		rc.WillRetryUntil = t0.Add(5 * 24 * time.Hour)
		rc.Explanation = "The receiving server asked us to come back later, which is common for a first message."
	default:
		rc.Status = "2.0.0"
		rc.Diagnostic = "250 2.0.0 Ok: queued as 4Y2B3C"
		rc.Explanation = "Nothing to do."
	}
	r.Recipients = []Recipient{rc}
	return r
}

type parsedPart struct {
	mediaType string
	header    textproto.MIMEHeader
	body      []byte // transfer-decoded (quoted-printable is undone)
}

type parsed struct {
	header mail.Header
	params map[string]string
	parts  []parsedPart
}

// parseDSN parses msg as a multipart/report message.
func parseDSN(msg []byte) (*parsed, error) {
	m, err := mail.ReadMessage(bytes.NewReader(msg))
	if err != nil {
		return nil, fmt.Errorf("read message: %w", err)
	}
	mt, params, err := mime.ParseMediaType(m.Header.Get("Content-Type"))
	if err != nil {
		return nil, fmt.Errorf("content-type: %w", err)
	}
	if mt != "multipart/report" {
		return nil, fmt.Errorf("media type %q", mt)
	}
	p := &parsed{header: m.Header, params: params}
	mr := multipart.NewReader(m.Body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("part %d: %w", len(p.parts), err)
		}
		body, err := io.ReadAll(part)
		if err != nil {
			return nil, fmt.Errorf("part %d body: %w", len(p.parts), err)
		}
		pmt, _, err := mime.ParseMediaType(part.Header.Get("Content-Type"))
		if err != nil {
			return nil, fmt.Errorf("part %d content-type: %w", len(p.parts), err)
		}
		p.parts = append(p.parts, parsedPart{mediaType: pmt, header: part.Header, body: body})
	}
	return p, nil
}

// parseStatus splits a delivery-status body into its per-message fields and
// per-recipient groups.
func parseStatus(body []byte) (textproto.MIMEHeader, []textproto.MIMEHeader, error) {
	r := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(body, "\r\n"...))))
	msg, err := r.ReadMIMEHeader()
	if err != nil {
		return nil, nil, fmt.Errorf("per-message fields: %w", err)
	}
	var rcpts []textproto.MIMEHeader
	for {
		h, err := r.ReadMIMEHeader()
		if err == io.EOF && len(h) == 0 {
			return msg, rcpts, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("recipient %d: %w", len(rcpts), err)
		}
		rcpts = append(rcpts, h)
	}
}

// checkWire asserts the line-level invariants of any DSN: CRLF only, no NUL,
// every line under 998 octets, 7-bit when ascii.
func checkWire(tb testing.TB, msg []byte, ascii bool) {
	tb.Helper()
	if !bytes.HasSuffix(msg, []byte("\r\n")) {
		tb.Errorf("message does not end with CRLF")
	}
	for i, c := range msg {
		switch {
		case c == 0:
			tb.Fatalf("NUL at offset %d", i)
		case c == '\r' && (i+1 >= len(msg) || msg[i+1] != '\n'):
			tb.Fatalf("bare CR at offset %d: %q", i, around(msg, i))
		case c == '\n' && (i == 0 || msg[i-1] != '\r'):
			tb.Fatalf("bare LF at offset %d: %q", i, around(msg, i))
		case ascii && c >= 0x80:
			tb.Fatalf("8-bit octet in ASCII DSN at offset %d: %q", i, around(msg, i))
		}
	}
	for n, l := range bytes.Split(msg, []byte("\r\n")) {
		if len(l) >= 998 {
			tb.Fatalf("line %d has %d octets", n+1, len(l))
		}
	}
}

func around(msg []byte, i int) []byte {
	return msg[max(0, i-40):min(len(msg), i+40)]
}

// mustCompose composes r and checks the wire invariants and the MIME
// structure.
func mustCompose(tb testing.TB, r Report) (*parsed, []byte) {
	tb.Helper()
	out, err := Compose(r)
	if err != nil {
		tb.Fatalf("Compose: %v", err)
	}
	checkWire(tb, out, !r.UTF8)
	p, err := parseDSN(out)
	if err != nil {
		tb.Fatalf("parse: %v\n%s", err, out)
	}
	return p, out
}

// mustStatus returns the parsed delivery-status part (the second part).
func mustStatus(tb testing.TB, p *parsed) (textproto.MIMEHeader, []textproto.MIMEHeader) {
	tb.Helper()
	if len(p.parts) < 2 {
		tb.Fatalf("%d parts, want at least 2", len(p.parts))
	}
	msg, rcpts, err := parseStatus(p.parts[1].body)
	if err != nil {
		tb.Fatalf("parse status: %v\n%s", err, p.parts[1].body)
	}
	return msg, rcpts
}
