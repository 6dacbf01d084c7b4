package smtpd

import (
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/relay/config"
)

// TestUserLimits: each identity's messages and recipients are counted
// over a sliding hour and day; over a limit, MAIL gets 451 4.7.1 and
// RCPT 452 4.5.3, and nothing is queued.
func TestUserLimits(t *testing.T) {
	cfg := testConfig(t)
	cfg.UserLimits = config.UserLimits{MessagesPerHour: 2, MessagesPerDay: 3, RecipientsPerHour: 3,
		Overrides: map[string]config.UserLimitSet{"crm": {MessagesPerHour: 1}}}
	var mu sync.Mutex
	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	e := startServer(t, cfg, func(o *Options) { o.Now = clock })
	submit := func(user string, to ...string) string {
		_, err := e.srv.Submit(Submission{Client: netip.MustParseAddrPort("127.0.0.1:1"), User: user, From: "a@shop.example",
			To: to, Body: strings.NewReader("Subject: x\r\n\r\nx\r\n")})
		var se *smtp.SMTPError
		if errors.As(err, &se) {
			return formatReply(se)
		}
		if err != nil {
			return err.Error()
		}
		return "ok"
	}
	for i, tc := range []struct {
		user    string
		to      []string
		advance time.Duration
		want    string
	}{
		{"alice", []string{"a@d.example", "b@d.example"}, 0, "ok"},
		{"alice", []string{"c@d.example", "d@d.example"}, 0, "452 4.5.3 Recipient rate limit reached for alice: 3 recipients per hour"},
		{"alice", []string{"c@d.example"}, 0, "ok"},
		{"alice", []string{"e@d.example"}, 0, "451 4.7.1 Sending rate limit reached for alice: 2 messages per hour"},
		{"bob", []string{"e@d.example", "f@d.example", "g@d.example"}, 0, "ok"},
		{"alice", []string{"e@d.example"}, 61 * time.Minute, "ok"},
		{"alice", []string{"f@d.example"}, 0, "451 4.7.1 Sending rate limit reached for alice: 3 messages per day"},
		{"alice", []string{"f@d.example"}, 23 * time.Hour, "ok"},
		// crm has limits of its own: one message an hour, any recipients.
		{"crm", []string{"1@d.example", "2@d.example", "3@d.example", "4@d.example"}, 0, "ok"},
		{"crm", []string{"5@d.example"}, 0, "451 4.7.1 Sending rate limit reached for crm: 1 messages per hour"},
	} {
		mu.Lock()
		now = now.Add(tc.advance)
		mu.Unlock()
		before := len(e.q.messages())
		got := submit(tc.user, tc.to...)
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%d: %s to %v: %s, want %s", i, tc.user, tc.to, got, tc.want)
		}
		if queued := len(e.q.messages()) - before; queued != 0 != (tc.want == "ok") {
			t.Errorf("%d: %d queued", i, queued)
		}
	}
}

// TestUserLimitsTrustedClient: a client relaying by trusted_networks
// without AUTH is limited by its address.
func TestUserLimitsTrustedClient(t *testing.T) {
	cfg := testConfig(t)
	cfg.UserLimits = config.UserLimits{MessagesPerHour: 1}
	e := startServer(t, cfg)
	for i, want := range []string{"250", "451 4.7.1 Sending rate limit reached for trusted client 127.0.0.99: 1 messages per hour"} {
		c := dialFrom(t, e.addr(0), "127.0.0.99")
		c.expect("220")
		c.send("EHLO client.test")
		c.expect("250")
		c.send("MAIL FROM:<a@src.example>")
		if i == 1 {
			c.expect(want)
			break
		}
		c.expect("250")
		c.send("RCPT TO:<b@dest.example>")
		c.expect("250")
		c.send("DATA")
		c.expect("354")
		c.write("Subject: x\r\n\r\nx\r\n.\r\n")
		c.expect(want)
	}
	// Another client is not counted with it.
	c := dialFrom(t, e.addr(0), "127.0.0.1")
	c.expect("220")
	c.send("EHLO client.test")
	c.expect("250")
	c.send("MAIL FROM:<a@src.example>")
	c.expect("250")
}
