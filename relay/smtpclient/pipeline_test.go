package smtpclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// envelope2 is a transaction for two recipients.
var envelope2 = Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}, {Addr: "c@y.test"}}}

// group2 is envelope2's pipelined group: the peer reads it all before it
// answers anything, so a client that waited for a reply would time out.
var group2 = []string{"MAIL FROM:<a@x.test>", "RCPT TO:<b@y.test>", "RCPT TO:<c@y.test>", "DATA"}

// TestPipelining: with PIPELINING the envelope and DATA go out as one
// group, the replies are read in order, and TxResult says what it would
// say without pipelining. A transaction that did not complete gets RSET
// at the head of the next group; a completed one gets none.
func TestPipelining(t *testing.T) {
	tests := []struct {
		name   string
		script []step // after greet, ehloPipe
		check  func(t *testing.T, res TxResult, err error)
		lines  []string // what the peer must have received after EHLO (nil: not checked)
		data   int      // payloads the peer must have received
	}{
		{name: "all accepted", script: []step{{Pipe: group2, Send: "250 2.1.0 ok\r\n250 2.1.5 ok\r\n250 2.1.5 ok\r\n354 go\r\n"}, dataDone},
			check: func(t *testing.T, res TxResult, err error) {
				if err != nil || res.Mail.Code != 250 || !slices.Equal(codes(res.Rcpts), []int{250, 250}) || res.Data == nil || res.Data.Code != 250 {
					t.Errorf("Send = %+v, %v", res, err)
				}
			}, data: 1},
		{name: "one recipient refused", script: []step{{Pipe: group2, Send: "250 ok\r\n550 5.1.1 unknown\r\n250 ok\r\n354 go\r\n"}, dataDone},
			check: func(t *testing.T, res TxResult, err error) {
				if err != nil || !slices.Equal(codes(res.Rcpts), []int{550, 250}) || res.Rcpts[0].Reply.Enhanced != "5.1.1" ||
					res.Rcpts[1].Rcpt.Addr != "c@y.test" || res.Data == nil || res.Data.Code != 250 {
					t.Errorf("Send = %+v, %v", res, err)
				}
			}, data: 1},
		{name: "MAIL refused", script: []step{{Pipe: group2, Send: "550 5.7.1 not you\r\n503 5.5.1 MAIL first\r\n503 5.5.1 MAIL first\r\n503 5.5.1 MAIL first\r\n"}},
			check: func(t *testing.T, res TxResult, err error) {
				if err != nil || res.Mail.Code != 550 || len(res.Rcpts) != 0 || res.Data != nil {
					t.Errorf("Send = %+v, %v; want the MAIL refusal alone", res, err)
				}
			}},
		{name: "MAIL refused, DATA accepted anyway", script: []step{{Pipe: group2, Send: "550 no\r\n503 no\r\n503 no\r\n354 go\r\n"},
			{Expect: ".\r\n", Send: "554 5.5.1 no valid recipients\r\n"}},
			check: func(t *testing.T, res TxResult, err error) {
				if err != nil || res.Mail.Code != 550 || len(res.Rcpts) != 0 || res.Data != nil {
					t.Errorf("Send = %+v, %v", res, err)
				}
			}, lines: append(slices.Clone(group2), ".")},
		{name: "no recipient, DATA refused", script: []step{{Pipe: group2, Send: "250 ok\r\n550 no\r\n450 later\r\n554 5.5.1 no valid recipients\r\n"}},
			check: func(t *testing.T, res TxResult, err error) {
				if err != nil || !slices.Equal(codes(res.Rcpts), []int{550, 450}) || res.Data != nil {
					t.Errorf("Send = %+v, %v", res, err)
				}
			}},
		{name: "no recipient, DATA accepted: only the dot (RFC 2920 §3.1)",
			script: []step{{Pipe: group2, Send: "250 ok\r\n550 no\r\n550 no\r\n354 go\r\n"}, {Expect: ".\r\n", Send: "554 5.5.1 no valid recipients\r\n"}},
			check: func(t *testing.T, res TxResult, err error) {
				if err != nil || !slices.Equal(codes(res.Rcpts), []int{550, 550}) || res.Data != nil {
					t.Errorf("Send = %+v, %v", res, err)
				}
			}, lines: append(slices.Clone(group2), ".")},
		{name: "DATA refused", script: []step{{Pipe: group2, Send: "250 ok\r\n250 ok\r\n250 ok\r\n554 5.7.1 no thanks\r\n"}},
			check: func(t *testing.T, res TxResult, err error) {
				if err != nil || !slices.Equal(codes(res.Rcpts), []int{250, 250}) || res.Data == nil || res.Data.Code != 554 {
					t.Errorf("Send = %+v, %v", res, err)
				}
			}, lines: group2},
		{name: "temporary refusal after the dot", script: []step{{Pipe: group2, Send: "250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n"},
			{Data: true, Send: "451 4.3.0 try later\r\n"}},
			check: func(t *testing.T, res TxResult, err error) {
				if err != nil || res.Data == nil || res.Data.Code != 451 {
					t.Errorf("Send = %+v, %v", res, err)
				}
			}, data: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startPeer(t, append([]step{greet, ehloPipe}, tt.script...))
			c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSNone))
			if err != nil {
				t.Fatal(err)
			}
			res, err := c.Send(context.Background(), envelope2, []byte("hi\r\n"))
			tt.check(t, res, err)
			c.Close()
			p.Close()
			lines, data, _ := p.Received()
			if tt.lines != nil && !hasPrefixes(lines[1:], tt.lines) {
				t.Errorf("peer received %q, want %q", lines[1:], tt.lines)
			}
			if len(data) != tt.data {
				t.Errorf("peer received %d payloads, want %d", len(data), tt.data)
			}
		})
	}
}

