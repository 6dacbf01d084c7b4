package smtpd

import (
	"bufio"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
)

// relayTricks are the 16 nmap smtp-open-relay tests and a few more
// routing tricks (%, !, source routes, quoted local parts), as MAIL FROM / RCPT TO arguments. ip is the server's address,
// relay its hostname, target an outside domain.
var relayTricks = [][2]string{
	{"<>", "<user@target.example>"},
	{"<antispam@target.example>", "<user@target.example>"},
	{"<antispam@relay.test>", "<user@target.example>"},
	{"<antispam@[127.0.0.1]>", "<user@target.example>"},
	{"<antispam@[127.0.0.1]>", "<user%target.example@[127.0.0.1]>"},
	{"<antispam@[127.0.0.1]>", "<user%target.example@relay.test>"},
	{"<antispam@[127.0.0.1]>", `<"user@target.example">`},
	{"<antispam@[127.0.0.1]>", `<"user%target.example">`},
	{"<antispam@[127.0.0.1]>", "<user@target.example@[127.0.0.1]>"},
	{"<antispam@[127.0.0.1]>", `<"user@target.example"@[127.0.0.1]>`},
	{"<antispam@[127.0.0.1]>", "<user@target.example@relay.test>"},
	{"<antispam@[127.0.0.1]>", "<@[127.0.0.1]:user@target.example>"},
	{"<antispam@[127.0.0.1]>", "<@relay.test:user@target.example>"},
	{"<antispam@[127.0.0.1]>", "<target.example!user>"},
	{"<antispam@[127.0.0.1]>", "<target.example!user@[127.0.0.1]>"},
	{"<antispam@[127.0.0.1]>", "<target.example!user@relay.test>"},
	// Extras (MAPS style and our probe).
	{"<spamtest@localhost>", "<user@target.example>"},
	{"<spamtest>", "<user@target.example>"},
	{"<a@relay.test>", "<user@target.example.>"},
	{"<a@relay.test>", "<USER@TARGET.EXAMPLE>"},
	{"<a@relay.test>", "<user@[127.0.0.1]>"},
	{"<a@relay.test>", "<user@[IPv6:::1]>"},
	{"<a@relay.test>", "<user@0x7f000001>"},
	{"<a@relay.test>", "<user@target.example\x00.relay.test>"},
	{"<a@relay.test>", "<us\rer@target.example>"},
	{"<a@relay.test>", `<"a\"b"@target.example>`},
	{"<a@relay.test>", "user@target.example"},
	{"<a@relay.test>", "<user@target.example> ORCPT=rfc822;x@y.example NOTIFY=SUCCESS"},
	{"<a@relay.test>", "<user@xn--->"},
	{"<a@relay.test>", "<user@bücher.example>"},
	{"<a@relay.test>", "<postmaster>"},
	{"<a@relay.test>", "<postmaster@relay.test>"},
	{"<a@relay.test>", "<postmaster@target.example>"},
}

// tryRelay plays every trick on c and asserts that no recipient and no DATA
// is accepted. It returns how many RCPTs got exactly 554 5.7.1.
func tryRelay(t *testing.T, c *client, where string) int {
	t.Helper()
	denied := 0
	for _, tr := range relayTricks {
		c.write("MAIL FROM:" + tr[0] + "\r\nRCPT TO:" + tr[1] + "\r\nDATA\r\n")
		c.reply() // MAIL may be accepted: relaying is decided at RCPT
		rcpt := c.reply()
		data := c.reply()
		last := rcpt[len(rcpt)-1]
		if last[0] != '5' || data[len(data)-1][0] != '5' {
			t.Errorf("%s: %s -> %q: RCPT %q, DATA %q", where, tr[0], tr[1], rcpt, data)
		}
		if strings.HasPrefix(last, "554 5.7.1 Relay access denied") {
			denied++
		}
		c.cmd("RSET", "250 ")
	}
	return denied
}

func relayConfig(t *testing.T) *config.Config {
	cert, key := writeCert(t)
	cfg := testConfig(t)
	cfg.Limits.MaxJunkCommands = 1000 // each trick has a refused DATA and a RSET
	cfg.Listeners = []config.Listener{
		{Address: "127.0.0.1:0", Mode: config.ModeSMTP, TLSCert: cert, TLSKey: key},
		{Address: "127.0.0.1:0", Mode: config.ModeSubmission, TLSCert: cert, TLSKey: key},
		{Address: "127.0.0.1:0", Mode: config.ModeSubmissions, TLSCert: cert, TLSKey: key},
	}
	return cfg
}

func dialTLS(t *testing.T, addr string) *client {
	t.Helper()
	c := dial(t, addr)
	tc := tls.Client(c.conn, &tls.Config{InsecureSkipVerify: true})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	c.conn, c.r = tc, bufio.NewReader(tc)
	return c
}

// TestRelay_UntrustedClientIsNoOpenRelay runs the corpus unauthenticated on
// every listener, before and after STARTTLS: nothing is accepted.
func TestRelay_UntrustedClientIsNoOpenRelay(t *testing.T) {
	e := startServer(t, relayConfig(t), withUsers(testUsers(t)))

	c := dial(t, e.addr(0))
	c.hello()
	if n := tryRelay(t, c, "smtp"); n < 10 {
		t.Errorf("smtp: only %d RCPTs got 554 5.7.1", n)
	}
	c.startTLS()
	c.cmd("EHLO client.example", "250 ")
	if n := tryRelay(t, c, "smtp+STARTTLS"); n < 10 {
		t.Errorf("smtp+STARTTLS: only %d RCPTs got 554 5.7.1", n)
	}

	c = dial(t, e.addr(1))
	c.hello()
	c.cmd("MAIL FROM:<a@relay.test>", "530 5.7.0 Authentication required")
	tryRelay(t, c, "submission")
	c.startTLS()
	c.cmd("EHLO client.example", "250 ")
	c.cmd("MAIL FROM:<a@relay.test>", "530 5.7.0 Authentication required")
	tryRelay(t, c, "submission+STARTTLS")

	c = dialTLS(t, e.addr(2))
	c.hello()
	c.cmd("MAIL FROM:<a@relay.test>", "530 5.7.0 Authentication required")
	tryRelay(t, c, "submissions")

	if n := len(e.q.messages()); n != 0 {
		t.Fatalf("%d messages enqueued", n)
	}
	if len(e.logs.FilterMessage("refused").All()) == 0 {
		t.Error("refusals not logged")
	}
}

// TestRelay_TrustedNetworkOnlyOnSMTPListener: IP trust never replaces AUTH
// on the submission ports.
func TestRelay_TrustedNetworkOnlyOnSMTPListener(t *testing.T) {
	cfg := relayConfig(t)
	cfg.TrustedNetworks = []string{"127.0.0.1/32"}
	e := startServer(t, cfg, withUsers(testUsers(t)))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@relay.test>", "250 ")
	c.cmd("RCPT TO:<user@target.example>", "250 ")
	c = dialTLS(t, e.addr(2))
	c.hello()
	c.cmd("MAIL FROM:<a@relay.test>", "530 5.7.0")
	// 127.0.0.2 is outside the trusted /32.
	c = dialFrom(t, e.addr(0), "127.0.0.2")
	c.hello()
	c.cmd("MAIL FROM:<a@relay.test>", "250 ")
	c.cmd("RCPT TO:<user@target.example>", "554 5.7.1 Relay access denied")
}
