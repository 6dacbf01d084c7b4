package integration

// Delivery status notifications: one RFC 3464 DSN per failure
// event, from <>, to the sender's own MX; none about a bounce; only the
// recipients that failed.

import (
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// TestDSNPostfixUserUnknown sends to a real Postfix that knows only some
// recipients. A message from the null sender that fails makes no DSN at
// all; a message from a@src.test to a known and an unknown recipient is
// delivered to the known one, and one DSN naming the unknown one arrives at
// src.test's MX with MAIL FROM:<>, quoting Postfix's 550 5.1.1.
func TestDSNPostfixUserUnknown(t *testing.T) {
	peers.Require(t, "postfix", "swaks")
	t.Parallel()
	n := newMailNet(t)
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	px := n.postfix("dest.test", peers.PostfixConfig{DeliverTo: final.Addr, KnownRecipients: []string{"known@dest.test"}})
	senderMX := n.sink("src.test", peers.SinkOptions{})
	r := n.relay()

	t.Run("null sender gets no DSN", func(t *testing.T) {
		id := r.send(peers.SwaksMessage{From: "", To: []string{"nobody@dest.test"},
			Data: message("mailer-daemon@src.test", "nobody@dest.test", "a bounce that bounces")})
		atts := r.waitAttempts(id, "failed", 20*time.Second)
		if a := atts[len(atts)-1]; a.num("code") != 550 || a.str("enhanced") != "5.1.1" {
			t.Errorf("failure attempt: want 550 5.1.1, got %v", a)
		}
		// Final: the message is gone from the queue, and nothing took its
		// place (a DSN would be queued in the same transaction).
		r.waitQueueEmpty(10 * time.Second)
		if v := metricValue(r.metrics(), "greyrelay_dsn_total", nil); v != 0 {
			t.Errorf("greyrelay_dsn_total = %v after a failed bounce, want 0", v)
		}
		if got := senderMX.Connections(); got != 0 {
			t.Errorf("the sender domain's MX got %d connections for a message from <>", got)
		}
	})

	id := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"known@dest.test", "unknown@dest.test"},
		Data: message("a@src.test", "known@dest.test", "half known")})
	if got := final.WaitFor(t, 1, 20*time.Second)[0]; !slices.Equal(got.Rcpts, []string{"known@dest.test"}) {
		t.Errorf("destination got recipients %v, want [known@dest.test]", got.Rcpts)
	}
	dsn := senderMX.WaitFor(t, 1, 20*time.Second)[0]
	r.waitQueueEmpty(10 * time.Second)
	if got := len(senderMX.Messages()); got != 1 {
		t.Errorf("sender's MX got %d DSNs, want 1", got)
	}
	if dsn.From != "" || !slices.Equal(dsn.Rcpts, []string{"a@src.test"}) {
		t.Errorf("DSN envelope MAIL <%s> RCPT %v, want <> [a@src.test]", dsn.From, dsn.Rcpts)
	}
	if dsn.ClientIP != r.IP {
		t.Errorf("DSN came from %s, want the pinned source %s", dsn.ClientIP, r.IP)
	}
	rep := parseDSN(t, dsn.Data)
	if rep.ReportType != "delivery-status" {
		t.Errorf("report-type %q, want delivery-status", rep.ReportType)
	}
	g := rep.recipient("unknown@dest.test")
	if len(rep.Recipients) != 1 || g == nil {
		t.Fatalf("DSN names %d recipients (%v), want only unknown@dest.test", len(rep.Recipients), rep.Recipients)
	}
	if g.Get("Action") != "failed" || g.Get("Status") != "5.1.1" {
		t.Errorf("DSN Action %q Status %q, want failed 5.1.1", g.Get("Action"), g.Get("Status"))
	}
	dc := oneSpace(g.Get("Diagnostic-Code"))
	if !strings.HasPrefix(dc, "smtp;") || !strings.Contains(dc, "550 5.1.1") || !strings.Contains(dc, "User unknown in relay recipient table") {
		t.Errorf("Diagnostic-Code %q does not quote Postfix's reply", dc)
	}
	if log := px.WaitLog(10*time.Second, "550 5.1.1 <unknown@dest.test>"); !strings.Contains(log, "550 5.1.1 <unknown@dest.test>") {
		t.Errorf("Postfix's log has no 550 5.1.1 for unknown@dest.test:\n%s", log)
	}
	if !strings.Contains(rep.Original, "Subject: half known") {
		t.Errorf("DSN does not return the original headers:\n%s", rep.Original)
	}
	if atts := r.attempts(id); len(atts) != 2 {
		t.Errorf("want one attempt line per recipient (2), got %v", outcomes(atts))
	}
}