// hasPrefixes reports whether lines has len(prefixes) elements, each
// starting with its prefix.
func hasPrefixes(lines, prefixes []string) bool {
	if len(lines) != len(prefixes) {
		return false
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, prefixes[i]) {
			return false
		}
	}
	return true
}

// TestPipeliningReset: a transaction that completed needs no RSET; one that
// did not gets RSET at the head of the next group. A refused RSET leaves
// the connection unusable, and no body is sent.
func TestPipeliningReset(t *testing.T) {
	ok := step{Pipe: group2, Send: "250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n"}
	refused := step{Pipe: group2, Send: "250 ok\r\n550 no\r\n550 no\r\n554 no valid recipients\r\n"}
	withReset := step{Pipe: append([]string{"RSET"}, group2...), Send: "250 flushed\r\n250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n"}
	p := startPeer(t, []step{greet, ehloPipe, ok, dataDone, refused, withReset, dataDone, quit},
		[]step{greet, ehloPipe, refused, {Pipe: append([]string{"RSET"}, group2...), Send: "500 5.5.2 what\r\n250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n"}})
	c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSNone))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{250, 0, 250} {
		res, err := c.Send(context.Background(), envelope2, []byte("hi\r\n"))
		if err != nil || (want == 0) != (res.Data == nil) || (res.Data != nil && res.Data.Code != want) {
			t.Fatalf("transaction %d: %+v, %v", i, res, err)
		}
	}
	if err := c.Quit(); err != nil {
		t.Fatal(err)
	}

	c, err = Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSNone))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(context.Background(), envelope2, []byte("hi\r\n")); err != nil {
		t.Fatal(err)
	}
	res, err := c.Send(context.Background(), envelope2, []byte("hi\r\n"))
	isCode(500)(t, stageErr(t, err, smtpvocab.StageMAIL))
	if res.Mail.Code != 0 || res.Data != nil {
		t.Errorf("refused RSET: %+v", res)
	}
	if _, err := c.Send(context.Background(), envelope2, nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("connection still usable after a refused RSET: %v", err)
	}
	p.Close()
	if _, data, _ := p.Received(); len(data) != 2 {
		t.Errorf("peer received %d payloads, want 2 (none after the refused RSET)", len(data))
	}
}

