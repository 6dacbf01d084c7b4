package smtpd

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
)

// smuggling lists end-of-data impostors: sequences some MTA might take for
// the final dot where RFC 5321 allows only CRLF.CRLF (SMTP smuggling).
var smuggling = []struct{ name, seq string }{
	{"lflf", "\n.\n"},
	{"crcr", "\r.\r"},
	{"cr.lf", "\r.\n"},
	{"lf.cr", "\n.\r"},
	{"lfcrlf", "\n.\r\n"},
	{"crlflf", "\r\n.\n"},
	{"cr.crlf", "\r.\r\n"},
	{"crlfcr", "\r\n.\r"},
	{"nullbefore", "\r\n\x00.\r\n"},
	{"nullafter", "\r\n.\x00\r\n"},
	{"crlf.crcrlf", "\r\n.\r\r\n"},
	{"crcrlf.crcrlf", "\r\r\n.\r\r\n"},
	{"CR+CRLF.CRLF", "\r\r\n.\r\n"},
}

// TestData_Smuggling: no impostor ends the data, the smuggled MAIL is never
// run (at most one transaction), and nothing stored has a stray CR or LF.
// With bare_cr: reject, a message with a stray CR is refused with 521 5.5.2
// and the connection closed.
func TestData_Smuggling(t *testing.T) {
	for _, mode := range []config.BareCRPolicy{config.BareCRNormalize, config.BareCRReject} {
		cfg := trustedConfig(t)
		cfg.BareCR = mode
		e := startServer(t, cfg)
		for _, tc := range smuggling {
			before := len(e.q.messages())
			c := dial(t, e.addr(0))
			c.hello()
			c.cmd("MAIL FROM:<a@x.example>", "250 ")
			c.cmd("RCPT TO:<b@y.example>", "250 ")
			c.cmd("DATA", "354 ")
			c.write("Subject: t\r\n\r\nbody" + tc.seq +
				"MAIL FROM:<smuggled@x.example>\r\nRCPT TO:<victim@y.example>\r\nDATA\r\nsmuggled\r\n.\r\n")
			got := c.reply()[0]
			after := e.q.messages()
			switch {
			case strings.HasPrefix(got, "250 "):
				if len(after) != before+1 {
					t.Errorf("%s/%s: 250 but %d new messages", mode, tc.name, len(after)-before)
				}
				c.cmd("NOOP", "250 ") // in sync: the smuggled commands were data
			case strings.HasPrefix(got, "521 5.5.2"):
				if mode != "reject" {
					t.Errorf("%s/%s: %q", mode, tc.name, got)
				}
				c.expectClosed()
			case strings.HasPrefix(got, "554 5.6.0"): // NUL
				c.cmd("NOOP", "250 ")
			default:
				t.Errorf("%s/%s: reply %q", mode, tc.name, got)
			}
			if len(after) > before+1 {
				t.Errorf("%s/%s: %d messages from one transaction", mode, tc.name, len(after)-before)
			}
			if strings.Contains(tc.seq, "\x00") && len(after) != before {
				t.Errorf("%s/%s: message with NUL stored", mode, tc.name)
			}
			// go-smtp drops the CR of CRLF "." CR <x>, so in crlfcr and
			// crlf.crcrlf there is no stray CR left for us to see.
			hasStrayCR := strings.Contains(strings.ReplaceAll(tc.seq, "\r\n", ""), "\r") &&
				tc.name != "crlfcr" && tc.name != "crlf.crcrlf"
			if mode == "reject" && hasStrayCR && len(after) != before {
				t.Errorf("%s/%s: stray CR accepted", mode, tc.name)
			}
		}
		for _, m := range e.q.messages() {
			if strayCRLF(m.Body) {
				t.Errorf("%s: stored body with a stray CR or LF: %q", mode, m.Body)
			}
			if !bytes.Contains(m.Body, []byte("MAIL FROM:<smuggled@x.example>")) {
				t.Errorf("%s: smuggled text not kept inside the message: %q", mode, m.Body)
			}
		}
	}
}

