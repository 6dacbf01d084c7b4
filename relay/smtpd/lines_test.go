package smtpd

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLines_OverlongCommandIsAnswered: a command line over the limit gets
// a 500 the client can read, then the connection closes; the server
// drains what the client is still sending instead of resetting the
// connection over the reply (in plaintext and under TLS, where the bound
// is maxTLSCommandBytes). Lines within the limit and BDAT chunk data of any
// shape are no command lines. The message size limit, which is go-smtp's
// own line limit (lines.go), is above the TLS bound here, so that the
// bound tested is ours; under TLS the command is a MAIL padded with
// spaces, whose start, read before the bound was passed, must not run (a
// cut NOOP would get its own 250 first, as lines.go says).
func TestLines_OverlongCommandIsAnswered(t *testing.T) {
	cert, key := writeCert(t)
	cfg := trustedConfig(t)
	cfg.Limits.MaxMessageBytes = 1 << 20
	cfg.Listeners[0].TLSCert, cfg.Listeners[0].TLSKey = cert, key
	e := startServer(t, cfg)
	for _, tc := range []struct {
		name string
		tls  bool
		cmd  string
		pad  string
		size int
	}{
		{"plaintext", false, "NOOP ", "n", 300 << 10},
		{"starttls", true, "MAIL FROM:<a@x.example>", " ", maxTLSCommandBytes + 100<<10},
	} {
		c := dial(t, e.addr(0))
		c.hello()
		if tc.tls {
			c.startTLS()
			c.cmd("EHLO client.example", "250 ")
			c.cmd("NOOP "+strings.Repeat("n", 3000), "250 ") // under TLS only the memory bound holds
		}
		done := make(chan error, 1)
		go func() {
			_, err := io.WriteString(c.conn, tc.cmd+strings.Repeat(tc.pad, tc.size)+"\r\nNOOP\r\n")
			done <- err
		}()
		c.expect("500 5.4.0 Too long line, closing connection")
		// A clean end (FIN), not a reset: the server read what was sent.
		c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if rest, err := io.ReadAll(c.r); err != nil || len(rest) > 0 {
			t.Errorf("%s: after the 500: %q, %v; want a clean close", tc.name, rest, err)
		}
		if err := <-done; err != nil {
			t.Errorf("%s: the client's write failed (%v): the server reset the connection", tc.name, err)
		}
	}
}

// TestLines_OverlongCommandDoesNotRun: the part of an over-long command
// that arrived before it passed the limit (in an earlier read) is not run
// as a command of its own: the client gets the one 500 and the close, and
// neither the sender nor the recipient it names was taken.
func TestLines_OverlongCommandDoesNotRun(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	for _, tc := range []struct{ name, before, cmd string }{
		{"MAIL", "", "MAIL FROM:<a@x.example>"},
		{"RCPT", "MAIL FROM:<a@x.example>", "RCPT TO:<b@y.example>"},
		{"AUTH", "", "AUTH PLAIN"},
	} {
		c := dial(t, e.addr(0))
		c.hello()
		if tc.before != "" {
			c.cmd(tc.before, "250 ")
		}
		// Two writes apart, so that the server reads the start of the line
		// before the rest takes it over the limit.
		c.write(tc.cmd + strings.Repeat(" ", maxLineLength-100))
		time.Sleep(100 * time.Millisecond)
		c.write(strings.Repeat(" ", 200) + "\r\n")
		c.expect("500 5.4.0 Too long line, closing connection")
		c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if rest, err := io.ReadAll(c.r); err != nil || len(rest) > 0 {
			t.Errorf("%s: after the 500: %q, %v; want a clean close and no other reply", tc.name, rest, err)
		}
	}
}

// TestLines_BDATChunksAreNotCommands: the octets of a BDAT chunk are not
// measured as a command line, whether the chunk is taken or refused (the
// chunk of a BDAT without RCPT is read and dropped, RFC 3030 §2).
func TestLines_BDATChunksAreNotCommands(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	chunk := "Subject: x\r\n\r\n" + strings.Repeat("b", 5000)
	c.write("BDAT " + strconv.Itoa(len(chunk)) + " LAST\r\n" + chunk)
	c.expect("502 5.5.1")
	c.write("MAIL FROM:<a@x.example>\r\nRCPT TO:<b@y.example>\r\nBDAT 3000\r\n" + strings.Repeat("c", 3000) +
		"BDAT  " + strconv.Itoa(len(chunk)) + "  last\r\n" + chunk)
	c.expect("250 ")
	c.expect("250 ")
	c.expect("250 ")
	c.expect("250 ")
	c.cmd("NOOP", "250 ")
	if body := e.q.messages()[0].Body; !bytes.HasSuffix(body, []byte(strings.Repeat("c", 3000)+chunk+"\r\n")) {
		t.Errorf("body ends %q", body[max(len(body)-50, 0):])
	}
}

