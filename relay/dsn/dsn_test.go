package dsn

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net/mail"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestComposeGolden(t *testing.T) {
	failed := report(Failed)
	// A second recipient with a multi-line reply and no ORCPT.
	failed.Recipients = append(failed.Recipients, Recipient{
		Final: "carol@example.net", Action: Failed, Status: "5.7.1",
		RemoteMTA:   "mx.example.net",
		Diagnostic:  "554-5.7.1 Message rejected as spam.\r\n554 5.7.1 See https://example.net/help",
		LastAttempt: t0.Add(time.Minute),
		Explanation: "The receiving server judged the message to be spam.",
	})
	for name, r := range map[string]Report{
		"failed":  failed,
		"delayed": report(Delayed),
		"relayed": report(Relayed),
	} {
		t.Run(name, func(t *testing.T) {
			_, out := mustCompose(t, r)
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("output differs from %s (run with -update after checking):\n%s", path, out)
			}
		})
	}
}

func TestComposeFields(t *testing.T) {
	for _, a := range []Action{Failed, Delayed, Relayed, Delivered} {
		t.Run(string(a), func(t *testing.T) {
			r := report(a)
			p, _ := mustCompose(t, r)

			h := p.header
			from, err := mail.ParseAddress(h.Get("From"))
			if err != nil || from.Name != "Mail Delivery System" || from.Address != "MAILER-DAEMON@relay.example.org" {
				t.Errorf("From = %q (%v)", h.Get("From"), err)
			}
			if to, err := mail.ParseAddress(h.Get("To")); err != nil || to.Address != r.To {
				t.Errorf("To = %q (%v)", h.Get("To"), err)
			}
			if d, err := h.Date(); err != nil || !d.Equal(r.Now) {
				t.Errorf("Date = %q (%v)", h.Get("Date"), err)
			}
			wantHdr := map[string]string{
				"Subject":        subject(a),
				"Message-Id":     "<" + r.MessageID + ">",
				"Auto-Submitted": "auto-replied",
				"Mime-Version":   "1.0",
			}
			for k, v := range wantHdr {
				if got := h.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if p.params["report-type"] != "delivery-status" {
				t.Errorf("report-type = %q", p.params["report-type"])
			}

			wantTypes := []string{"text/plain", "message/delivery-status", "text/rfc822-headers"}
			if len(p.parts) != len(wantTypes) {
				t.Fatalf("%d parts, want %d", len(p.parts), len(wantTypes))
			}
			for i, pt := range p.parts {
				if pt.mediaType != wantTypes[i] {
					t.Errorf("part %d type %q, want %q", i, pt.mediaType, wantTypes[i])
				}
			}

			msg, rcpts := mustStatus(t, p)
			checkFields(t, "per-message", msg, map[string]string{
				"Reporting-MTA":        "dns; relay.example.org",
				"Original-Envelope-Id": "QQ314159",
				"Arrival-Date":         date(t0),
			})
			if len(rcpts) != 1 {
				t.Fatalf("%d recipient groups, want 1", len(rcpts))
			}
			rc := r.Recipients[0]
			want := map[string]string{
				"Original-Recipient": "rfc822; Bob@example.com",
				"Final-Recipient":    "rfc822; bob@example.com",
				"Action":             string(a),
				"Status":             rc.Status,
				"Remote-MTA":         "dns; mx1.example.com",
				"Diagnostic-Code":    "smtp; " + rc.Diagnostic,
				"Last-Attempt-Date":  date(rc.LastAttempt),
				"Will-Retry-Until":   "",
			}
			if a == Delayed {
				want["Will-Retry-Until"] = date(rc.WillRetryUntil)
			}
			checkFields(t, "recipient", rcpts[0], want)

			human := string(p.parts[0].body)
			for _, s := range []string{"<bob@example.com>", rc.Diagnostic, "mx1.example.com", "Status: " + rc.Status,
				strings.Fields(rc.Explanation)[0], "headers of your message are attached"} {
				if !strings.Contains(human, s) {
					t.Errorf("human part lacks %q:\n%s", s, human)
				}
			}
			if a == Delayed && !strings.Contains(human, "keep trying until "+date(rc.WillRetryUntil)) {
				t.Errorf("delayed human part lacks the retry deadline:\n%s", human)
			}

			if got, want := string(p.parts[2].body), origMsg[:strings.Index(origMsg, "\r\n\r\n")+2]; got != want {
				t.Errorf("returned headers:\n%q\nwant\n%q", got, want)
			}
		})
	}
}

// checkFields compares the fields of h with want; "" means absent.
func checkFields(t *testing.T, what string, h map[string][]string, want map[string]string) {
	t.Helper()
	for k, v := range want {
		got := mail.Header(h).Get(k)
		if got != v {
			t.Errorf("%s %s = %q, want %q", what, k, got, v)
		}
	}
}

func TestComposeOptionalFieldsOmitted(t *testing.T) {
	r := report(Failed)
	r.EnvID, r.Arrival, r.Original = "", time.Time{}, nil
	r.Recipients[0].Original = ""
	r.Recipients[0].RemoteMTA = ""
	r.Recipients[0].Diagnostic = ""
	r.Recipients[0].LastAttempt = time.Time{}
	r.Recipients[0].Status = "bogus"
	p, _ := mustCompose(t, r)
	if len(p.parts) != 2 {
		t.Fatalf("%d parts, want 2 (no original to return)", len(p.parts))
	}
	msg, rcpts := mustStatus(t, p)
	checkFields(t, "per-message", msg, map[string]string{"Original-Envelope-Id": "", "Arrival-Date": ""})
	checkFields(t, "recipient", rcpts[0], map[string]string{
		"Original-Recipient": "", "Remote-MTA": "", "Diagnostic-Code": "", "Last-Attempt-Date": "",
		"Status": "5.0.0", // an invalid status falls back to the generic one
	})
}

func TestComposeInjection(t *testing.T) {
	crlfBcc := "\r\nBcc: victim@evil.example\r\n"
	cases := []struct {
		name string
		mod  func(*Report)
	}{
		{"reply CRLF", func(r *Report) { r.Recipients[0].Diagnostic = "550 no" + crlfBcc + "550 really" }},
		{"reply bare LF", func(r *Report) { r.Recipients[0].Diagnostic = "550 no\nBcc: victim@evil.example" }},
		{"reply bare CR", func(r *Report) { r.Recipients[0].Diagnostic = "550 no\rBcc: victim@evil.example" }},
		{"reply NUL", func(r *Report) { r.Recipients[0].Diagnostic = "550 no\x00such\x00user" }},
		{"reply 5000 octets", func(r *Report) { r.Recipients[0].Diagnostic = "550 " + strings.Repeat("A", 5000) }},
		{"reply 5000 words", func(r *Report) { r.Recipients[0].Diagnostic = strings.Repeat("550 x ", 1000) }},
		{"reply 8-bit", func(r *Report) { r.Recipients[0].Diagnostic = "550 Benutzer unbekannt: bø\xffb" }},
		{"envid CRLF", func(r *Report) { r.EnvID = "x" + crlfBcc }},
		{"final CRLF", func(r *Report) { r.Recipients[0].Final = "bob@example.com" + crlfBcc }},
		{"orcpt CRLF", func(r *Report) { r.Recipients[0].Original = "rfc822;bob@example.com" + crlfBcc }},
		{"remote MTA CRLF", func(r *Report) { r.Recipients[0].RemoteMTA = "mx.example.com" + crlfBcc }},
		{"reporting MTA CRLF", func(r *Report) { r.ReportingMTA = "relay.example.org" + crlfBcc }},
		{"to CRLF", func(r *Report) { r.To = "alice@example.org" + crlfBcc }},
		{"message-id CRLF", func(r *Report) { r.MessageID = "id@x" + crlfBcc }},
		{"explanation CRLF", func(r *Report) { r.Recipients[0].Explanation = "Sorry." + crlfBcc }},
		{"original bare CR LF NUL", func(r *Report) {
			r.Original = []byte("Subject: a\rBcc: x\nX-Nul: a\x00b\r\n\r\nbody\rline\n")
		}},
		{"original long header", func(r *Report) {
			r.Original = []byte("Subject: " + strings.Repeat("é", 3000) + "\r\n\r\nbody\r\n")
		}},
		{"original long body line full", func(r *Report) {
			r.Return = ReturnFull
			r.Original = []byte("Subject: a\r\n\r\n" + strings.Repeat("b", 5000) + "\r\n")
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := report(Failed)
			c.mod(&r)
			p, _ := mustCompose(t, r)
			if p.header.Get("Bcc") != "" {
				t.Errorf("injected Bcc header at top level")
			}
			msg, rcpts := mustStatus(t, p)
			if len(rcpts) != 1 {
				t.Fatalf("%d recipient groups, want 1", len(rcpts))
			}
			for _, h := range append(rcpts, msg) {
				if mail.Header(h).Get("Bcc") != "" {
					t.Errorf("injected Bcc field in delivery-status: %v", h)
				}
			}
			// Cutting over-long words adds a space per cut when unfolded.
			if d := mail.Header(rcpts[0]).Get("Diagnostic-Code"); len(d) > len("smtp; ")+maxValue+maxValue/maxWord {
				t.Errorf("Diagnostic-Code has %d octets, want at most about %d", len(d), maxValue)
			}
		})
	}
}

func TestDiagnosticFoldingKeepsText(t *testing.T) {
	r := report(Failed)
	words := strings.TrimSpace(strings.Repeat("550 5.1.1 word ", 60))
	r.Recipients[0].Diagnostic = words
	p, _ := mustCompose(t, r)
	_, rcpts := mustStatus(t, p)
	if got := mail.Header(rcpts[0]).Get("Diagnostic-Code"); got != "smtp; "+words {
		t.Errorf("unfolded Diagnostic-Code = %q", got)
	}
	if !bytes.Contains(p.parts[1].body, []byte("\r\n 550")) && !bytes.Contains(p.parts[1].body, []byte("\r\n word")) &&
		!bytes.Contains(p.parts[1].body, []byte("\r\n 5.1.1")) {
		t.Errorf("a long Diagnostic-Code was not folded")
	}
}

func TestReturnFull(t *testing.T) {
	big := []byte("Subject: big\r\n\r\n" + strings.Repeat("0123456789abcdef\r\n", 4000)) // 72 kB
	eightBitBody := []byte("Subject: hi\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nGrüße\r\n")
	cases := []struct {
		name     string
		original []byte
		max      int
		utf8     bool
		wantType string
		wantNote string
	}{
		{"fits", []byte(origMsg), 0, false, "message/rfc822", "Your message is attached."},
		{"exactly at cap", []byte(origMsg), len(origMsg), false, "message/rfc822", "Your message is attached."},
		{"one over cap", []byte(origMsg), len(origMsg) - 1, false, "text/rfc822-headers", "larger than the"},
		{"default cap 50000", big, 0, false, "text/rfc822-headers", "(72016 bytes) is larger than the 50000-byte limit"},
		{"raised cap", big, 100000, false, "message/rfc822", "Your message is attached."},
		{"8-bit body, ASCII DSN", eightBitBody, 0, false, "text/rfc822-headers", "8-bit data"},
		{"8-bit body, UTF8 DSN", eightBitBody, 0, true, "message/global", "Your message is attached."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := report(Failed)
			r.Return, r.Original, r.MaxReturned, r.UTF8 = ReturnFull, c.original, c.max, c.utf8
			p, _ := mustCompose(t, r)
			if len(p.parts) != 3 {
				t.Fatalf("%d parts", len(p.parts))
			}
			if got := p.parts[2].mediaType; got != c.wantType {
				t.Errorf("returned part type %q, want %q", got, c.wantType)
			}
			if human := string(p.parts[0].body); !strings.Contains(strings.Join(strings.Fields(human), " "), c.wantNote) {
				t.Errorf("human part lacks %q:\n%s", c.wantNote, human)
			}
			if c.wantType == "text/rfc822-headers" {
				return
			}
			m, err := mail.ReadMessage(bytes.NewReader(p.parts[2].body))
			if err != nil {
				t.Fatalf("returned message does not parse: %v", err)
			}
			if !bytes.Equal(p.parts[2].body, c.original) {
				t.Errorf("returned message differs from the original (subject %q)", m.Header.Get("Subject"))
			}
		})
	}
}

