package smtpd

import (
	"crypto/tls"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/config"
)

// TestSubmit drives the HTTP door's intake: it refuses what an
// authenticated SMTP session refuses, with the same replies, and commits
// what it takes with the Received header and the identity.
func TestSubmit(t *testing.T) {
	cfg := testConfig(t)
	e := startServer(t, cfg, withUsers(testUsers(t)))
	client := netip.MustParseAddrPort("127.0.0.1:40000")
	body := "From: <app@shop.example>\r\nSubject: hi\r\n\r\nhello\r\n"
	for _, tc := range []struct {
		name    string
		sub     Submission
		want    string // "" for success, else the reply's start
		wantMsg string // a part of the stored message
	}{
		{name: "ok", sub: Submission{User: "app", From: "app@shop.example", To: []string{"a@dest.example", "b@dest.example"}},
			wantMsg: "Received: from [127.0.0.1] ([127.0.0.1])"},
		{name: "not its sender", sub: Submission{User: "bob", Allowed: []string{"bob@example.com"}, From: "x@example.com", To: []string{"a@dest.example"}},
			want: "553 5.7.1"},
		{name: "owned by another user", sub: Submission{User: "app", From: "bob@example.com", To: []string{"a@dest.example"}},
			want: "553 5.7.1 <bob@example.com>: Sender address rejected: not owned by user app"},
		{name: "bad recipient", sub: Submission{User: "app", From: "app@shop.example", To: []string{"not an address"}},
			want: "501 5.1.3"},
		{name: "no recipient", sub: Submission{User: "app", From: "app@shop.example"}, want: "503 5.5.1"},
		{name: "requiretls without tls", sub: Submission{User: "app", From: "app@shop.example", To: []string{"a@dest.example"},
			Mail: smtp.MailOptions{RequireTLS: true}}, want: "530 5.7.10"},
		{name: "requiretls with tls", sub: Submission{User: "app", From: "app@shop.example", To: []string{"a@dest.example"},
			Mail: smtp.MailOptions{RequireTLS: true}, TLS: &tls.ConnectionState{Version: tls.VersionTLS13, CipherSuite: tls.TLS_AES_128_GCM_SHA256}},
			wantMsg: "(using TLS 1.3"},
		{name: "header From owned by another user", sub: Submission{User: "app", From: "app@shop.example", To: []string{"a@dest.example"},
			Body: strings.NewReader("From: <bob@example.com>\r\n\r\nx\r\n")}, want: "550 5.7.1"},
		{name: "too big", sub: Submission{User: "app", From: "app@shop.example", To: []string{"a@dest.example"},
			Body: strings.NewReader(body + strings.Repeat("x", int(cfg.Limits.MaxMessageBytes)))}, want: "552 5.3.4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(e.q.messages())
			tc.sub.Client = client
			if tc.sub.Body == nil {
				tc.sub.Body = strings.NewReader(body)
			}
			id, err := e.srv.Submit(tc.sub)
			msgs := e.q.messages()
			if tc.want != "" {
				var se *smtp.SMTPError
				if !errors.As(err, &se) || !strings.HasPrefix(formatReply(se), tc.want) {
					t.Fatalf("Submit = %q, %v; want %q", id, err, tc.want)
				}
				if len(msgs) != before {
					t.Errorf("refused, yet %d messages were queued", len(msgs)-before)
				}
				return
			}
			if err != nil || id == "" || len(msgs) != before+1 {
				t.Fatalf("Submit = %q, %v (%d queued)", id, err, len(msgs)-before)
			}
			m := msgs[len(msgs)-1]
			if m.AuthUser != tc.sub.User || len(m.To) != len(tc.sub.To) || !strings.Contains(string(m.Body), tc.wantMsg) ||
				!strings.HasSuffix(string(m.Body), body) {
				t.Errorf("queued %+v\n%s", m, m.Body)
			}
			if m.RequireTLS != tc.sub.Mail.RequireTLS {
				t.Errorf("RequireTLS = %v", m.RequireTLS)
			}
		})
	}
}