// framerStream is a plaintext dialogue and whether the framer must pass it.
var framerStreams = []struct {
	name   string
	body   bool // Data starts reading after the first line
	stream string
	ok     bool
}{
	{"short commands", false, "EHLO x\r\nNOOP " + strings.Repeat("n", maxLineLength-7) + "\r\n", true},
	{"one octet over", false, "NOOP " + strings.Repeat("n", maxLineLength-6) + "\r\n", false},
	{"over without LF", false, "NOOP " + strings.Repeat("n", maxLineLength), false},
	{"bdat chunk", false, "BDAT 3000 LAST\r\n" + strings.Repeat("x", 3000) + "NOOP\r\n", true},
	{"bdat spaces", false, "bdat   3000   Last \r\n" + strings.Repeat("x", 3000) + "NOOP\r\n", true},
	{"bdat then long", false, "BDAT 3\r\nabc" + strings.Repeat("n", maxLineLength+1), false},
	{"bad bdat is a command", false, "BDAT 3000 NOW\r\n" + strings.Repeat("x", 3000), false},
	{"body", true, "DATA\r\n" + strings.Repeat("b", 5000) + "\r\n.\r\nNOOP\r\n", true},
	{"after body", true, "DATA\r\nb\r\n.\r\n" + strings.Repeat("n", maxLineLength+1), false},
	{"empty body", true, "DATA\r\n.\r\n" + strings.Repeat("n", maxLineLength+1), false},
	{"starttls", false, "STARTTLS\r\n" + strings.Repeat("\x16", 5000), true},
	{"starttls lower case", false, "starttls\r\n" + strings.Repeat("\x16", 5000), true},
	// go-smtp upper-cases the verb with strings.ToUpper: U+017F is S.
	{"starttls long s", false, "\u017ftarttls\r\n" + strings.Repeat("\x16", 5000), true},
	{"not starttls", false, "STARTTLX\r\n" + strings.Repeat("\x16", 5000), false},
}

// TestLineFramer: the framer's verdict on each stream is the same however
// the stream is cut into reads.
func TestLineFramer(t *testing.T) {
	for _, tc := range framerStreams {
		for cut := 0; cut <= len(tc.stream); cut += 1 + len(tc.stream)/300 {
			if got := frame(tc.stream, tc.body, cut); got != tc.ok {
				t.Errorf("%s, cut at %d: %v, want %v", tc.name, cut, got, tc.ok)
				break
			}
		}
	}
}

// frame feeds stream to a framer in two reads cut at cut (and the first
// line on its own when body is set, as Data starts after it).
func frame(stream string, body bool, cut int) bool {
	var f lineFramer
	p := []byte(stream)
	if body {
		i := bytes.IndexByte(p, '\n') + 1
		if !f.scan(p[:i]) {
			return false
		}
		f.beginBody()
		p = p[i:]
		cut = max(cut-i, 0)
	}
	cut = min(cut, len(p))
	return f.scan(p[:cut]) && f.scan(p[cut:])
}

// FuzzLineFramer: the framer never panics, and cutting a stream into
// reads never changes its verdict.
func FuzzLineFramer(f *testing.F) {
	for _, tc := range framerStreams {
		f.Add(tc.stream, tc.body, 7)
	}
	f.Fuzz(func(t *testing.T, stream string, body bool, cut int) {
		if !body || strings.Contains(stream, "\n") {
			whole := frame(stream, body, len(stream))
			if cut < 0 {
				cut = -cut
			}
			if got := frame(stream, body, cut%(len(stream)+1)); got != whole {
				t.Fatalf("cut at %d: %v, whole: %v", cut, got, whole)
			}
		}
	})
}

// TestLines_EchoedCommandHasNoBareCR: go-smtp echoes an unknown command's
// first four octets; a CR among them never reaches the client bare.
func TestLines_EchoedCommandHasNoBareCR(t *testing.T) {
	e := startServer(t, trustedConfig(t))
	c := dial(t, e.addr(0))
	c.hello()
	for _, cmd := range []string{"A\rBC x", "\rXYZ", "AB\rC"} {
		for _, l := range c.cmd(cmd, "500 ") {
			if strings.Contains(l, "\r") {
				t.Errorf("%q: reply %q", cmd, l)
			}
		}
	}
	c.cmd("NOOP", "250 ")
	for _, tc := range []struct{ in, want string }{
		{"250 ok\r\n", "250 ok\r\n"}, {"500 A\rB\r\n", "500 A B\r\n"}, {"\r", " "}, {"a\r\r\n", "a \r\n"}, {"", ""},
	} {
		if got := string(strayCRToSpace([]byte(tc.in))); got != tc.want {
			t.Errorf("strayCRToSpace(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestLines_LargeBDATUnderTLS: a BDAT chunk far larger than the command
// bound, sent under TLS, is message data, not one long command.
func TestLines_LargeBDATUnderTLS(t *testing.T) {
	cert, key := writeCert(t)
	cfg := trustedConfig(t)
	cfg.Listeners[0].TLSCert, cfg.Listeners[0].TLSKey = cert, key
	cfg.Limits.MaxMessageBytes = 4 << 20
	e := startServer(t, cfg)
	c := dial(t, e.addr(0))
	c.hello()
	c.startTLS()
	c.cmd("EHLO client.example", "250 ")
	chunk := "Subject: x\r\n\r\n" + strings.Repeat(strings.Repeat("b", 998)+"\r\n", 3<<10) // 3 MiB
	c.write("MAIL FROM:<a@x.example>\r\nRCPT TO:<b@y.example>\r\nBDAT " + strconv.Itoa(len(chunk)) + " LAST\r\n" + chunk)
	c.expect("250 ")
	c.expect("250 ")
	c.expect("250 2.0.0 OK queued")
	c.cmd("NOOP", "250 ")
}