func TestReturnedOriginalNormalised(t *testing.T) {
	long := strings.Repeat("x", 2500)
	r := report(Failed)
	r.Return = ReturnFull
	r.Original = []byte("Subject: a\x00b\rX-Long: " + long + "\nX-8bit: caf\xc3\xa9\r\n\r\nline1\rline2\n" + long + "\r\nnul\x00\r\n")
	p, _ := mustCompose(t, r)
	m, err := mail.ReadMessage(bytes.NewReader(p.parts[2].body))
	if err != nil {
		t.Fatalf("returned message does not parse: %v\n%s", err, p.parts[2].body)
	}
	if got := m.Header.Get("Subject"); got != "a?b" {
		t.Errorf("Subject = %q, want NUL replaced", got)
	}
	if got := strings.ReplaceAll(m.Header.Get("X-Long"), " ", ""); got != long {
		t.Errorf("X-Long lost content after wrapping (%d octets)", len(got))
	}
	if got := m.Header.Get("X-8bit"); got != "caf?" {
		t.Errorf("X-8bit = %q, want non-ASCII replaced in an ASCII DSN", got)
	}
	wantBody := "line1\r\nline2\r\n" + long[:wrapAt] + "\r\n" + long[wrapAt:2*wrapAt] + "\r\n" + long[2*wrapAt:] + "\r\nnul?\r\n"
	if body := p.parts[2].body[bytes.Index(p.parts[2].body, []byte("\r\n\r\n"))+4:]; string(body) != wantBody {
		t.Errorf("body = %q\nwant   %q", body, wantBody)
	}
}

