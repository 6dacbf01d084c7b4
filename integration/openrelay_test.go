package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// rbRelayTrick is one open-relay address trick, as a MAIL FROM / RCPT TO
// pair. The
// arguments are sent verbatim after "MAIL FROM:" and "RCPT TO:"; "IP" and
// "RELAY" are replaced by the relay's address literal and host name.
type rbRelayTrick struct {
	name     string
	from, to string
}

var rbRelayTricks = []rbRelayTrick{
	// nmap smtp-open-relay.nse, tests 1-16.
	{"nmap01", "<>", "<user@target.test>"},
	{"nmap02", "<antispam@target.test>", "<user@target.test>"},
	{"nmap03", "<antispam@RELAY>", "<user@target.test>"},
	{"nmap04", "<antispam@[IP]>", "<user@target.test>"},
	{"nmap05", "<antispam@[IP]>", "<user%target.test@[IP]>"},
	{"nmap06", "<antispam@[IP]>", "<user%target.test@RELAY>"},
	{"nmap07", "<antispam@[IP]>", `<"user@target.test">`},
	{"nmap08", "<antispam@[IP]>", `<"user%target.test">`},
	{"nmap09", "<antispam@[IP]>", "<user@target.test@[IP]>"},
	{"nmap10", "<antispam@[IP]>", `<"user@target.test"@[IP]>`},
	{"nmap11", "<antispam@[IP]>", "<user@target.test@RELAY>"},
	{"nmap12", "<antispam@[IP]>", "<@[IP]:user@target.test>"},
	{"nmap13", "<antispam@[IP]>", "<@RELAY:user@target.test>"},
	{"nmap14", "<antispam@[IP]>", "<target.test!user>"},
	{"nmap15", "<antispam@[IP]>", "<target.test!user@[IP]>"},
	{"nmap16", "<antispam@[IP]>", "<target.test!user@RELAY>"},
	// More tricks in the style of the MAPS relay test, and our probe.
	{"localhost-sender", "<spamtest@localhost>", "<user@target.test>"},
	{"bare-sender", "<spamtest>", "<user@target.test>"},
	{"trailing-dot", "<antispam@[IP]>", "<user@target.test.>"},
	{"upper-case", "<antispam@[IP]>", "<USER@TARGET.TEST>"},
	{"ip-literal", "<antispam@[IP]>", "<user@[127.0.0.1]>"},
	{"ipv6-literal", "<antispam@[IP]>", "<user@[IPv6:::1]>"},
	{"hex-ip", "<antispam@[IP]>", "<user@0x7f000001>"},
	{"nul", "<antispam@[IP]>", "<user@target.test\x00.RELAY>"},
	{"bare-cr", "<antispam@[IP]>", "<us\rer@target.test>"},
	{"quoted-escape", "<antispam@[IP]>", `<"a\"b"@target.test>`},
	{"no-brackets", "<antispam@[IP]>", "user@target.test"},
	{"dsn-params", "<antispam@[IP]>", "<user@target.test> ORCPT=rfc822;x@y NOTIFY=SUCCESS"},
	{"idna-broken", "<antispam@[IP]>", "<user@xn--->"},
	{"unicode-no-smtputf8", "<antispam@[IP]>", "<user@t\u00e4rget.test>"},
	// Our own host names and the postmaster: greyrelay has no local
	// domains, so these are relaying too.
	{"postmaster-relay", "<antispam@[IP]>", "<postmaster@RELAY>"},
	{"postmaster-ip", "<antispam@[IP]>", "<postmaster@[IP]>"},
	{"postmaster-bare", "<antispam@[IP]>", "<postmaster>"},
}

