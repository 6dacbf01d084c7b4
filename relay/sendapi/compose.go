package sendapi

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"net/textproto"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/greyrelay/greyrelay/internal/safetext"
)

// Message is the JSON form of a message (POST with application/json).
type Message struct {
	From        string            `json:"from"`
	To          []string          `json:"to"`
	Cc          []string          `json:"cc"`
	Bcc         []string          `json:"bcc"`
	Subject     string            `json:"subject"`
	Text        string            `json:"text"`
	HTML        string            `json:"html"`
	Attachments []Attachment      `json:"attachments"`
	Headers     map[string]string `json:"headers"`
	Tag         string            `json:"tag"`
	EnvID       string            `json:"envid"`
	RequireTLS  bool              `json:"require_tls"`
}

// Attachment is one attached file; Content is base64 in the JSON.
type Attachment struct {
	Filename    string `json:"filename"`
	ContentType string `json:"content_type"`
	Content     []byte `json:"content"`
}

// TagHeader is the header field that carries a message's tag (events and
// queue lookups show it).
const TagHeader = "X-Greyrelay-Tag"

// reserved are header fields the JSON form writes itself: a "headers"
// entry may not set them (From, To, Cc and Subject have fields of their
// own; Bcc is never written, RFC 5322 §3.6.3 lets it be left out).
var reserved = []string{"From", "To", "Cc", "Bcc", "Subject", "Date", "Mime-Version", "Content-Type",
	"Content-Transfer-Encoding", "Received", "Return-Path", "Dkim-Signature", "X-Greyrelay-Tag"}

// inputError is a mistake in the request: 400 with its text.
type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }

func badInput(format string, args ...any) error { return &inputError{fmt.Sprintf(format, args...)} }

// envelope is what composing a JSON message yields besides its text.
type envelope struct {
	from      string
	to        []string
	messageID string
	utf8      bool // an address needs SMTPUTF8 (RFC 6531)
}

// compose builds the RFC 5322 message for m: header fields folded, text in
// quoted-printable UTF-8, attachments in base64, multipart/alternative
// for text and HTML and multipart/mixed around attachments (RFC 2046).
func compose(m *Message, host string, now time.Time) ([]byte, envelope, error) {
	var env envelope
	from, err := mail.ParseAddress(m.From)
	if err != nil {
		return nil, env, badInput("from: %q is not an address: %v", m.From, err)
	}
	env.from = from.Address
	var hdr bytes.Buffer
	writeField(&hdr, "From", from.String())
	for _, f := range []struct {
		name string
		list []string
	}{{"To", m.To}, {"Cc", m.Cc}, {"Bcc", m.Bcc}} {
		shown := make([]string, 0, len(f.list))
		for _, a := range f.list {
			pa, err := mail.ParseAddress(a)
			if err != nil {
				return nil, env, badInput("%s: %q is not an address: %v", strings.ToLower(f.name), a, err)
			}
			env.to = append(env.to, pa.Address)
			shown = append(shown, pa.String())
		}
		if len(shown) > 0 && f.name != "Bcc" {
			writeField(&hdr, f.name, strings.Join(shown, ", "))
		}
	}
	if len(env.to) == 0 {
		return nil, env, badInput("no recipient: give to, cc or bcc")
	}
	for _, a := range append([]string{env.from}, env.to...) {
		if !isASCII(a) {
			env.utf8 = true
		}
	}
	if m.Subject != "" {
		if err := checkValue("subject", m.Subject); err != nil {
			return nil, env, err
		}
		writeField(&hdr, "Subject", mime.QEncoding.Encode("utf-8", m.Subject))
	}
	writeField(&hdr, "Date", now.Format(time.RFC1123Z))
	if err := extraHeaders(&hdr, m, host, &env); err != nil {
		return nil, env, err
	}
	writeField(&hdr, "MIME-Version", "1.0")
	body, err := mimeBody(&hdr, m)
	if err != nil {
		return nil, env, err
	}
	return body, env, nil
}

// extraHeaders writes the tag, the caller's header fields (sorted, for a
// stable message) and a Message-ID unless one was given.
func extraHeaders(hdr *bytes.Buffer, m *Message, host string, env *envelope) error {
	if m.Tag != "" {
		if err := checkValue("tag", m.Tag); err != nil {
			return err
		}
		writeField(hdr, TagHeader, m.Tag)
	}
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		name := textproto.CanonicalMIMEHeaderKey(k)
		if !validFieldName(k) {
			return badInput("headers: %q is not a header field name", k)
		}
		if slices.Contains(reserved, name) {
			return badInput("headers: %s is written by the API (use the message's own fields)", k)
		}
		if err := checkValue("headers."+k, m.Headers[k]); err != nil {
			return err
		}
		if name == "Message-Id" {
			env.messageID = strings.TrimSpace(m.Headers[k])
		}
		writeField(hdr, k, mime.QEncoding.Encode("utf-8", m.Headers[k]))
	}
	if env.messageID == "" {
		b := make([]byte, 16)
		rand.Read(b)
		env.messageID = "<" + hex.EncodeToString(b) + "@" + host + ">"
		writeField(hdr, "Message-ID", env.messageID)
	}
	return nil
}