func TestData_Normalisation(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	tests := []struct{ in, want string }{
		{"a\r\nb\r\n", "a\r\nb\r\n"},
		{"a\nb\r\n", "a\r\nb\r\n"}, // bare LF is a line end
		{"a\rb\r\n", "a b\r\n"},    // stray CR becomes a space
		{"a\r\r\nb\r\n", "a \r\nb\r\n"},
		{"..dot\r\n", ".dot\r\n"}, // dot-stuffing undone
		{"\r\n", "\r\n"},
		{"", ""},                         // empty body
		{"\xff\xfe\r\n", "\xff\xfe\r\n"}, // 8-bit kept
	}
	c := dial(t, e.addr(0))
	c.hello()
	for i, tc := range tests {
		if got := c.sendMessage("a@x.example", []string{"b@y.example"}, tc.in); !strings.HasPrefix(got, "250 ") {
			t.Fatalf("%q: %s", tc.in, got)
		}
		m := e.q.messages()[i]
		if got := string(bodyOf(m.Body)); got != tc.want {
			t.Errorf("%q stored as %q, want %q", tc.in, got, tc.want)
		}
		if m.EightBit != strings.Contains(tc.in, "\xff") {
			t.Errorf("%q: EightBit %v", tc.in, m.EightBit)
		}
	}
}

func TestData_QueueFailureIs451(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	e.q.fail = errors.New("disk on fire")
	c := dial(t, e.addr(0))
	c.hello()
	if got := c.sendMessage("a@x.example", []string{"b@y.example"}, "x\r\n"); got != "451 4.3.0 Local error in processing, try again later" {
		t.Fatalf("reply %q", got)
	}
	c.cmd("NOOP", "250 ")
	if len(e.logs.FilterMessage("enqueue failed").All()) != 1 {
		t.Error("queue failure not logged")
	}
}

// A queue that refuses for want of room (its reserve, or a disk that
// filled during the commit) gets 452 4.3.1, as the free-space check's.
func TestData_QueueOutOfRoomIs452(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	e.q.fail = fmt.Errorf("queue: 10 octets free, 20 needed to keep the reserve: %w", syscall.ENOSPC)
	c := dial(t, e.addr(0))
	c.hello()
	if got := c.sendMessage("a@x.example", []string{"b@y.example"}, "x\r\n"); got != "452 4.3.1 Insufficient system storage" {
		t.Fatalf("reply %q", got)
	}
	c.cmd("NOOP", "250 ")
}

func TestData_LowDiskIs452(t *testing.T) {
	cfg := trustedConfig(t)
	cfg.Limits.MaxMessageBytes = 1000
	e := startServer(t, cfg)
	c := dial(t, e.addr(0))
	c.hello()
	e.disk.Store(1499)
	c.cmd("MAIL FROM:<a@x.example>", "452 4.3.1 Insufficient system storage")
	e.disk.Store(1500)
	c.cmd("MAIL FROM:<a@x.example>", "250 ")
	c.cmd("RCPT TO:<b@y.example>", "250 ")
	c.cmd("DATA", "354 ")
	e.disk.Store(100) // the disk filled up during DATA
	c.write("x\r\n.\r\n")
	c.expect("452 4.3.1")
	if len(e.q.messages()) != 0 {
		t.Fatal("message stored")
	}
}

// TestData_ReceivedHeader checks the header is built from validated data
// only: nothing the client sent can inject a line or a control byte.
func TestData_ReceivedHeader(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	for _, tc := range []struct{ helo, want string }{
		{"client.example", "Received: from client.example ([127.0.0.1])\r\n"},
		{"[127.0.0.1]", "Received: from [127.0.0.1] ([127.0.0.1])\r\n"},
		{"a\rb", "Received: from unknown ([127.0.0.1]) (helo=a_b)\r\n"},
		{"x\x00y", "Received: from unknown ([127.0.0.1]) (helo=x_y)\r\n"},
		{"1.2.3.4", "Received: from unknown ([127.0.0.1]) (helo=1.2.3.4)\r\n"},
		{"my_pc", "Received: from unknown ([127.0.0.1]) (helo=my_pc)\r\n"},
		{strings.Repeat("h", 1900), "Received: from unknown ([127.0.0.1]) (helo=" + strings.Repeat("h", 64) + ")\r\n"},
	} {
		c := dial(t, e.addr(0))
		c.expect("220 ")
		if !greetingOK(tc.helo) {
			// Refused at EHLO now (TestSession_Greeting); the header's own
			// sanitising is checked on the name directly.
			c.cmd("EHLO "+tc.helo, "501 5.5.2")
			if got := "Received: from unknown ([127.0.0.1]) (helo=" + sanitizeHelo(tc.helo) + ")\r\n"; got != tc.want {
				t.Errorf("HELO %q: %q", tc.helo, got)
			}
			continue
		}
		c.cmd("EHLO "+tc.helo, "250 ")
		c.sendMessage("a@x.example", []string{"b@y.example"}, "x\r\n")
		msgs := e.q.messages()
		m := msgs[len(msgs)-1]
		if !bytes.HasPrefix(m.Body, []byte(tc.want)) {
			t.Errorf("HELO %q: %q", tc.helo, m.Body)
		}
		hdr := m.Body[:len(m.Body)-len(bodyOf(m.Body))]
		date := hdr[bytes.LastIndex(hdr, []byte("; "))+2 : len(hdr)-2]
		if _, err := time.Parse("Mon, 02 Jan 2006 15:04:05 -0700", string(date)); err != nil {
			t.Errorf("date %q: %v", date, err)
		}
		if strayCRLF(m.Body) || bytes.IndexByte(m.Body, 0) >= 0 || !bytes.HasSuffix(m.Body, []byte("\r\nx\r\n")) {
			t.Errorf("body %q", m.Body)
		}
		if m.Helo != sanitizeHelo(tc.helo) {
			t.Errorf("stored HELO %q", m.Helo)
		}
	}
}

