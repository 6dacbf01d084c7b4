package sendapi

import (
	"bytes"
	"encoding/base64"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"strings"
	"testing"
	"time"
)

// TestCompose: the JSON form becomes a well-formed MIME message that
// net/mail and mime/multipart read back as it was given.
func TestCompose(t *testing.T) {
	m := &Message{From: "Zoë <z@shop.example>", To: []string{"a@x.example"}, Cc: []string{"Bee <b@x.example>"},
		Bcc: []string{"c@x.example"}, Subject: "Grüße " + strings.Repeat("long words ", 20), Text: "plain\nsecond line",
		HTML: "<p>html</p>", Headers: map[string]string{"Reply-To": "help@shop.example", "Message-ID": "<given@shop.example>"},
		Attachments: []Attachment{{Filename: "a b.txt", ContentType: "text/plain", Content: []byte("attached\n")}}}
	msg, env, err := compose(m, "relay.test", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if env.from != "z@shop.example" || strings.Join(env.to, ",") != "a@x.example,b@x.example,c@x.example" ||
		env.messageID != "<given@shop.example>" || env.utf8 {
		t.Errorf("envelope %+v", env)
	}
	for _, line := range strings.Split(string(msg), "\r\n") {
		if len(line) > 998 || strings.ContainsAny(line, "\r\n") {
			t.Errorf("bad line %q", line)
		}
	}
	pm, err := mail.ReadMessage(bytes.NewReader(msg))
	if err != nil {
		t.Fatal(err)
	}
	dec := new(mime.WordDecoder)
	subj, _ := dec.DecodeHeader(pm.Header.Get("Subject"))
	if subj != m.Subject || pm.Header.Get("Bcc") != "" || pm.Header.Get("Reply-To") != "help@shop.example" {
		t.Errorf("header %v (subject %q)", pm.Header, subj)
	}
	if from, err := pm.Header.AddressList("From"); err != nil || from[0].Name != "Zoë" {
		t.Errorf("From %v %v", from, err)
	}
	_, params, _ := mime.ParseMediaType(pm.Header.Get("Content-Type"))
	mr := multipart.NewReader(pm.Body, params["boundary"])
	var types []string
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, p.Header.Get("Content-Type"))
		if p.FileName() == "a b.txt" {
			b, _ := io.ReadAll(base64.NewDecoder(base64.StdEncoding, p))
			if string(b) != "attached\n" || p.Header.Get("Content-Transfer-Encoding") != "base64" {
				t.Errorf("attachment %q", b)
			}
		}
	}
	if len(types) != 2 || !strings.HasPrefix(types[0], "multipart/alternative") || types[1] != "text/plain" {
		t.Errorf("parts %q", types)
	}
}

// FuzzCompose: whatever the strings, compose refuses them or writes a
// message whose header section net/mail reads, with no field the caller
// smuggled in through a line break.
func FuzzCompose(f *testing.F) {
	f.Add("a@b.example", "c@d.example", "subject", "X-Custom", "value", "tag", "text")
	f.Add("\"x\r\ny\" <a@b.example>", "c@d.example", "s\r\nBcc: e@f.example", "X-A", "v\nBcc: e@f.example", "t\r", "")
	f.Fuzz(func(t *testing.T, from, to, subject, hname, hvalue, tag, text string) {
		m := &Message{From: from, To: []string{to}, Subject: subject, Headers: map[string]string{hname: hvalue}, Tag: tag, Text: text}
		msg, _, err := compose(m, "relay.test", time.Unix(0, 0))
		if err != nil {
			return
		}
		pm, err := mail.ReadMessage(bytes.NewReader(msg))
		if err != nil {
			t.Fatalf("unreadable message: %v\n%q", err, msg)
		}
		if pm.Header.Get("Bcc") != "" {
			t.Fatalf("a Bcc field was smuggled in:\n%q", msg)
		}
		head, _, _ := bytes.Cut(msg, []byte("\r\n\r\n"))
		if bytes.Contains(bytes.ReplaceAll(head, []byte("\r\n"), nil), []byte("\n")) ||
			bytes.Contains(bytes.ReplaceAll(head, []byte("\r\n"), nil), []byte("\r")) {
			t.Fatalf("bare CR or LF in the header:\n%q", head)
		}
	})
}

// TestComposeUTF8Address: an address that is not ASCII makes the
// submission SMTPUTF8 (RFC 6531) and is written as it is in the header
// (RFC 6532), the display name in an encoded word.
func TestComposeUTF8Address(t *testing.T) {
	msg, env, err := compose(&Message{From: "Zoë <zoë@bücher.example>", To: []string{"a@x.example"}, Text: "hi"},
		"relay.test", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !env.utf8 || env.from != "zoë@bücher.example" || !bytes.Contains(msg, []byte("From: =?utf-8?q?Zo=C3=AB?= <zoë@bücher.example>\r\n")) {
		t.Errorf("envelope %+v, message:\n%s", env, msg)
	}
}