// mimeBody appends the content header fields and the body to hdr.
func mimeBody(hdr *bytes.Buffer, m *Message) ([]byte, error) {
	var parts []part
	switch {
	case m.Text != "" && m.HTML != "":
		alt, err := multipartOf("alternative", []part{textPart("plain", m.Text), textPart("html", m.HTML)})
		if err != nil {
			return nil, err
		}
		parts = append(parts, alt)
	case m.HTML != "":
		parts = append(parts, textPart("html", m.HTML))
	default:
		parts = append(parts, textPart("plain", m.Text))
	}
	for i, a := range m.Attachments {
		p, err := attachmentPart(i, a)
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
	}
	top := parts[0]
	if len(parts) > 1 {
		var err error
		if top, err = multipartOf("mixed", parts); err != nil {
			return nil, err
		}
	}
	for _, f := range top.header {
		writeField(hdr, f[0], f[1])
	}
	hdr.WriteString("\r\n")
	hdr.Write(top.body)
	return hdr.Bytes(), nil
}

// part is one MIME entity: its header fields and its encoded body.
type part struct {
	header [][2]string
	body   []byte
}

func textPart(subtype, text string) part {
	var b bytes.Buffer
	w := quotedprintable.NewWriter(&b)
	w.Write([]byte(strings.ReplaceAll(text, "\r\n", "\n")))
	w.Close()
	if b.Len() > 0 && !bytes.HasSuffix(b.Bytes(), []byte("\r\n")) {
		b.WriteString("\r\n")
	}
	return part{header: [][2]string{{"Content-Type", "text/" + subtype + "; charset=utf-8"},
		{"Content-Transfer-Encoding", "quoted-printable"}}, body: b.Bytes()}
}

func attachmentPart(i int, a Attachment) (part, error) {
	if a.Filename == "" {
		return part{}, badInput("attachments[%d]: filename is required", i)
	}
	if err := checkValue(fmt.Sprintf("attachments[%d].filename", i), a.Filename); err != nil {
		return part{}, err
	}
	ct := a.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	if _, _, err := mime.ParseMediaType(ct); err != nil || strings.ContainsAny(ct, "\r\n") {
		return part{}, badInput("attachments[%d].content_type: %q is not a media type", i, ct)
	}
	enc := base64.StdEncoding.EncodeToString(a.Content)
	var b bytes.Buffer
	for len(enc) > 76 {
		b.WriteString(enc[:76] + "\r\n")
		enc = enc[76:]
	}
	b.WriteString(enc + "\r\n")
	disp := mime.FormatMediaType("attachment", map[string]string{"filename": a.Filename})
	return part{header: [][2]string{{"Content-Type", ct}, {"Content-Transfer-Encoding", "base64"},
		{"Content-Disposition", disp}}, body: b.Bytes()}, nil
}

func multipartOf(subtype string, parts []part) (part, error) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		for _, f := range p.header {
			h.Set(f[0], f[1])
		}
		pw, err := w.CreatePart(h)
		if err != nil {
			return part{}, err
		}
		pw.Write(p.body)
	}
	w.Close()
	b.WriteString("\r\n")
	return part{header: [][2]string{{"Content-Type", "multipart/" + subtype + "; boundary=\"" + w.Boundary() + "\""}},
		body: b.Bytes()}, nil
}

// writeField writes "Name: value", folded before a space where a line
// would pass 78 characters (RFC 5322 §2.2.3).
func writeField(b *bytes.Buffer, name, value string) {
	line := name + ":"
	for i, w := range strings.Split(value, " ") {
		if i > 0 && len(line)+1+len(w) > 78 && strings.TrimSpace(line) != "" {
			b.WriteString(line + "\r\n")
			line = ""
		}
		line += " " + w
	}
	b.WriteString(line + "\r\n")
}

// validFieldName: RFC 5322 §3.6.8, printable ASCII but ':'.
func validFieldName(s string) bool {
	if s == "" || len(s) > 76 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 33 || s[i] > 126 || s[i] == ':' {
			return false
		}
	}
	return true
}

// checkValue refuses control characters (a CR or LF would start a header
// field of the caller's choosing) and invalid UTF-8.
func checkValue(key, v string) error {
	if !utf8.ValidString(v) || strings.ContainsFunc(v, safetext.IsControl) {
		return badInput("%s: contains a control character or invalid UTF-8", key)
	}
	if len(v) > 900 {
		return badInput("%s: longer than 900 octets", key)
	}
	return nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