func TestComposeUTF8(t *testing.T) {
	mk := func(utf8 bool) Report {
		r := report(Failed)
		r.UTF8 = utf8
		r.To = "alice@example.org"
		r.Recipients[0].Final = "bøb@exämple.com"
		r.Recipients[0].Original = "UTF-8;bøb@exämple.com"
		r.Recipients[0].Diagnostic = "550 5.1.1 utilisateur inconnu : bøb"
		r.Original = []byte("Subject: Grüße\r\nTo: bøb@exämple.com\r\n\r\nbody\r\n")
		return r
	}

	t.Run("SMTPUTF8", func(t *testing.T) {
		r := mk(true)
		r.To = "ålice@example.org"
		p, _ := mustCompose(t, r)
		if to, err := mail.ParseAddress(p.header.Get("To")); err != nil || to.Address != r.To {
			t.Errorf("To = %q (%v)", p.header.Get("To"), err)
		}
		wantTypes := []string{"text/plain", "message/global-delivery-status", "message/global-headers"}
		for i, pt := range p.parts {
			if pt.mediaType != wantTypes[i] {
				t.Errorf("part %d type %q, want %q", i, pt.mediaType, wantTypes[i])
			}
		}
		if cte := p.parts[1].header.Get("Content-Transfer-Encoding"); cte != "8bit" {
			t.Errorf("status part CTE %q, want 8bit", cte)
		}
		_, rcpts := mustStatus(t, p)
		checkFields(t, "recipient", rcpts[0], map[string]string{
			"Final-Recipient":    "utf-8; bøb@exämple.com",
			"Original-Recipient": "utf-8; bøb@exämple.com",
			"Diagnostic-Code":    "smtp; 550 5.1.1 utilisateur inconnu : bøb",
		})
		if !strings.Contains(string(p.parts[2].body), "Subject: Grüße\r\n") {
			t.Errorf("global headers lost UTF-8:\n%s", p.parts[2].body)
		}
	})

	t.Run("downgraded", func(t *testing.T) {
		p, _ := mustCompose(t, mk(false)) // mustCompose checks the DSN is 7-bit
		_, rcpts := mustStatus(t, p)
		checkFields(t, "recipient", rcpts[0], map[string]string{
			// RFC 6533 §3 utf-8-addr-xtext.
			"Final-Recipient":    `utf-8; b\x{F8}b@ex\x{E4}mple.com`,
			"Original-Recipient": `utf-8; b\x{F8}b@ex\x{E4}mple.com`,
			"Diagnostic-Code":    "smtp; 550 5.1.1 utilisateur inconnu : b?b",
		})
		if cte := p.parts[0].header.Get("Content-Transfer-Encoding"); cte != "" {
			t.Errorf("multipart reader left CTE %q (QP not decoded?)", cte)
		}
		if human := string(p.parts[0].body); !strings.Contains(human, "utilisateur inconnu : bøb") {
			t.Errorf("human part lost the UTF-8 reply:\n%s", human)
		}
		if got := string(p.parts[2].body); !strings.Contains(got, "Subject: Gr??e\r\n") {
			t.Errorf("headers not made ASCII:\n%s", got)
		}
	})
}