func TestCountReceived(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"Received: a\r\nreceived:b\r\nRECEIVED : c\r\n\tfolded Received: x\r\nSubject: x\r\n\r\nReceived: body\r\n", 3},
		{"Received: a", 1},
		{"\r\nReceived: a\r\n", 0},
		{"X-Received: a\r\nReceivedx: b\r\n", 0},
	}
	for _, tc := range tests {
		if got := scanHeader([]byte(tc.in)).received; got != tc.want {
			t.Errorf("scanHeader(%q).received = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestScanHeaderTLSRequired: "TLS-Required: No" (RFC 8689 §5) is found
// in the header section only, in any case, and no other value counts.
func TestScanHeaderTLSRequired(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"Subject: x\r\nTLS-Required: No\r\n\r\nbody\r\n", true},
		{"tls-required :  no \r\n\r\n", true},
		{"TLS-Required: Yes\r\n\r\n", false},
		{"TLS-Required: Nope\r\n\r\n", false},
		{"Subject: x\r\n\r\nTLS-Required: No\r\n", false},
		{"X-TLS-Required: No\r\n\r\n", false},
	} {
		if got := scanHeader([]byte(tc.in)).tlsOptional; got != tc.want {
			t.Errorf("scanHeader(%q).tlsOptional = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestData_BufferReuse: message buffers are reused between messages and
// sessions (data.go dataBuf); nothing of one message may show in the
// next, whatever the sizes, SIZE= declarations and refusals in between.
func TestData_BufferReuse(t *testing.T) {
	cfg := trustedConfig(t)
	cfg.Limits.MaxMessageBytes = 2 * maxPooledBody
	cfg.BareCR = "reject"
	e := startServer(t, cfg)
	big := strings.Repeat(strings.Repeat("b", 98)+"\r\n", (maxPooledBody+1000)/100)
	for _, tc := range []struct {
		size       int // SIZE= declaration, 0 for none
		body, want string
	}{
		{0, "first\r\n", "first\r\n"},
		{0, big, big},
		{0, "x\r\n", "x\r\n"},
		{len(big), big, big},
		{40000, "y\nz\r\n", "y\r\nz\r\n"},
		{0, "nul\x00\r\n", ""}, // refused, 554
		{0, "z\r\n", "z\r\n"},
		{0, "bare\rcr\r\n", ""}, // refused, 521, connection closed
		{0, "", ""},
		{0, "last\r\n", "last\r\n"},
	} {
		c := dial(t, e.addr(0))
		c.hello()
		before := len(e.q.messages())
		mail := "MAIL FROM:<a@x.example>"
		if tc.size > 0 {
			mail += fmt.Sprintf(" SIZE=%d", tc.size)
		}
		c.cmd(mail, "250 ")
		c.cmd("RCPT TO:<b@y.example>", "250 ")
		c.cmd("DATA", "354 ")
		c.write(tc.body + ".\r\n")
		got := c.reply()[0]
		msgs := e.q.messages()
		if tc.want == "" && tc.body != "" {
			if strings.HasPrefix(got, "250 ") || len(msgs) != before {
				t.Fatalf("%.20q: %q, stored", tc.body, got)
			}
			continue
		}
		if !strings.HasPrefix(got, "250 ") || len(msgs) != before+1 {
			t.Fatalf("%.20q: %q", tc.body, got)
		}
		if body := string(bodyOf(msgs[before].Body)); body != tc.want {
			t.Fatalf("%.20q stored as %.40q (%d octets)", tc.body, body, len(body))
		}
	}
}
