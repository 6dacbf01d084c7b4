package integration

import (
	"bytes"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// longLineMessage is an HTML message written on one line of 2,100 octets,
// as applications write it, with a second long line that starts with a
// dot (dot-stuffed on the DATA path, folded the same on both).
func longLineMessage(from, to string) []byte {
	var b bytes.Buffer
	b.WriteString("From: <" + from + ">\r\nTo: <" + to + ">\r\nSubject: one-line HTML\r\n")
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/html; charset=us-ascii\r\n\r\n")
	b.WriteString("<html><body><p>" + strings.Repeat("0123456789", 207) + "</p></body></html>\r\n") // 2,100 octets
	b.WriteString("." + strings.Repeat("d", 1199) + "\r\nend")
	return b.Bytes()
}

// folded is msg with every line longer than limit octets broken by CRLF
// SP after limit octets and then every limit-1 (Postfix's
// smtp_line_length_limit), as a receiver stores it.
func folded(msg []byte, limit int) []byte {
	var out bytes.Buffer
	for _, l := range strings.SplitAfter(string(msg), "\r\n") {
		text := strings.TrimSuffix(l, "\r\n")
		col := 0
		for i := 0; i < len(text); i++ {
			if col == limit {
				out.WriteString("\r\n ")
				col = 1
			}
			out.WriteByte(text[i])
			col++
		}
		out.WriteString(l[len(text):])
	}
	return out.Bytes()
}

// TestIntakeLongLineFolded: a message with a 2,100-octet line is accepted
// from swaks (like Postfix, greyrelay takes lines up to the message size)
// and reaches the destination folded at delivery.line_length_limit (998):
// over BDAT to a recording sink, and over DATA to a real Postfix that
// passes it on.
func TestIntakeLongLineFolded(t *testing.T) {
	peers.Require(t, "swaks", "postfix")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	n.postfix("pf.test", peers.PostfixConfig{DeliverTo: final.Addr})
	bdat := n.relay()
	data := n.relay("delivery.chunking=false")

	for _, tc := range []struct {
		name  string
		r     *testRelay
		to    string
		sink  *peers.Sink
		chunk bool
	}{
		{"BDAT to a sink", bdat, "b@dest.test", sink, true},
		{"DATA to Postfix", data, "b@pf.test", final, false},
	} {
		msg := longLineMessage("a@src.test", tc.to)
		tc.r.send(peers.SwaksMessage{From: "a@src.test", To: []string{tc.to}, Data: msg})
		got := tc.sink.WaitFor(t, 1, 30*time.Second)[0]
		want := folded(onWire(msg), 998)
		if stripped := withoutTrace(got.Data); !bytes.Equal(stripped, want) {
			i := 0
			for i < min(len(stripped), len(want)) && stripped[i] == want[i] {
				i++
			}
			t.Errorf("%s: arrived (%d octets, want %d) differs at %d: %q, want %q", tc.name, len(stripped), len(want), i,
				stripped[max(i-20, 0):min(i+40, len(stripped))], want[max(i-20, 0):min(i+40, len(want))])
		}
		for _, l := range strings.Split(string(got.Data), "\r\n") {
			if len(l) > 998 {
				t.Errorf("%s: a line of %d octets arrived", tc.name, len(l))
			}
		}
		if cmds := tc.sink.Commands(); tc.chunk != (cmds["BDAT"] > 0) {
			t.Errorf("%s: commands at the destination %v", tc.name, cmds)
		}
	}
}

// TestIntakeOverlongCommand: a command line over 2,000 octets (here an
// EHLO) gets "500 5.4.0 Too long line" that swaks reads, then the
// connection closes cleanly: no "connection reset" in swaks's report.
func TestIntakeOverlongCommand(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	r := n.relay()
	out, code := peers.SwaksMessage{Server: r.SMTPAddr, From: "a@src.test", To: []string{"b@dest.test"},
		Helo: strings.Repeat("h", 120000) + ".test"}.Send(t)
	if code == 0 || !strings.Contains(out, "500 5.4.0 Too long line, closing connection") {
		t.Fatalf("swaks exit %d, want the 500 reply:\n%s", code, out[max(len(out)-2000, 0):])
	}
	if strings.Contains(strings.ToLower(out), "reset") {
		t.Errorf("the client saw a reset:\n%s", out[max(len(out)-2000, 0):])
	}
	// The relay still serves the next client.
	if out, code := (peers.SwaksMessage{Server: r.SMTPAddr, From: "a@src.test", To: []string{"b@dest.test"},
		Args: []string{"--quit-after", "RCPT"}}).Send(t); code != 0 {
		t.Errorf("next client: swaks exit %d:\n%s", code, out)
	}
}

// TestIntakeAddressLiterals: user@[IP] is refused at RCPT by default
// (550 5.1.2, never looked up in DNS); with delivery.address_literals:
// deliver the message goes to that address, under the private-destination
// rule of MX targets.
func TestIntakeAddressLiterals(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	ip := n.host("")
	sink := peers.StartSink(t, net.JoinHostPort(ip, strconv.Itoa(n.port)), peers.SinkOptions{})
	rcpt := "user@[" + ip + "]"

	refuse := n.relay()
	out, code := peers.SwaksMessage{Server: refuse.SMTPAddr, From: "a@src.test", To: []string{rcpt}}.Send(t)
	if code != 24 || !strings.Contains(out, "550 5.1.2 Mail to address literals is not accepted here") {
		t.Errorf("refuse: swaks exit %d, want 24 with 550 5.1.2:\n%s", code, out)
	}

	deliver := n.relay("delivery.address_literals=deliver")
	msg := message("a@src.test", rcpt, "to a literal")
	deliver.send(peers.SwaksMessage{From: "a@src.test", To: []string{rcpt}, Data: msg})
	got := sink.WaitFor(t, 1, 20*time.Second)[0]
	if got.Rcpts[0] != rcpt || got.ClientIP != deliver.IP || !bytes.Equal(withoutTrace(got.Data), onWire(msg)) {
		t.Errorf("deliver: the literal's host got RCPT %v from %s", got.Rcpts, got.ClientIP)
	}

	private := n.relay("delivery.address_literals=deliver", "delivery.allow_private_destinations=false")
	id := private.send(peers.SwaksMessage{From: "a@src.test", To: []string{rcpt}})
	atts := private.waitAttempts(id, "deferred", 20*time.Second)
	if e := atts[0]; !strings.Contains(e.str("error")+e.str("reply"), "private") {
		t.Errorf("private literal: attempt %v, want it refused as a private address", e)
	}
	if n := len(sink.Messages()); n != 1 {
		t.Errorf("the literal's host got %d messages, want only the one allowed", n)
	}
}

// TestIntakeAddressFormsAndGreeting: what swaks sees and what a real
// Postfix next hop reads. A quoted local part ("a b"@..., RFC 5321 §4.1.2)
// and a quoted sender are taken and written out quoted again; RCPT
// TO:<Postmaster> without a domain (RFC 5321 §4.5.1) goes to the
// postmaster address; an EHLO carrying a bare CR gets 501 5.5.2 and is not
// echoed.
func TestIntakeAddressFormsAndGreeting(t *testing.T) {
	peers.Require(t, "swaks", "postfix")
	t.Parallel()
	n := newMailNet(t)
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	px := n.postfix("pf.test", peers.PostfixConfig{DeliverTo: final.Addr})
	r := n.relay("postmaster=ops@pf.test")

	msg := message(`"john doe"@src.test`, "postmaster", "address forms")
	r.send(peers.SwaksMessage{From: `"john doe"@src.test`, To: []string{"postmaster", `"a b"@pf.test`}, Data: msg})
	got := final.WaitFor(t, 1, 30*time.Second)[0]
	rcpts := slices.Sorted(slices.Values(got.Rcpts))
	if !slices.Equal(rcpts, []string{"a b@pf.test", "ops@pf.test"}) { // go-smtp unquotes
		t.Errorf("the final hop got RCPT %q", got.Rcpts)
	}
	want := []string{`from=<"john doe"@src.test>`, "to=<ops@pf.test>", `to=<"a b"@pf.test>`}
	if log := px.WaitLog(10*time.Second, want...); !strings.Contains(log, want[1]) || !strings.Contains(log, want[2]) || !strings.Contains(log, want[0]) {
		t.Errorf("Postfix did not read the addresses %v:\n%s", want, log)
	}

	out, code := peers.SwaksMessage{Server: r.SMTPAddr, From: "a@src.test", To: []string{"b@pf.test"},
		Helo: "evil.test\rX-Injected: yes"}.Send(t)
	if code == 0 || !strings.Contains(out, "501 5.5.2 Invalid EHLO/HELO argument") {
		t.Errorf("swaks exit %d, want 501 5.5.2 at EHLO:\n%s", code, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "<") && strings.Contains(l, "X-Injected") {
			t.Errorf("the relay echoed the injected text: %q", l)
		}
	}
}