// TestTokens covers the tokens file and its sender ownership, shared with
// the users file.
func TestTokens(t *testing.T) {
	tok, line, err := NewToken("shop", []string{"@Shop.Example"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, tokenPrefix) || !strings.HasPrefix(line, "shop:sha256$") || strings.Contains(line, tok) {
		t.Fatalf("token %q, line %q", tok, line)
	}
	u, err := ParseTokens(strings.NewReader("# apps\n" + line + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if name, allowed, ok := u.AuthenticateToken(tok); !ok || name != "shop" || strings.Join(allowed, ",") != "@shop.example" {
		t.Errorf("AuthenticateToken = %q %q %v", name, allowed, ok)
	}
	for _, bad := range []string{"", tok + "x", strings.TrimPrefix(tok, tokenPrefix), line} {
		if _, _, ok := u.AuthenticateToken(bad); ok {
			t.Errorf("AuthenticateToken(%q) accepted", bad)
		}
	}
	a, err := address.Parse("x@shop.example", address.Options{Sender: true})
	if err != nil {
		t.Fatal(err)
	}
	if !u.ownedByOther("alice", a) || u.ownedByOther("shop", a) {
		t.Error("a token's senders are not owned by it")
	}
	for _, tc := range []struct{ in, want string }{
		{"shop", "line 1"},
		{"shop:sha256$abcd", "not a sha256$ hash"},
		{"shop:$2a$10$abcdefghijklmnopqrstuv", "not a sha256$ hash"},
		{line + "\n" + line, "line 2: token \"shop\" listed twice"},
		{line + "\nother" + line[4:], "line 2: token \"other\" has the hash of another token"},
	} {
		if _, err := ParseTokens(strings.NewReader(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseTokens(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
}

type fakeSuppressions map[string]string

func (f fakeSuppressions) Suppressed(_, rcpt string) (time.Time, string, bool) {
	r, ok := f[strings.ToLower(rcpt)]
	return time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), r, ok
}

// TestRcptSuppressed: a suppressed recipient gets 550 5.1.1 at RCPT with
// the date and the reply; the others of the message are taken.
func TestRcptSuppressed(t *testing.T) {
	cfg := testConfig(t)
	cfg.TrustedNetworks = []string{"127.0.0.0/8"}
	var refused []Refusal
	e := startServer(t, cfg, func(o *Options) {
		o.Suppress = fakeSuppressions{"gone@dest.example": "550 5.1.1 User unknown"}
		o.OnRefused = func(r Refusal) { refused = append(refused, r) }
	})
	c := dial(t, e.addr(0))
	c.expect("220")
	c.send("EHLO client.test")
	c.expect("250")
	c.send("MAIL FROM:<a@src.example>")
	c.expect("250")
	c.send("RCPT TO:<Gone@dest.example>")
	c.expect("550 5.1.1 <Gone@dest.example>: Recipient address suppressed since 2026-12-01: 550 5.1.1 User unknown")
	c.send("RCPT TO:<alive@dest.example>")
	c.expect("250")
	// The refusal is told, for the refused event, as it was given.
	if len(refused) != 1 || refused[0].Rcpt != "Gone@dest.example" || refused[0].From != "a@src.example" || refused[0].Code != 550 ||
		refused[0].Enhanced != "5.1.1" || refused[0].Reason != "suppressed" || !strings.HasPrefix(refused[0].Text, "<Gone@dest.example>: Recipient address suppressed since") {
		t.Errorf("refusals told: %+v", refused)
	}
}

// TestRcptSuppressedBounce: with suppression.action bounce a suppressed
// recipient is accepted (the delivery engine fails it) and no refusal is
// told.
func TestRcptSuppressedBounce(t *testing.T) {
	cfg := testConfig(t)
	cfg.TrustedNetworks = []string{"127.0.0.0/8"}
	cfg.Suppression.Action = config.SuppressBounce
	told := 0
	e := startServer(t, cfg, func(o *Options) {
		o.Suppress = fakeSuppressions{"gone@dest.example": "550 5.1.1 User unknown"}
		o.OnRefused = func(Refusal) { told++ }
	})
	c := dial(t, e.addr(0))
	c.expect("220")
	c.send("EHLO client.test")
	c.expect("250")
	c.send("MAIL FROM:<a@src.example>")
	c.expect("250")
	c.send("RCPT TO:<Gone@dest.example>")
	c.expect("250")
	if told != 0 {
		t.Errorf("%d refusals told under action bounce", told)
	}
}

// TestNoAuthWithTokensOnly: a directory with the API's tokens and no
// users (no users_file) offers no AUTH, and refuses one with 502.
func TestNoAuthWithTokensOnly(t *testing.T) {
	_, line, err := NewToken("shop", nil)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := ParseTokens(strings.NewReader(line))
	if err != nil {
		t.Fatal(err)
	}
	e := startServer(t, testConfig(t), withUsers(dir))
	c := dial(t, e.addr(0))
	c.expect("220")
	c.send("EHLO client.test")
	for _, l := range c.expect("250") {
		if strings.Contains(l, "AUTH") {
			t.Errorf("AUTH offered: %q", l)
		}
	}
	c.send("AUTH PLAIN AHNob3AAeA==")
	c.expect("502 5.5.1")
}
