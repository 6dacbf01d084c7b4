package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// rbSmuggleVariants are 13 end-of-data impostors: sequences some MTA might
// take for the final dot where RFC 5321 allows only CRLF.CRLF.
var rbSmuggleVariants = []struct {
	name string
	seq  string
	// strayCR: the relay sees a CR that is not part of a CRLF, so
	// bare_cr: reject must refuse the message (521 5.5.2). Variants whose
	// CR go-smtp swallows together with a leading dot ("CRLF . CR x")
	// are not marked: the relay never sees that CR.
	strayCR bool
	nul     bool // contains NUL: refused with 554 5.6.0 under both policies
}{
	{"lflf", "\n.\n", false, false},
	{"crcr", "\r.\r", true, false},
	{"cr.lf", "\r.\n", true, false},
	{"lf.cr", "\n.\r", true, false},
	{"lfcrlf", "\n.\r\n", false, false},
	{"crlflf", "\r\n.\n", false, false},
	{"cr.crlf", "\r.\r\n", true, false},
	{"crlfcr", "\r\n.\r", false, false},
	{"nullbefore", "\r\n\x00.\r\n", false, true},
	{"nullafter", "\r\n.\x00\r\n", false, true},
	{"crlf.crcrlf", "\r\n.\r\r\n", false, false},
	{"crcrlf.crcrlf", "\r\r\n.\r\r\n", true, false},
	{"CR+CRLF.CRLF", "\r\r\n.\r\n", true, false},
}

// TestRobustSmuggling: SMTP smuggling, inbound and outbound. Every
// end-of-data impostor, sent to the relay with a smuggled transaction
// behind it, yields at most one message at the destination, the smuggled
// MAIL FROM is never executed (neither by the relay nor at the
// destination), and the destination's raw DATA bytes never contain a CR
// or LF outside a CRLF pair. Both bare_cr policies are run. The
// destination is a raw recorder (rbRawSink), not go-smtp, so that the
// bytes checked are the bytes on the wire.
func TestRobustSmuggling(t *testing.T) {
	t.Parallel()
	relayIP, sinkIP, clientIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	sink := rbStartRawSink(t, sinkIP)
	for _, policy := range []string{"normalize", "reject"} {
		t.Run(policy, func(t *testing.T) {
			cfg := rbRelay{IP: relayIP, BareCR: policy, Routes: map[string]string{"dest.test": sink.Addr}}
			r := peers.StartRelay(t, cfg.YAML(t))
			accepted := map[string]bool{}
			for _, v := range rbSmuggleVariants {
				id := fmt.Sprintf("%s.%s@smuggle.test", v.name, policy)
				data := "Subject: smuggle " + v.name + "\r\nMessage-ID: <" + id + ">\r\n\r\nbody" + v.seq +
					"MAIL FROM:<smuggled@x.test>\r\nRCPT TO:<victim@dest.test>\r\nDATA\r\nsmuggled\r\n.\r\n"
				replies, err := rbSmuggleOnce(r.SMTPAddr, clientIP, data)
				if err != nil {
					t.Errorf("%s: %v (replies %v)", v.name, err, replies)
					continue
				}
				first := replies[0]
				switch {
				case v.nul:
					if first.Code != 554 {
						t.Errorf("%s: reply %v, want 554 5.6.0 (NUL refused)", v.name, first)
					}
				case policy == "reject" && v.strayCR:
					if first.Code != 521 {
						t.Errorf("%s: reply %v, want 521 5.5.2 (bare CR refused)", v.name, first)
					}
				default:
					if first.Code != 250 {
						t.Errorf("%s: reply %v, want 250 (normalised)", v.name, first)
					}
				}
				if first.Code/100 != 2 && first.Code/100 != 5 {
					t.Errorf("%s: reply %v is neither an acceptance nor a refusal", v.name, first)
				}
				// One reply for the whole DATA, then 221 to our QUIT (or the
				// close that follows a 521): anything more means a smuggled
				// command was executed.
				want := 2
				if first.Code == 521 {
					want = 1
				}
				if len(replies) != want {
					t.Errorf("%s: %d replies %v, want %d: smuggled commands were executed", v.name, len(replies), replies, want)
				}
				accepted[id] = first.Code == 250
			}
			n := 0
			for _, ok := range accepted {
				if ok {
					n++
				}
			}
			sink.waitFor(t, func(ms []rbRawMsg) bool { return rbCountIDs(ms, accepted) >= n }, 20*time.Second)
			rbWaitUntil(t, 20*time.Second, "an empty queue", func() bool { return rbStats(t, r).Messages == 0 })
			msgs := sink.messages()
			perID := map[string]int{}
			for _, m := range msgs {
				perID[rbMessageID(m.Data)]++
			}
			for id, ok := range accepted {
				want := 0
				if ok {
					want = 1
				}
				if perID[id] != want {
					t.Errorf("%s: %d messages at the destination, want %d", id, perID[id], want)
				}
			}
		})
	}
	// Over both policies: nothing smuggled reached the destination, and no
	// DATA carried a stray CR or LF.
	for _, cmd := range sink.commands() {
		if strings.Contains(cmd, "smuggled") || strings.Contains(cmd, "victim") {
			t.Errorf("the destination received the smuggled command %q", cmd)
		}
	}
	for _, m := range sink.messages() {
		if m.From != "sender@src.test" || len(m.Rcpts) != 1 || m.Rcpts[0] != "rcpt@dest.test" {
			t.Errorf("unexpected transaction at the destination: MAIL %q RCPT %v", m.From, m.Rcpts)
		}
		if i := rbStrayCRLF(m.Raw); i >= 0 {
			t.Errorf("%s: stray CR or LF at byte %d of the raw DATA: %q", rbMessageID(m.Data), i,
				m.Raw[max(0, i-20):min(len(m.Raw), i+20)])
		}
	}
}

