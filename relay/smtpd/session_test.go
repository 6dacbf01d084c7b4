package smtpd

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/metrics"
)

func trustedConfig(t *testing.T) *config.Config {
	cfg := testConfig(t)
	cfg.TrustedNetworks = []string{"127.0.0.0/8"}
	return cfg
}

func TestSession_TrustedClientRelays(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	e := startServer(t, trustedConfig(t), func(o *Options) { o.Metrics = m })
	c := dial(t, e.addr(0))
	ehlo := c.hello()
	for _, ext := range []string{"PIPELINING", "8BITMIME", "ENHANCEDSTATUSCODES", "SMTPUTF8", "DSN", "SIZE 100000"} {
		if !strings.Contains(strings.Join(ehlo, "\n"), ext) {
			t.Errorf("EHLO lacks %s: %q", ext, ehlo)
		}
	}
	got := c.sendMessage("sender@example.com", []string{"Rcpt@Example.NET"}, "Subject: hi\r\n\r\nbody\r\n")
	if got != "250 2.0.0 OK queued as 0000000000000001" {
		t.Fatalf("DATA reply %q", got)
	}
	c.cmd("QUIT", "221 ")
	msgs := e.q.messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages", len(msgs))
	}
	m0 := msgs[0]
	if m0.From != "sender@example.com" || len(m0.To) != 1 || m0.To[0].Addr != "Rcpt@example.net" ||
		m0.To[0].Domain != "example.net" || m0.ClientAddr != "127.0.0.1" || m0.Helo != "client.example" {
		t.Errorf("envelope %+v", m0)
	}
	if !bytes.HasPrefix(m0.Body, []byte("Received: from client.example ([127.0.0.1])\r\n\tby relay.test (greyrelay) with ESMTP\r\n\tfor <Rcpt@example.net>; ")) {
		t.Errorf("Received header: %q", m0.Body)
	}
	if b := bodyOf(m0.Body); string(b) != "Subject: hi\r\n\r\nbody\r\n" {
		t.Errorf("body %q", b)
	}
	if testutil.ToFloat64(m.Accepted) != 1 || testutil.ToFloat64(m.AcceptedBytes) != float64(len(m0.Body)) {
		t.Error("accepted metrics not updated")
	}
	if testutil.ToFloat64(m.TLSIn.WithLabelValues("no")) != 1 {
		t.Error("tls metric not updated")
	}
	logs := e.logs.FilterMessage("accepted").All()
	if len(logs) != 1 {
		t.Fatalf("accepted log lines: %d", len(logs))
	}
	f := logs[0].ContextMap()
	if f["queue_id"] != "0000000000000001" || f["client"] == "" || f["from"] != "sender@example.com" ||
		f["rcpts"] != int64(1) || f["size"] != int64(len(m0.Body)) || f["tls"] != false || f["user"] != "" {
		t.Errorf("log fields %v", f)
	}
}

func TestSession_NullSenderAndPipelining(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	// RFC 2920: the whole envelope in one write.
	c.write("MAIL FROM:<>\r\nRCPT TO:<a@x.example>\r\nRCPT TO:<b@y.example>\r\nRCPT TO:<a@x.example>\r\nDATA\r\n")
	for _, want := range []string{"250 ", "250 ", "250 ", "250 ", "354 "} {
		c.expect(want)
	}
	c.write("Subject: t\r\n\r\nx\r\n.\r\n")
	c.expect("250 2.0.0 OK queued as")
	m := e.q.messages()[0]
	if m.From != "" || len(m.To) != 2 {
		t.Errorf("envelope %+v (duplicate recipient must be dropped)", m)
	}
	if hdr := m.Body[:len(m.Body)-len(bodyOf(m.Body))]; bytes.Contains(hdr, []byte("\tfor <")) {
		t.Error("Received has 'for' with two recipients")
	}
}

func TestSession_NestedMailAndSequence(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("RCPT TO:<a@x.example>", "502 5.5.1")
	c.cmd("DATA", "502 5.5.1")
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("MAIL FROM:<b@x.example>", "503 5.5.1 Nested MAIL command")
	c.cmd("RSET", "250 ")
	c.cmd("MAIL FROM:<b@x.example>", "250 ")
}

func TestSession_DSNParameters(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@x.example> RET=HDRS ENVID=abc+2Bdef BODY=8BITMIME", "250 ")
	c.cmd("RCPT TO:<b@y.example> NOTIFY=success,FAILURE ORCPT=rfc822;b+40y.example", "250 ")
	c.cmd("RCPT TO:<c@y.example> NOTIFY=NEVER", "250 ")
	c.cmd("RCPT TO:<d@y.example> ORCPT=rfc822;a+0D+0AB@c", "501 5.5.4")
	c.cmd("DATA", "354 ")
	c.write("x\r\n.\r\n")
	c.expect("250 2.0.0")
	m := e.q.messages()[0]
	if m.RET != "HDRS" || m.EnvID != "abc+def" || !m.EightBit {
		t.Errorf("message %+v", m)
	}
	if m.To[0].Notify != "SUCCESS,FAILURE" || m.To[0].ORCPT != "rfc822;b@y.example" || m.To[1].Notify != "NEVER" || m.To[1].ORCPT != "" {
		t.Errorf("recipients %+v", m.To)
	}
	c.cmd("MAIL FROM:<a@x.example> ENVID=x+0D+0Ax", "501 5.5.4")
	c.cmd("MAIL FROM:<a@x.example> ENVID="+strings.Repeat("e", 101), "501 5.5.4 ENVID too long")
}