func TestUTF8AddrXtext(t *testing.T) {
	for in, want := range map[string]string{
		"bob@example.com": "bob@example.com",
		"a+b=c\\d@x":      `a\x{2B}b\x{3D}c\x{5C}d@x`,
		"ñ@x":             `\x{F1}@x`,
		"用户@例子.广告":        `\x{7528}\x{6237}@\x{4F8B}\x{5B50}.\x{5E7F}\x{544A}`,
		"😀@x":             `\x{1F600}@x`,
	} {
		if got := utf8AddrXtext(in); got != want {
			t.Errorf("utf8AddrXtext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOriginalRecipientNotDecodedTwice(t *testing.T) {
	// go-smtp has already removed the xtext; "+2B" here is literal.
	if got := originalRecipient("rfc822;user+2Bx@example.org", false); got != "rfc822; user+2Bx@example.org" {
		t.Errorf("got %q", got)
	}
	if got := originalRecipient("x400;c=de;a=x", false); got != "x400; c=de;a=x" {
		t.Errorf("foreign type: got %q", got)
	}
	if got := originalRecipient("bob@example.com", false); got != "rfc822; bob@example.com" {
		t.Errorf("untyped: got %q", got)
	}
}

func TestComposeErrors(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Report)
		is   error
	}{
		{"null sender", func(r *Report) { r.To = "" }, ErrNullSender},
		{"null sender brackets", func(r *Report) { r.To = "<>" }, ErrNullSender},
		{"non-ASCII sender without UTF8", func(r *Report) { r.To = "ålice@example.org" }, nil},
		{"no reporting MTA", func(r *Report) { r.ReportingMTA = "\r\n" }, nil},
		{"no message-id", func(r *Report) { r.MessageID = "<>" }, nil},
		{"no recipients", func(r *Report) { r.Recipients = nil }, nil},
		{"unknown action", func(r *Report) { r.Recipients[0].Action = "expanded" }, nil},
		{"mixed actions", func(r *Report) {
			r.Recipients = append(r.Recipients, Recipient{Final: "c@x", Action: Delayed})
		}, nil},
		{"empty final", func(r *Report) { r.Recipients[0].Final = " " }, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := report(Failed)
			c.mod(&r)
			out, err := Compose(r)
			if err == nil {
				t.Fatalf("Compose succeeded:\n%s", out)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v, want %v", err, c.is)
			}
		})
	}
}