// rbSmuggleOnce sends one transaction with data written raw after 354
// (followed by nothing: data carries its own final CRLF.CRLF), then QUIT,
// and returns every reply after the 354 until the connection closes.
func rbSmuggleOnce(addr, localIP, data string) ([]rbReply, error) {
	c, err := rbDialSMTP(addr, localIP, false, "smuggler.test")
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.timeout = 10 * time.Second
	for _, cmd := range []string{"MAIL FROM:<sender@src.test>", "RCPT TO:<rcpt@dest.test>"} {
		if r, err := c.Cmd(cmd); err != nil || r.Code != 250 {
			return nil, fmt.Errorf("%s: %v %v", cmd, r, err)
		}
	}
	if r, err := c.Cmd("DATA"); err != nil || r.Code != 354 {
		return nil, fmt.Errorf("DATA: %v %v", r, err)
	}
	if err := c.WriteRaw([]byte(data)); err != nil {
		return nil, err
	}
	first, err := c.Read()
	if err != nil {
		return nil, fmt.Errorf("reply to the final dot: %w", err)
	}
	replies := []rbReply{first}
	_ = c.WriteRaw([]byte("QUIT\r\n")) // fails after a 521 close: that is fine
	for {
		r, err := c.Read()
		if err != nil {
			break // EOF: the server closed
		}
		replies = append(replies, r)
	}
	return replies, nil
}

// rbStrayCRLF returns the index of the first CR not followed by LF or LF
// not preceded by CR, or -1.
func rbStrayCRLF(b []byte) int {
	for i, c := range b {
		switch {
		case c == '\r' && (i+1 >= len(b) || b[i+1] != '\n'):
			return i
		case c == '\n' && (i == 0 || b[i-1] != '\r'):
			return i
		}
	}
	return -1
}

func rbCountIDs(ms []rbRawMsg, ids map[string]bool) int {
	n := 0
	for _, m := range ms {
		if ids[rbMessageID(m.Data)] {
			n++
		}
	}
	return n
}