// TestRobustNoOpenRelay: no open relay by default, and no AUTH that skips
// TLS. From an address outside trusted_networks, every address trick on every
// listener mode (smtp with STARTTLS offered, submission, submissions), in
// plaintext and after STARTTLS without AUTH, is refused with 5xx at MAIL
// or RCPT (530 on the submission modes), a DATA that follows is refused
// too, and nothing is queued or reaches the sink (which every message
// would be sent to: the relay's smarthost). CVE-2011-0411 is checked on
// both STARTTLS listeners. A trusted client's message does reach the sink
// at the end, so "nothing arrived" is not a broken route.
func TestRobustNoOpenRelay(t *testing.T) {
	t.Parallel()
	relayIP, attackerIP, friendIP, sinkIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{})
	cert := peers.NewCert(t, "relay.test", relayIP)
	cfg := rbRelay{IP: relayIP, Trusted: []string{friendIP + "/32"}, Smarthost: sink.Addr,
		UsersFile: rbUsersFile(t, "app", "app-password", ""),
		Listeners: []rbListener{{Mode: "smtp", Cert: cert}, {Mode: "submission", Cert: cert}, {Mode: "submissions", Cert: cert}}}
	r := peers.StartRelay(t, cfg.YAML(t))
	expand := strings.NewReplacer("[IP]", "["+relayIP+"]", "RELAY", "relay.test")

	contexts := []struct {
		name     string
		listener int
		implicit bool
		starttls bool
	}{
		{"smtp/plaintext", 0, false, false},
		{"smtp/starttls", 0, false, true},
		{"submission/plaintext", 1, false, false},
		{"submission/starttls", 1, false, true},
		{"submissions/implicit-tls", 2, true, false},
	}
	for _, cx := range contexts {
		t.Run(cx.name, func(t *testing.T) {
			for _, tr := range rbRelayTricks {
				from, to := expand.Replace(tr.from), expand.Replace(tr.to)
				where, err := rbTryRelay(r.Listeners[cx.listener], attackerIP, cx.implicit, cx.starttls, from, to)
				if err != nil {
					t.Errorf("%s: MAIL FROM:%q RCPT TO:%q: %v", tr.name, from, to, err)
					continue
				}
				// go-smtp itself refuses what it cannot parse (501); anything
				// it passes on must meet the AUTH requirement first.
				if cx.listener > 0 && !strings.HasPrefix(where, "MAIL 530") && !strings.HasPrefix(where, "MAIL 501") {
					t.Errorf("%s: refused with %s; a submission listener should demand AUTH (530) at MAIL", tr.name, where)
				}
			}
		})
	}
	for i, name := range []string{"smtp", "submission"} {
		t.Run("CVE-2011-0411/"+name, func(t *testing.T) {
			rbCheckSTARTTLSInjection(t, r.Listeners[i], attackerIP)
		})
	}

	if st := rbStats(t, r); st.Messages != 0 {
		t.Errorf("the relay queued %d messages from an untrusted client", st.Messages)
	}
	if n := len(sink.Transactions()); n != 0 || sink.Connections() != 0 {
		t.Errorf("the sink saw %d connections and %d transactions, want none", sink.Connections(), n)
	}

	// The control: the same route works for a trusted client.
	c, err := rbDialSMTP(r.SMTPAddr, friendIP, false, "friend.test")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data := []byte("Subject: control\r\nMessage-ID: <control@openrelay.test>\r\n\r\nhello\r\n")
	if rep, err := c.Send(rbTx{From: "friend@src.test", Rcpts: []string{"user@target.test"}, Data: data}); err != nil || rep.Code != 250 {
		t.Fatalf("trusted client: %v %v", rep, err)
	}
	msgs := sink.WaitFor(t, 1, 20*time.Second)
	if len(msgs) != 1 || msgs[0].From != "friend@src.test" {
		t.Errorf("the sink received %d messages (first from %q), want only the control", len(msgs), msgs[0].From)
	}
}

// rbTryRelay runs one relay attempt and returns where it was refused
// ("MAIL 554 ...", "RCPT 554 ..."), or an error if it was not refused with
// a 5xx at MAIL or RCPT, or if a following DATA was not refused.
func rbTryRelay(addr, localIP string, implicit, starttls bool, from, to string) (string, error) {
	c, err := rbDialSMTP(addr, localIP, implicit, "attacker.test")
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.timeout = 10 * time.Second
	if starttls {
		if err := c.StartTLS(); err != nil {
			return "", err
		}
		if r, err := c.Cmd("EHLO attacker.test"); err != nil || r.Code != 250 {
			return "", fmt.Errorf("EHLO after STARTTLS: %v %v", r, err)
		}
	}
	r, err := c.Cmd("MAIL FROM:" + from)
	if err != nil {
		return "", fmt.Errorf("MAIL: %w", err)
	}
	if r.Code/100 == 5 {
		return "MAIL " + r.String(), nil
	}
	if r.Code != 250 {
		return "", fmt.Errorf("MAIL: %v, want 250 or a 5xx refusal", r)
	}
	r, err = c.Cmd("RCPT TO:" + to)
	if err != nil {
		return "", fmt.Errorf("RCPT: %w", err)
	}
	if r.Code/100 != 5 {
		return "", fmt.Errorf("RCPT: %v: not refused with 5xx (open relay)", r)
	}
	where := "RCPT " + r.String()
	// A client that ignores the refusal and sends DATA anyway.
	d, err := c.Cmd("DATA")
	if err != nil {
		return where, nil // closed: fine
	}
	if d.Code == 354 {
		_ = c.WriteRaw([]byte("Subject: relayed?\r\n\r\nrelayed\r\n.\r\n"))
		end, _ := c.Read()
		return "", fmt.Errorf("DATA after a refused RCPT got 354, and the data %v", end)
	}
	return where, nil
}

// rbCheckSTARTTLSInjection sends "STARTTLS\r\nRSET\r\n" in one segment
// (CVE-2011-0411). After the handshake the first reply must be the one to
// our EHLO: the plaintext RSET was discarded, not executed inside TLS.
func rbCheckSTARTTLSInjection(t *testing.T, addr, localIP string) {
	t.Helper()
	c, err := rbDialSMTP(addr, localIP, false, "attacker.test")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.timeout = 10 * time.Second
	if err := c.WriteRaw([]byte("STARTTLS\r\nRSET\r\n")); err != nil {
		t.Fatal(err)
	}
	r, err := c.Read()
	if err != nil || r.Code != 220 {
		t.Fatalf("STARTTLS: %v %v", r, err)
	}
	if err := c.handshake(); err != nil {
		t.Fatalf("%v: the injected plaintext reached the TLS layer", err)
	}
	r, err = c.Cmd("EHLO attacker.test")
	if err != nil {
		t.Fatalf("EHLO after STARTTLS: %v", err)
	}
	// go-smtp's EHLO reply: "250-Hello NAME" and the extensions.
	if r.Code != 250 || len(r.Lines) < 2 || !strings.HasPrefix(r.Lines[0], "Hello attacker.test") {
		t.Fatalf("first reply inside TLS is %v, not the EHLO reply: the injected RSET was executed", r)
	}
	if r, err := c.Cmd("NOOP"); err != nil || r.Code != 250 || len(r.Lines) != 1 {
		t.Fatalf("NOOP after EHLO: %v %v (a reply to the injected command is still pending)", r, err)
	}
}