func TestSession_SMTPUTF8(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<ü@bücher.example>", "553 5.6.7")
	c.cmd("MAIL FROM:<ü@bücher.example> SMTPUTF8", "250 ")
	c.cmd("RCPT TO:<jö@bücher.example>", "250 ")
	c.cmd("DATA", "354 ")
	c.write("Subject: ü\r\n\r\nü\r\n.\r\n")
	c.expect("250 ")
	m := e.q.messages()[0]
	if !m.SMTPUTF8 || !m.EightBit || m.To[0].Addr != "jö@bücher.example" || !bytes.Contains(m.Body, []byte("with UTF8SMTP")) {
		t.Errorf("message %+v %q", m, m.Body)
	}
}

// TestSession_TrailingDot: "user@example.com." is the same address as
// "user@example.com" (the root's dot), as Postfix takes it: accepted, and
// queued in the one spelling every rule and destination record uses.
func TestSession_TrailingDot(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a@X.Example.>", "250 ")
	c.cmd("RCPT TO:<User@Target.Example.>", "250 ")
	c.cmd("DATA", "354 ")
	c.write("Subject: t\r\n\r\nt\r\n.\r\n")
	c.expect("250 ")
	m := e.q.messages()[0]
	if m.From != "a@x.example" || m.To[0].Addr != "User@target.example" || m.To[0].Domain != "target.example" {
		t.Errorf("queued from %q to %+v, want a@x.example to User@target.example", m.From, m.To)
	}
}

// TestSession_AddressTricksWhenAllowedToRelay: a client that may relay
// still cannot use routing tricks or inject control characters.
func TestSession_AddressTricksWhenAllowedToRelay(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("MAIL FROM:<a%b@x.example>", "553 5.1.7")
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	tests := []struct{ rcpt, want string }{
		{`<"user@target.example"@relay.test>`, "553 5.1.3"},
		{"<user@target.example@relay.test>", "553 5.1.3"},
		{"<user%target.example@relay.test>", "553 5.1.3"},
		{"<target.example!user@relay.test>", "553 5.1.3"},
		{"<user@target.>", "250 "}, // the root's dot, dropped (TestSession_TrailingDot)
		{"<user@target..>", "501 5.1.3"},
		{"<us\rer@target.example>", "501 5.1.3"},
		{"<user@target\x00.example>", "501 5.1.3"},
		{`<"a\"b"@target.example>`, "250 "}, // arrives as a"b@target.example, stored quoted again
		{"<user@0x7f000001>", "501 5.1.3"},
		{"<user@xn--->", "501 5.1.3"},
		{"<ü@bücher.example>", "553 5.6.7"},
		{"<" + strings.Repeat("l", 65) + "@x.example>", "501 5.5.4"},
		{"<" + strings.Repeat("l", 64) + "@x.example>", "250 "},
		{"<USER@TARGET.EXAMPLE>", "250 "},
		{"user@bare.example", "250 "},
		{"<user@[127.0.0.1]>", "550 5.1.2"}, // delivery.address_literals: refuse
		{"<user@[IPv6:::1]>", "550 5.1.2"},
	}
	for _, tc := range tests {
		c.cmd("RCPT TO:"+tc.rcpt, tc.want)
	}
	// Path: 254 octets of mailbox fit in the 256-octet path; 255 do not.
	dom := func(n int) string {
		return strings.Repeat("d", 63) + "." + strings.Repeat("e", 63) + "." + strings.Repeat("f", 63) + "." + strings.Repeat("g", n-192)
	}
	c.cmd("RCPT TO:<ab@"+dom(251)+">", "250 ")
	c.cmd("RCPT TO:<abc@"+dom(251)+">", "501 5.5.4")
}