func TestComposeDeterministic(t *testing.T) {
	r := report(Failed)
	a, _ := Compose(r)
	b, _ := Compose(r)
	if !bytes.Equal(a, b) {
		t.Fatal("two Compose calls on the same Report differ")
	}
	r.MessageID = "other@relay.example.org"
	c, _ := Compose(r)
	pa, _ := parseDSN(a)
	pc, _ := parseDSN(c)
	if pa.params["boundary"] == pc.params["boundary"] {
		t.Error("boundary does not depend on the Message-ID")
	}
}

func TestBoundaryAvoidsContent(t *testing.T) {
	r := report(Failed)
	first := pickBoundary(r.MessageID, nil)
	// An original that contains the boundary the Message-ID would give.
	r.Original = []byte("Subject: x\r\nX-Trap: --" + first + "\r\n\r\n")
	p, _ := mustCompose(t, r)
	if p.params["boundary"] == first {
		t.Fatal("boundary that occurs in the content was used")
	}
	if len(p.parts) != 3 || !strings.Contains(string(p.parts[2].body), first) {
		t.Errorf("returned headers were cut:\n%s", p.parts[2].body)
	}
}

// TestFailedIntroExpiry: a failure DSN calls the error permanent only when
// every recipient failed permanently; an expiry (4.4.7) says the relay
// kept trying and gave up.
func TestFailedIntroExpiry(t *testing.T) {
	for _, c := range []struct {
		statuses      []string
		want, notWant string
	}{
		{[]string{"5.1.1"}, "This is a permanent error", "ran out"},
		{[]string{"4.4.7"}, "before its time in the queue ran out", "permanent"},
		{[]string{"4.4.7", "4.4.7"}, "has now given up", "permanent"},
		{[]string{"5.1.1", "4.4.7"}, "the note for each recipient says why", "permanent"},
	} {
		r := report(Failed)
		r.Recipients = nil
		for i, st := range c.statuses {
			r.Recipients = append(r.Recipients, Recipient{Final: fmt.Sprintf("r%d@example.com", i),
				Action: Failed, Status: st, Explanation: "x"})
		}
		human := strings.Join(strings.Fields(humanText(r, "relay.example.org", "")), " ")
		if !strings.Contains(human, c.want) || strings.Contains(human, c.notWant) {
			t.Errorf("statuses %v: human part %q, want %q and not %q", c.statuses, human, c.want, c.notWant)
		}
	}
}