// TestDSNMixedReplies has one transaction answered 250, 450 and 550 for
// three recipients: the DSN names only the 550 one; the 450 one is retried
// and delivered, and no second DSN follows.
func TestDSNMixedReplies(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	mix := n.sink("mix.test", peers.SinkOptions{Rcpt: func(rcpt string, attempt int) *smtp.SMTPError {
		switch {
		case strings.HasPrefix(rcpt, "later@") && attempt == 1:
			return &smtp.SMTPError{Code: 450, EnhancedCode: smtp.EnhancedCode{4, 2, 1}, Message: "Mailbox busy, try again"}
		case strings.HasPrefix(rcpt, "bad@"):
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "<bad@mix.test>: no such user here"}
		}
		return nil
	}})
	senderMX := n.sink("src.test", peers.SinkOptions{})
	r := n.relay()

	id := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"ok@mix.test", "later@mix.test", "bad@mix.test"},
		Data: message("a@src.test", "ok@mix.test", "mixed")})
	msgs := mix.WaitFor(t, 2, 20*time.Second)
	if !slices.Equal(msgs[0].Rcpts, []string{"ok@mix.test"}) || !slices.Equal(msgs[1].Rcpts, []string{"later@mix.test"}) {
		t.Errorf("destination got %v then %v, want [ok@mix.test] then [later@mix.test]", msgs[0].Rcpts, msgs[1].Rcpts)
	}
	dsn := senderMX.WaitFor(t, 1, 20*time.Second)[0]
	r.waitQueueEmpty(10 * time.Second)
	if got := len(senderMX.Messages()); got != 1 {
		t.Errorf("sender's MX got %d DSNs, want 1", got)
	}
	if dsn.From != "" {
		t.Errorf("DSN from <%s>, want <>", dsn.From)
	}
	rep := parseDSN(t, dsn.Data)
	var named []string
	for _, g := range rep.Recipients {
		named = append(named, finalAddr(g))
	}
	if !slices.Equal(named, []string{"bad@mix.test"}) {
		t.Fatalf("DSN names %v, want only [bad@mix.test]", named)
	}
	g := rep.Recipients[0]
	if g.Get("Action") != "failed" || g.Get("Status") != "5.1.1" || !strings.Contains(oneSpace(g.Get("Diagnostic-Code")), "550 5.1.1") {
		t.Errorf("DSN recipient fields %v, want Action failed, Status 5.1.1, the 550 quoted", g)
	}
	for _, name := range []string{"ok@mix.test", "later@mix.test"} {
		if strings.Contains(rep.Human, name) || rep.recipient(name) != nil {
			t.Errorf("DSN mentions %s, which did not fail", name)
		}
	}
	var got []string
	for _, a := range r.attempts(id) {
		got = append(got, a.str("rcpt")+":"+a.str("outcome"))
	}
	slices.Sort(got)
	want := []string{"bad@mix.test:failed", "later@mix.test:deferred", "later@mix.test:delivered", "ok@mix.test:delivered"}
	if !slices.Equal(got, want) {
		t.Errorf("attempt lines %v, want %v", got, want)
	}
}