// TestPipeliningFailures: connection trouble anywhere in the group (421,
// a closed connection, silence, garbage, an endless reply) ends Send with
// an *Error at the stage of the reply that failed, the replies received
// before it in TxResult, and the connection closed.
func TestPipeliningFailures(t *testing.T) {
	tests := []struct {
		name  string
		steps []step // after the greeting and EHLO
		stage smtpvocab.Stage
		check func(*testing.T, error)
		res   func(TxResult) bool
	}{
		{"421 at MAIL", []step{{Pipe: group2, Send: "421 4.3.2 shutting down\r\n", Close: true}}, smtpvocab.StageMAIL, isCode(421),
			func(r TxResult) bool { return r.Mail.Code == 421 && len(r.Rcpts) == 0 }},
		{"421 at RCPT", []step{{Pipe: group2, Send: "250 ok\r\n421 4.4.2 bye\r\n", Close: true}}, smtpvocab.StageRCPT, isCode(421),
			func(r TxResult) bool { return r.Mail.Code == 250 && slices.Equal(codes(r.Rcpts), []int{421}) }},
		{"421 at DATA", []step{{Pipe: group2, Send: "250 ok\r\n250 ok\r\n250 ok\r\n421 4.3.0 bye\r\n", Close: true}}, smtpvocab.StageDATA, isCode(421),
			func(r TxResult) bool { return len(r.Rcpts) == 2 && r.Data != nil && r.Data.Code == 421 }},
		{"closed after MAIL", []step{{Pipe: group2, Send: "250 ok\r\n", Close: true}}, smtpvocab.StageRCPT,
			func(t *testing.T, err error) {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Errorf("err = %v, want EOF", err)
				}
			},
			func(r TxResult) bool { return r.Mail.Code == 250 && len(r.Rcpts) == 0 }},
		{"silence at the second RCPT", []step{{Pipe: group2, Send: "250 ok\r\n250 ok\r\n", Hang: true}}, smtpvocab.StageRCPT, isTimeout,
			func(r TxResult) bool { return slices.Equal(codes(r.Rcpts), []int{250}) }},
		{"garbage at DATA", []step{{Pipe: group2, Send: "250 ok\r\n250 ok\r\n250 ok\r\nwhat\r\n"}}, smtpvocab.StageDATA, isProtocol,
			func(r TxResult) bool { return len(r.Rcpts) == 2 && r.Data == nil }},
		{"250 to DATA", []step{{Pipe: group2, Send: "250 ok\r\n250 ok\r\n250 ok\r\n250 what\r\n"}}, smtpvocab.StageDATA, isProtocol,
			func(r TxResult) bool { return len(r.Rcpts) == 2 && r.Data == nil }},
		{"endless reply at MAIL", []step{{Pipe: group2, Flood: "250-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\r\n"}}, smtpvocab.StageMAIL, isProtocol,
			func(r TxResult) bool { return r.Mail.Code == 0 }},
		// MAIL's reply comes whole: only the dripped RCPT reply is to
		// outlast the command timeout (46 octets, 50 ms apart: over 2 s
		// against 1 s, and load only slows the drip further), and it does
		// only if the deadline holds for the whole reply, not per read.
		{"dripping reply at RCPT", []step{{Pipe: group2, Send: "250 ok\r\n"},
			{Drip: 50 * time.Millisecond, Send: "250 this reply takes far too long to arrive\r\n"}},
			smtpvocab.StageRCPT, isTimeout, func(r TxResult) bool { return r.Mail.Code == 250 && len(r.Rcpts) == 0 }},
		{"silence after the dot", []step{{Pipe: group2, Send: "250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n"}}, smtpvocab.StageEndOfData, isTimeout,
			func(r TxResult) bool { return len(r.Rcpts) == 2 && r.Data == nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			script := append([]step{greet, ehloPipe}, tt.steps...)
			if tt.stage == smtpvocab.StageEndOfData {
				script = append(script, step{Data: true, Hang: true})
			}
			p := startPeer(t, script)
			// opts' 1 s timeouts: the replies that come at once must
			// arrive within them on a loaded machine (300 ms did not,
			// EHLO's included), and only silence and the drip outlast them.
			c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSNone))
			if err != nil {
				t.Fatal(err)
			}
			res, err := c.Send(context.Background(), envelope2, []byte("hi\r\n"))
			tt.check(t, stageErr(t, err, tt.stage))
			if !tt.res(res) {
				t.Errorf("replies so far: %+v", res)
			}
			if _, err := c.Send(context.Background(), envelope2, nil); !errors.Is(err, net.ErrClosed) {
				t.Errorf("connection still usable after %v: %v", err, err)
			}
		})
	}
}