func TestSession_Limits(t *testing.T) {
	cfg := trustedConfig(t)
	cfg.Limits.MaxRecipients = 3
	cfg.Limits.MaxMessageBytes = 1000
	cfg.Limits.MaxReceivedHeaders = 3
	e := startServer(t, cfg)
	c := dial(t, e.addr(0))
	c.hello()

	// Recipients at L-1, L, L+1.
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	for i := range 3 {
		c.cmd(fmt.Sprintf("RCPT TO:<r%d@y.example>", i), "250 ")
	}
	c.cmd("RCPT TO:<r4@y.example>", "452 4.5.3")
	c.cmd("RSET", "250 ")

	// SIZE at L and L+1.
	c.cmd("MAIL FROM:<a@x.example> SIZE=1000", "250 ")
	c.cmd("RSET", "250 ")
	c.cmd("MAIL FROM:<a@x.example> SIZE=1001", "552 5.3.4")

	// Body: go-smtp's reader checks the limit before it can see the final
	// dot, so the largest body accepted is L-1 octets.
	for _, tc := range []struct {
		size int
		want string
	}{{998, "250 "}, {999, "250 "}, {1000, "552 5.3.4"}, {1001, "552 5.3.4"}, {5000, "552 5.3.4"}} {
		body := sized(tc.size)
		if got := c.sendMessage("a@x.example", []string{"b@y.example"}, body); !strings.HasPrefix(got, tc.want) {
			t.Errorf("body of %d: %q, want %q", tc.size, got, tc.want)
		}
		c.cmd("NOOP", "250 ") // still in sync
	}

	// Received headers at L-1, L, L+1.
	for n, want := range map[int]string{2: "250 ", 3: "250 ", 4: "554 5.4.6 Too many Received headers"} {
		body := strings.Repeat("Received: from a by b; Mon, 1 Jan 2024 00:00:00 +0000\r\n", n) + "\r\nx\r\n"
		if got := c.sendMessage("a@x.example", []string{"b@y.example"}, body); !strings.HasPrefix(got, want) {
			t.Errorf("%d Received: %q, want %q", n, got, want)
		}
	}
	// A Received line in the body does not count.
	body := "Subject: x\r\n\r\n" + strings.Repeat("Received: x\r\n", 5)
	if got := c.sendMessage("a@x.example", []string{"b@y.example"}, body); !strings.HasPrefix(got, "250 ") {
		t.Errorf("Received in body: %q", got)
	}
}

func TestSession_LineLengths(t *testing.T) {
	cfg := trustedConfig(t)
	e := startServer(t, cfg)
	// Lines up to the limit are stored unchanged, not split.
	for _, n := range []int{998, 1000, 1001, 1998} {
		c := dial(t, e.addr(0))
		c.hello()
		line := strings.Repeat("y", n)
		if got := c.sendMessage("a@x.example", []string{"b@y.example"}, "Subject: x\r\n\r\n"+line+"\r\n"); !strings.HasPrefix(got, "250 ") {
			t.Fatalf("line of %d: %q", n, got)
		}
		msgs := e.q.messages()
		if !bytes.Contains(msgs[len(msgs)-1].Body, []byte("\r\n"+line+"\r\n")) {
			t.Errorf("line of %d not stored as is", n)
		}
	}
	// Longer body lines too, up to the message size (Postfix takes them;
	// delivery folds them): stored unchanged, and nothing in the body is
	// read as a command.
	for _, n := range []int{1999, 2001, 2100, 5000, 90000} {
		c := dial(t, e.addr(0))
		c.hello()
		c.cmd("MAIL FROM:<a@x.example>", "250 ")
		c.cmd("RCPT TO:<b@y.example>", "250 ")
		c.cmd("DATA", "354 ")
		line := strings.Repeat("z", n)
		c.write("Subject: x\r\n\r\n" + line + "\r\nMAIL FROM:<smuggled@x.example>\r\n.\r\n")
		c.expect("250 ")
		c.cmd("NOOP", "250 ")
		msgs := e.q.messages()
		if body := msgs[len(msgs)-1].Body; !bytes.Contains(body, []byte("\r\n"+line+"\r\nMAIL FROM:<smuggled@x.example>\r\n")) {
			t.Errorf("line of %d not stored as is", n)
		}
	}
	// Command lines: 2000 octets is go-smtp's limit.
	c := dial(t, e.addr(0))
	c.hello()
	c.cmd("NOOP "+strings.Repeat("n", 1990), "250 ")
	c.send("NOOP " + strings.Repeat("n", 2000))
	c.expect("500 5.4.0")
	c.expectClosed()
}

// sized is a body of exactly n octets (n >= 2) in lines of at most 100.
func sized(n int) string {
	var b strings.Builder
	for n > 0 {
		k := min(n, 100)
		if n-k == 1 { // never leave a single octet
			k--
		}
		b.WriteString(strings.Repeat("x", k-2) + "\r\n")
		n -= k
	}
	return b.String()
}

// TestEnvelope_AddRcpt: duplicates are dropped, in order, below and above
// the count from which a map finds them.
func TestEnvelope_AddRcpt(t *testing.T) {
	for _, n := range []int{1, 2, seenThreshold - 1, seenThreshold, seenThreshold + 1, 3 * seenThreshold} {
		env := &envelope{}
		env.rcpts = env.first[:0]
		var want []string
		seen := map[string]bool{}
		for i := range 2 * n {
			addr := fmt.Sprintf("r%d@x.example", (i*7)%n) // every address twice, interleaved
			env.addRcpt(queue.NewRecipient{Addr: addr, Domain: "x.example"})
			if !seen[addr] {
				seen[addr] = true
				want = append(want, addr)
			}
		}
		var got []string
		for _, r := range env.rcpts {
			got = append(got, r.Addr)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("n=%d: %v, want %v", n, got, want)
		}
	}
}