// TestCleanHeader: a returned header line follows safetext's rule for
// control characters in both kinds of DSN (C1 controls such as NEL and CSI
// included, which an SMTPUTF8 DSN would otherwise carry to a reader).
func TestCleanHeader(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		ascii    bool
		want     string
	}{
		{"tab kept", "Subject:\tx", true, "Subject:\tx"},
		{"C0 and DEL", "Subject: a\x00b\x1bc\x7f", false, "Subject: a?b?c?"},
		{"C1 in SMTPUTF8", "Subject: a\u0085b\u009bc", false, "Subject: a?b?c"},
		{"UTF-8 kept in SMTPUTF8", "Subject: héllo", false, "Subject: héllo"},
		{"UTF-8 in ASCII", "Subject: héllo", true, "Subject: h?llo"},
		{"invalid UTF-8", "Subject: a\xffb", false, "Subject: a?b"},
		{"bidi override in SMTPUTF8", "Subject: a\u202egpj.exe\u202c", false, "Subject: a?gpj.exe?"},
		{"invalid UTF-8 in ASCII", "Subject: a\xff\xc3b", true, "Subject: a??b"},
	} {
		if got := string(cleanHeader([]byte(tc.in), tc.ascii)); got != tc.want {
			t.Errorf("%s: cleanHeader(%q, %v) = %q, want %q", tc.name, tc.in, tc.ascii, got, tc.want)
		}
	}
}