// rbRawSink is a minimal SMTP destination that records the raw DATA bytes
// exactly as they crossed the wire (up to and including the CRLF.CRLF it
// took as the end) and every command line. It offers no extensions but
// 8BITMIME and accepts everything.
type rbRawSink struct {
	Addr string
	ln   net.Listener

	mu      sync.Mutex
	msgs    []rbRawMsg
	cmds    []string
	changed chan struct{}
}

// rbRawMsg is one transaction at the raw sink.
type rbRawMsg struct {
	From  string
	Rcpts []string
	Raw   []byte // the DATA bytes on the wire, terminator included
	Data  []byte // Raw dot-unstuffed, without the terminator
}

func rbStartRawSink(t testing.TB, ip string) *rbRawSink {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rbRawSink{Addr: ln.Addr().String(), ln: ln, changed: make(chan struct{})}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); s.serve(c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return s
}

func (s *rbRawSink) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(io.LimitReader(c, 64<<20))
	say := func(line string) { _, _ = io.WriteString(c, line+"\r\n") }
	say("220 rawsink.test ESMTP")
	var cur *rbRawMsg
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		s.note(func() { s.cmds = append(s.cmds, strings.TrimRight(line, "\r\n")) })
		verb, arg, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
		switch strings.ToUpper(verb) {
		case "EHLO":
			say("250-rawsink.test\r\n250 8BITMIME")
		case "HELO", "NOOP", "RSET":
			cur = nil
			say("250 OK")
		case "MAIL":
			cur = &rbRawMsg{From: rbAngle(arg)}
			say("250 OK")
		case "RCPT":
			if cur != nil {
				cur.Rcpts = append(cur.Rcpts, rbAngle(arg))
			}
			say("250 OK")
		case "DATA":
			say("354 go ahead")
			raw, err := rbReadRawData(br)
			if err != nil {
				return
			}
			if cur != nil {
				cur.Raw, cur.Data = raw, rbUnstuff(raw)
				m := *cur
				s.note(func() { s.msgs = append(s.msgs, m) })
			}
			cur = nil
			say("250 OK stored")
		case "QUIT":
			say("221 bye")
			return
		default:
			say("500 5.5.2 unknown command")
		}
	}
}

// rbReadRawData reads up to and including the first CRLF.CRLF (or a "."
// line at the very start).
func rbReadRawData(br *bufio.Reader) ([]byte, error) {
	var raw []byte
	for {
		c, err := br.ReadByte()
		if err != nil {
			return nil, err
		}
		raw = append(raw, c)
		if bytes.HasSuffix(raw, []byte("\r\n.\r\n")) || string(raw) == ".\r\n" {
			return raw, nil
		}
	}
}

// rbUnstuff removes the terminator and the stuffing dots.
func rbUnstuff(raw []byte) []byte {
	body := bytes.TrimSuffix(raw, []byte(".\r\n"))
	var b bytes.Buffer
	for _, line := range bytes.SplitAfter(body, []byte("\r\n")) {
		if len(line) > 0 && line[0] == '.' {
			line = line[1:]
		}
		b.Write(line)
	}
	return b.Bytes()
}

func rbAngle(arg string) string {
	_, v, _ := strings.Cut(arg, ":")
	v, _, _ = strings.Cut(strings.TrimSpace(v), " ")
	return strings.Trim(v, "<>")
}

func (s *rbRawSink) note(f func()) {
	s.mu.Lock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func (s *rbRawSink) messages() []rbRawMsg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]rbRawMsg(nil), s.msgs...)
}

func (s *rbRawSink) commands() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.cmds...)
}

// waitFor waits until cond holds for the recorded messages.
func (s *rbRawSink) waitFor(t testing.TB, cond func([]rbRawMsg) bool, timeout time.Duration) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if cond(s.messages()) {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("raw sink %s: condition not met after %v; %d messages", s.Addr, timeout, len(s.messages()))
		}
	}
}