// TestPipeliningLargeEnvelope: an envelope larger than one group goes out
// in several groups to a real server (go-smtp, which advertises
// PIPELINING), and every recipient arrives.
func TestPipeliningLargeEnvelope(t *testing.T) {
	be, addr := startGoSMTP(t, func(s *smtp.Server) { s.MaxRecipients = 300 })
	var mu sync.Mutex
	var kinds []bool // true: a line sent, false: a reply
	o := opts(TLSNone)
	o.Trace = func(e Event) { mu.Lock(); kinds = append(kinds, e.Sent != ""); mu.Unlock() }
	c, err := Dial(context.Background(), nil, addr, "mx.test", o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	env := Envelope{From: "a@x.test"}
	for i := range 250 {
		env.Rcpts = append(env.Rcpts, Rcpt{Addr: fmt.Sprintf("recipient-%03d-%s@y.test", i, strings.Repeat("x", 30))})
	}
	mu.Lock()
	kinds = nil
	mu.Unlock()
	res, err := c.Send(context.Background(), env, []byte("hi\r\n"))
	if err != nil || len(res.Rcpts) != 250 || res.Data == nil || res.Data.Code != 250 {
		t.Fatalf("Send = %d rcpts, data %v, %v", len(res.Rcpts), res.Data, err)
	}
	msgs, _ := be.snapshot()
	if len(msgs) != 1 || len(msgs[0].Accepted) != 250 || string(msgs[0].Data) != "hi\r\n" {
		t.Fatalf("server saw %d transactions", len(msgs))
	}
	mu.Lock()
	defer mu.Unlock()
	groups := 0
	for i, sent := range kinds {
		if sent && (i == 0 || !kinds[i-1]) {
			groups++
		}
	}
	// 252 lines of about 60 octets: at least 4 groups of 4 KiB, then the
	// body after the 354.
	if groups < 5 || groups > 10 {
		t.Errorf("%d groups of lines, want 5 to 10", groups)
	}
}

// TestStepwiseReset: without PIPELINING too, Send sends RSET only when the
// previous transaction did not complete (no recipient accepted, no 2xx
// after the dot). Mail leaves that to the caller's Reset, after which
// Send needs none.
func TestStepwiseReset(t *testing.T) {
	one := Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}}}
	refused := step{Expect: "RCPT TO:", Send: "550 5.1.1 unknown\r\n"}
	p := startPeer(t, []step{greet, ehloPlain,
		mailOK, rcptOK, dataGo, dataDone, // completed: no RSET next
		mailOK, refused, // incomplete: RSET next
		{Expect: "RSET", Send: "250 ok\r\n"}, mailOK, rcptOK, dataGo, {Data: true, Send: "452 4.3.1 full\r\n"}, // not 2xx: RSET next
		{Expect: "RSET", Send: "250 ok\r\n"}, mailOK, rcptOK, dataGo, dataDone,
		{Expect: "MAIL FROM:<probe@x.test>", Send: "250 ok\r\n"}, {Expect: "RSET", Send: "250 ok\r\n"}, // Mail, Reset
		mailOK, rcptOK, dataGo, dataDone, quit})
	c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSNone))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{250, 0, 452, 250} {
		res, err := c.Send(context.Background(), one, []byte("hi"))
		if err != nil || (want == 0) != (res.Data == nil) || (res.Data != nil && res.Data.Code != want) {
			t.Fatalf("transaction %d: %+v, %v", i, res, err)
		}
	}
	if r, err := c.Mail("probe@x.test"); err != nil || r.Code != 250 {
		t.Fatalf("Mail = %v, %v", r, err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Send(context.Background(), one, []byte("hi")); err != nil || res.Data == nil || res.Data.Code != 250 {
		t.Fatalf("after Reset: %+v, %v", res, err)
	}
	if err := c.Quit(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	lines, _, _ := p.Received()
	// The script fixes where each RSET goes; none may come in addition.
	if n := len(slices.DeleteFunc(lines, func(l string) bool { return l != "RSET" })); n != 3 {
		t.Errorf("peer received %d RSETs, want 3", n)
	}
}

// FuzzPipelinedReplies: whatever a pipelining peer answers to envelope2,
// Send neither panics nor hangs, fails only with an *Error, and returns a
// TxResult that holds together: recipients only after an accepted MAIL, a
// DATA result only when a recipient was accepted.
func FuzzPipelinedReplies(f *testing.F) {
	for _, s := range []string{
		"250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n250 done\r\n",
		"550 no\r\n503 no\r\n503 no\r\n354 go\r\n554 no\r\n",
		"250 ok\r\n550 no\r\n550 no\r\n354 go\r\n554 no\r\n",
		"250 ok\r\n421 bye\r\n",
		"250-a\r\n250 b\r\n250 ok\r\n250 ok\r\n354 go\r\n250 done\r\n",
		"250 ok\r\n250 ok\r\n250 ok\r\n250 ok\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, replies []byte) {
		cli, srv := net.Pipe()
		defer cli.Close()
		go func() {
			go func() { _, _ = io.Copy(io.Discard, srv) }()
			_, _ = srv.Write(replies)
			srv.Close()
		}()
		o := opts(TLSNone)
		c := &Client{raw: cli, conn: cli, br: bufio.NewReader(cli), opt: o, server: "mx.test",
			ext: map[string]string{"PIPELINING": ""}}
		res, err := c.Send(context.Background(), envelope2, []byte("hi\r\n"))
		if err != nil && !errors.As(err, new(*Error)) {
			t.Fatalf("err = %v (%T), want an *Error", err, err)
		}
		mailOK := res.Mail.Code/100 == 2
		if len(res.Rcpts) > 0 && !mailOK {
			t.Fatalf("recipient replies after MAIL %d: %+v", res.Mail.Code, res)
		}
		if len(res.Rcpts) > len(envelope2.Rcpts) {
			t.Fatalf("%d recipient replies for %d recipients", len(res.Rcpts), len(envelope2.Rcpts))
		}
		if res.Data != nil && !slices.ContainsFunc(res.Rcpts, func(r RcptResult) bool { return r.Reply.Code/100 == 2 }) {
			t.Fatalf("a DATA result without an accepted recipient: %+v", res)
		}
		if err == nil && (res.Mail.Code == 0 || (mailOK && len(res.Rcpts) != len(envelope2.Rcpts))) {
			t.Fatalf("no error, but replies are missing: %+v", res)
		}
	})
}

// TestReplyBuffered: a reply is read without a deadline only when it is
// whole in the buffer; anything that may need a read from the peer is not.
func TestReplyBuffered(t *testing.T) {
	tests := []struct {
		buffered string
		want     bool
	}{
		{"", false},
		{"250 2.1.0 OK\r\n", true},
		{"250 2.1.0 OK\r\n250 2.1.5 OK\r\n", true},
		{"250 2.1.0 O", false},
		{"250-first\r\n250-second\r\n", false},
		{"250-first\r\n250 last\r\n", true},
		{"250-first\r\n250 la", false},
		{"250\r\n", true},
		{"junk\n", true}, // whole, and the parser refuses it without reading
	}
	for _, tt := range tests {
		br := bufio.NewReader(strings.NewReader(tt.buffered))
		br.Peek(len(tt.buffered)) // as if it had arrived
		if got := replyBuffered(br); got != tt.want {
			t.Errorf("replyBuffered(%q) = %v, want %v", tt.buffered, got, tt.want)
		}
	}
}
