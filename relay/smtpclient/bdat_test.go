package smtpclient

import (
	"bufio"
	"bytes"
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
	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// envelope1 is a transaction for one recipient: its chunk may go out with
// the envelope.
var envelope1 = Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}}}

// group1 is envelope1's pipelined group with a chunk of n octets.
func group1(n int) []string {
	return []string{"MAIL FROM:<a@x.test>", "RCPT TO:<b@y.test>", fmt.Sprintf("BDAT %d LAST", n)}
}

// chunkOpts are opts with Chunking on and short timeouts.
func chunkOpts() Options {
	o := opts(TLSNone)
	o.Chunking = true
	o.CommandTimeout, o.DataTimeout = 300*time.Millisecond, 300*time.Millisecond
	return o
}

// countingDialer counts the writes on the connections it dials.
type countingDialer struct {
	mu     sync.Mutex
	writes int
}

func (d *countingDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, d: d}, nil
}

// reset sets the count to zero and returns what it was.
func (d *countingDialer) reset() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.writes
	d.writes = 0
	return n
}

type countingConn struct {
	net.Conn
	d *countingDialer
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.d.mu.Lock()
	c.d.writes++
	c.d.mu.Unlock()
	return c.Conn.Write(p)
}

// unstuffed is what a DATA receiver stores from payload: without the final
// dot and with each line's leading dot removed (RFC 5321 §4.5.2).
func unstuffed(payload []byte) string {
	lines := strings.SplitAfter(strings.TrimSuffix(string(payload), ".\r\n"), "\r\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, ".")
	}
	return strings.Join(lines, "")
}

// readChunk returns all of ch, as the peer would receive it.
func readChunk(t *testing.T, ch *chunk) ([]byte, []int) {
	t.Helper()
	var out []byte
	var sizes []int
	r := ch.reader()
	for {
		p, err := r.next()
		if err != nil {
			t.Fatal(err)
		}
		if p == nil {
			return out, sizes
		}
		out = append(out, p...)
		sizes = append(sizes, len(p))
	}
}

func TestNewChunk(t *testing.T) {
	tests := []struct {
		body, want string
		canonical  bool
	}{
		{"", "", true},
		{"a", "a\r\n", false},
		{"a\r\n", "a\r\n", true},
		{".\r\n..x\r\n", ".\r\n..x\r\n", true}, // no dot-stuffing
		{"a\n", "a\r\n", false},
		{"\n", "\r\n", false},
		{"a\r", "a \r\n", false},
		{"a\rb\r\n", "a b\r\n", false},
		{"a\r\r\nb", "a \r\nb\r\n", false},
		{"x\r\n.\r\nMAIL FROM:<a@b>\r\n", "x\r\n.\r\nMAIL FROM:<a@b>\r\n", true}, // the size, not a dot, ends it
	}
	for _, tt := range tests {
		ch := newFoldedChunk([]byte(tt.body), 0)
		got, _ := readChunk(t, ch)
		if string(got) != tt.want || ch.size != int64(len(tt.want)) || ch.canonical != tt.canonical {
			t.Errorf("chunk(%q) = %q, size %d, canonical %v; want %q, %d, %v",
				tt.body, got, ch.size, ch.canonical, tt.want, len(tt.want), tt.canonical)
		}
	}
}

// TestChunkPieces: a large body goes out in pieces of dataPiece octets,
// the same octets whether it is sent from its own memory or encoded.
func TestChunkPieces(t *testing.T) {
	line := strings.Repeat("x", 70)
	for _, sep := range []string{"\r\n", "\n"} {
		body := []byte(strings.Repeat(line+sep, 3*dataPiece/len(line)))
		ch := newFoldedChunk(body, 0)
		got, sizes := readChunk(t, ch)
		want := strings.ReplaceAll(string(body), "\r\n", "\n")
		want = strings.ReplaceAll(want, "\n", "\r\n")
		if string(got) != want || ch.size != int64(len(want)) || ch.canonical != (sep == "\r\n") {
			t.Fatalf("sep %q: %d octets (size %d), want %d", sep, len(got), ch.size, len(want))
		}
		if len(sizes) < 3 || slices.Max(sizes) > dataPiece+2 {
			t.Errorf("sep %q: pieces %v", sep, sizes)
		}
	}
}

// FuzzChunk: the chunk is exactly what a DATA receiver stores from the
// DATA payload of the same body, its size is announced right, and a body
// is sent as is exactly when it already is in that form.
func FuzzChunk(f *testing.F) {
	for _, s := range []string{"", "a", ".\r\n", "\r\n.\r\n", "x\r.\n\r\n.\r\r\n", "\n\n.", "\r", "..x\r\n..\r\n.", "a\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ch := newFoldedChunk(body, 0)
		got, _ := readChunk(t, ch)
		if want := unstuffed(referenceEncode(body)); string(got) != want {
			t.Fatalf("chunk(%q) = %q, DATA delivers %q", body, got, want)
		}
		if ch.size != int64(len(got)) {
			t.Fatalf("chunk(%q): size %d announced, %d sent", body, ch.size, len(got))
		}
		if ch.canonical != bytes.Equal(got, body) {
			t.Fatalf("chunk(%q): canonical = %v, but the chunk is %q", body, ch.canonical, got)
		}
	})
}

// TestChunking: with CHUNKING (and the option on) the body goes as one
// BDAT LAST chunk of its exact canonical size; with PIPELINING and one
// recipient the whole transaction is one write. Without CHUNKING or with
// the option off, DATA. The reply to BDAT is the final reply: refusals
// come back in TxResult, and a connection lost after the chunk is an
// error at StageEndOfData, as after the final dot.
func TestChunking(t *testing.T) {
	cl, err := classifier.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat(strings.Repeat("y", 98)+"\r\n", 1024) // 100 KiB: too large to go with the envelope
	final := func(code int, outcome classifier.Outcome) func(*testing.T, TxResult, error) {
		return func(t *testing.T, res TxResult, err error) {
			if err != nil || res.Data == nil || res.Data.Code != code {
				t.Fatalf("Send = %+v, %v; want a final %d", res, err, code)
			}
			if v := cl.Classify(smtpvocab.StageEndOfData, res.Data); v.Outcome != outcome {
				t.Errorf("%d classified %v, want %v", code, v.Outcome, outcome)
			}
		}
	}
	inlineLost := func(check func(*testing.T, error)) func(*testing.T, TxResult, error) {
		return func(t *testing.T, res TxResult, err error) {
			t.Helper()
			var se *Error
			if !errors.As(err, &se) || se.Stage != smtpvocab.StageEndOfData || res.Data != nil || !res.Inline {
				t.Fatalf("Send = %+v, %v; want an error at %s with Inline set", res, err, smtpvocab.StageEndOfData)
			}
			check(t, err)
		}
	}
	lost := func(stage smtpvocab.Stage, check func(*testing.T, error)) func(*testing.T, TxResult, error) {
		return func(t *testing.T, res TxResult, err error) {
			check(t, stageErr(t, err, stage))
			if res.Mail.Code != 250 || !slices.Equal(codes(res.Rcpts), []int{250}) || (res.Data != nil && res.Data.Code != 421) {
				t.Errorf("replies so far: %+v", res)
			}
		}
	}
	noDelivery := func(mail int, rcpts ...int) func(*testing.T, TxResult, error) {
		return func(t *testing.T, res TxResult, err error) {
			if err != nil || res.Mail.Code != mail || !slices.Equal(codes(res.Rcpts), rcpts) || res.Data != nil {
				t.Errorf("Send = %+v, %v; want MAIL %d, RCPT %v, no final reply", res, err, mail, rcpts)
			}
		}
	}
	tests := []struct {
		name     string
		ehlo     step
		off      bool // Options.Chunking false
		env      Envelope
		body     string
		script   []step // after greet and ehlo
		check    func(*testing.T, TxResult, error)
		data     []string // payloads the peer received, exactly
		writes   int      // writes during Send (0: not checked)
		noBDAT   bool     // the peer must not have seen a BDAT line
		closedOK bool     // the connection is closed afterwards
	}{
		{name: "one write", body: "hi\r\n", script: []step{{Pipe: group1(4), Send: "250 ok\r\n250 ok\r\n250 2.0.0 queued\r\n"}},
			check: final(250, classifier.Deferred), data: []string{"hi\r\n"}, writes: 1},
		{name: "dots are not stuffed", body: ".\r\n..x\r\n.\r\n", script: []step{{Pipe: group1(11), Send: "250 ok\r\n250 ok\r\n250 ok\r\n"}},
			check: final(250, classifier.Deferred), data: []string{".\r\n..x\r\n.\r\n"}, writes: 1},
		{name: "stray line ends made canonical", body: "a\nb\rc", script: []step{{Pipe: group1(8), Send: "250 ok\r\n250 ok\r\n250 ok\r\n"}},
			check: final(250, classifier.Deferred), data: []string{"a\r\nb c\r\n"}, writes: 1},
		{name: "empty body", body: "", script: []step{{Pipe: group1(0), Send: "250 ok\r\n250 ok\r\n250 ok\r\n"}},
			check: final(250, classifier.Deferred), data: []string{""}, writes: 1},
		{name: "CHUNKING not advertised: DATA", ehlo: ehloPipe, body: "hi\r\n",
			script: []step{{Pipe: []string{"MAIL", "RCPT", "DATA"}, Send: "250 ok\r\n250 ok\r\n354 go\r\n"}, dataDone},
			check:  final(250, classifier.Deferred), data: []string{"hi\r\n.\r\n"}, noBDAT: true},
		{name: "option off: DATA", off: true, body: ".x\r\n",
			script: []step{{Pipe: []string{"MAIL", "RCPT", "DATA"}, Send: "250 ok\r\n250 ok\r\n354 go\r\n"}, dataDone},
			check:  final(250, classifier.Deferred), data: []string{"..x\r\n.\r\n"}, noBDAT: true},
		{name: "without PIPELINING: BDAT and chunk in one write", ehlo: ehloChunk1, body: "hi\r\n",
			script: []step{mailOK, rcptOK, {Expect: "BDAT 4 LAST", Send: "250 ok\r\n"}},
			check:  final(250, classifier.Deferred), data: []string{"hi\r\n"}, writes: 3},
		{name: "without PIPELINING, recipient refused: no BDAT", ehlo: ehloChunk1, body: "hi\r\n",
			script: []step{mailOK, {Expect: "RCPT", Send: "550 5.1.1 unknown\r\n"}},
			check:  noDelivery(250, 550), noBDAT: true},
		{name: "recipient refused: chunk discarded", body: "hi\r\n",
			script: []step{{Pipe: group1(4), Send: "250 ok\r\n550 5.1.1 unknown\r\n502 5.5.1 Missing RCPT TO command.\r\n"}},
			check:  noDelivery(250, 550), data: []string{"hi\r\n"}, writes: 1},
		{name: "MAIL refused", body: "hi\r\n",
			script: []step{{Pipe: group1(4), Send: "550 5.7.1 not you\r\n503 5.5.1 MAIL first\r\n502 5.5.1 no\r\n"}},
			check:  noDelivery(550)},
		{name: "451 to BDAT: deferred", body: "hi\r\n", script: []step{{Pipe: group1(4), Send: "250 ok\r\n250 ok\r\n451 4.3.0 try later\r\n"}},
			check: final(451, classifier.Deferred)},
		{name: "552 to BDAT: permanent", body: "hi\r\n", script: []step{{Pipe: group1(4), Send: "250 ok\r\n250 ok\r\n552 5.3.4 too big\r\n"}},
			check: final(552, classifier.Failed)},
		{name: "421 to BDAT", body: "hi\r\n", script: []step{{Pipe: group1(4), Send: "250 ok\r\n250 ok\r\n421 4.3.0 bye\r\n", Close: true}},
			check: lost(smtpvocab.StageEndOfData, isCode(421)), closedOK: true},
		{name: "dropped after the chunk", body: "hi\r\n", script: []step{{Pipe: group1(4), Send: "250 ok\r\n250 ok\r\n", Close: true}},
			check: lost(smtpvocab.StageEndOfData, isEOF), closedOK: true},
		{name: "silence after the chunk", body: "hi\r\n", script: []step{{Pipe: group1(4), Send: "250 ok\r\n250 ok\r\n", Hang: true}},
			check: lost(smtpvocab.StageEndOfData, isTimeout), closedOK: true},
		// The whole message went with the envelope: a reply lost before
		// the RCPT's is as ambiguous as a lost reply to the final dot.
		{name: "dropped before any reply, chunk sent", body: "hi\r\n", script: []step{{Pipe: group1(4), Close: true}},
			check: inlineLost(isEOF), closedOK: true},
		{name: "silence before the RCPT reply, chunk sent", body: "hi\r\n", script: []step{{Pipe: group1(4), Send: "250 ok\r\n", Hang: true}},
			check: inlineLost(isTimeout), closedOK: true},
		{name: "421 to RCPT: the peer closes, nothing is ambiguous", body: "hi\r\n",
			script: []step{{Pipe: group1(4), Send: "250 ok\r\n421 4.3.2 bye\r\n", Close: true}},
			check: func(t *testing.T, res TxResult, err error) {
				var se *Error
				if !errors.As(err, &se) || se.Stage != smtpvocab.StageRCPT || res.Data != nil {
					t.Errorf("Send = %+v, %v; want a 421 at RCPT", res, err)
				}
			}, closedOK: true},
		{name: "without PIPELINING, dropped after the chunk", ehlo: ehloChunk1, body: "hi\r\n",
			script: []step{mailOK, rcptOK, {Expect: "BDAT 4 LAST", Close: true}},
			check:  lost(smtpvocab.StageEndOfData, isEOF), closedOK: true},
		{name: "354 to BDAT", body: "hi\r\n", script: []step{{Pipe: group1(4), Send: "250 ok\r\n250 ok\r\n354 what\r\n"}},
			check: lost(smtpvocab.StageEndOfData, isProtocol), closedOK: true},
		{name: "two recipients: the chunk waits for an accepted RCPT", env: envelope2, body: "hi\r\n",
			script: []step{{Pipe: group2[:3], Send: "250 ok\r\n250 ok\r\n450 4.2.0 later\r\n"}, {Expect: "BDAT 4 LAST", Send: "250 ok\r\n"}},
			check: func(t *testing.T, res TxResult, err error) {
				if err != nil || !slices.Equal(codes(res.Rcpts), []int{250, 450}) || res.Data == nil || res.Data.Code != 250 {
					t.Errorf("Send = %+v, %v", res, err)
				}
			}, data: []string{"hi\r\n"}, writes: 2},
		{name: "two recipients refused: no BDAT", env: envelope2, body: "hi\r\n",
			script: []step{{Pipe: group2[:3], Send: "250 ok\r\n550 no\r\n450 later\r\n"}},
			check:  noDelivery(250, 550, 450), noBDAT: true, writes: 1},
		{name: "large body: the chunk waits for an accepted RCPT", body: big,
			script: []step{{Pipe: group1(0)[:2], Send: "250 ok\r\n250 ok\r\n"}, {Expect: fmt.Sprintf("BDAT %d LAST", len(big)), Send: "250 ok\r\n"}},
			check:  final(250, classifier.Deferred), data: []string{big}, writes: 3},
		{name: "large body with bare LFs", body: strings.ReplaceAll(big, "\r\n", "\n"),
			script: []step{{Pipe: group1(0)[:2], Send: "250 ok\r\n250 ok\r\n"}, {Expect: fmt.Sprintf("BDAT %d LAST", len(big)), Send: "250 ok\r\n"}},
			check:  final(250, classifier.Deferred), data: []string{big}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ehlo, env := tt.ehlo, tt.env
			if ehlo.Expect == "" {
				ehlo = ehloChunk
			}
			if env.From == "" {
				env = envelope1
			}
			p := startPeer(t, append([]step{greet, ehlo}, tt.script...))
			o := chunkOpts()
			o.Chunking = !tt.off
			d := &countingDialer{}
			c, err := Dial(context.Background(), d, p.Addr(), "mx.test", o)
			if err != nil {
				t.Fatal(err)
			}
			d.reset()
			res, err := c.Send(context.Background(), env, []byte(tt.body))
			writes := d.reset()
			tt.check(t, res, err)
			if tt.writes != 0 && writes != tt.writes {
				t.Errorf("%d writes, want %d", writes, tt.writes)
			}
			if _, err := c.Send(context.Background(), env, nil); tt.closedOK != errors.Is(err, net.ErrClosed) {
				t.Errorf("connection closed: %v, want %v", errors.Is(err, net.ErrClosed), tt.closedOK)
			}
			c.Close()
			p.Close()
			lines, data, _ := p.Received()
			if tt.data != nil && !slices.Equal(strs(data), tt.data) {
				t.Errorf("peer received payloads %.80q, want %.80q", strs(data), tt.data)
			}
			if tt.noBDAT && slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "BDAT") }) {
				t.Errorf("peer received BDAT: %q", lines)
			}
		})
	}
}

func isEOF(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("err = %v, want EOF", err)
	}
}

func strs(bs [][]byte) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return out
}

// TestChunkingReuse: after a transaction whose recipients were all
// refused (the pipelined chunk discarded by the peer), the connection
// carries the next one, which starts with RSET; a chunk then waits for
// the envelope's replies, since a refused RSET could leave the old
// transaction open. After a delivered one, neither RSET nor waiting.
func TestChunkingReuse(t *testing.T) {
	p := startPeer(t, []step{greet, ehloChunk,
		{Pipe: group1(4), Send: "250 ok\r\n450 4.2.0 greylisted\r\n502 5.5.1 Missing RCPT TO command.\r\n"},
		{Pipe: []string{"RSET", "MAIL", "RCPT"}, Send: "250 flushed\r\n250 ok\r\n250 ok\r\n"},
		{Expect: "BDAT 4 LAST", Send: "250 2.0.0 queued\r\n"},
		{Pipe: group1(4), Send: "250 ok\r\n250 ok\r\n250 2.0.0 queued\r\n"},
		quit})
	c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", chunkOpts())
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{0, 250, 250} {
		res, err := c.Send(context.Background(), envelope1, []byte("hi\r\n"))
		if err != nil || (want == 0) != (res.Data == nil) || (res.Data != nil && res.Data.Code != want) {
			t.Fatalf("transaction %d: %+v, %v", i, res, err)
		}
	}
	if err := c.Quit(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, data, _ := p.Received(); len(data) != 3 {
		t.Errorf("peer received %d chunks, want 3", len(data))
	}
}

// TestChunkingGoSMTP: against a real go-smtp server (which offers
// PIPELINING and CHUNKING) the body arrives byte for byte through BDAT,
// dot lines untouched; a chunk for a refused recipient is discarded, not
// run as commands (go-smtp before v0.25.1 ran it), and the connection goes on; a large body
// for two recipients and a too-large one (552) behave.
func TestChunkingGoSMTP(t *testing.T) {
	be, addr := startGoSMTP(t, func(s *smtp.Server) { s.MaxMessageBytes = 256 << 10 })
	var mu sync.Mutex
	var sent []string
	o := opts(TLSNone)
	o.Chunking = true
	o.Trace = func(e Event) {
		if e.Sent != "" {
			mu.Lock()
			sent = append(sent, strings.Fields(e.Sent)[0])
			mu.Unlock()
		}
	}
	c, err := Dial(context.Background(), nil, addr, "mx.test", o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ok, _ := c.Extension("CHUNKING"); !ok {
		t.Fatal("go-smtp did not advertise CHUNKING")
	}
	large := strings.Repeat(".dot line\r\n", 200<<10/11)
	two := Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "ok3@y.test"}, {Addr: "ok4@y.test"}}}
	for i, tx := range []struct {
		env          Envelope
		body, stored string
		code         int // final reply; 0: none
	}{
		{to1("ok1"), "Subject: dots\r\n\r\n.\r\n..\r\n.leading\r\n.\r\nMAIL FROM:<x@y>\r\n", "Subject: dots\r\n\r\n.\r\n..\r\n.leading\r\n.\r\nMAIL FROM:<x@y>\r\n", 250},
		{to1("perm"), "QUIT\r\nMAIL FROM:<smuggled@x>\r\n", "", 0},
		{to1("ok2"), "x\ny\r.", "x\r\ny .\r\n", 250},
		{two, large, large, 250},
		{to1("ok5"), large + large, "", 552},
		{to1("ok6"), "last\r\n", "last\r\n", 250},
	} {
		res, err := c.Send(context.Background(), tx.env, []byte(tx.body))
		got := 0
		if res.Data != nil {
			got = res.Data.Code
		}
		if err != nil || got != tx.code {
			t.Fatalf("transaction %d: %+v, %v; want final %d", i, res, err, tx.code)
		}
		msgs, _ := be.snapshot()
		if len(msgs) != i+1 || string(msgs[i].Data) != tx.stored || (tx.stored == "") != (msgs[i].DataCalls == 0) {
			t.Fatalf("transaction %d: server saw %d transactions, the last storing %.60q; want %.60q", i, len(msgs), msgs[len(msgs)-1].Data, tx.stored)
		}
	}
	if msgs, _ := be.snapshot(); !slices.Equal(msgs[3].Accepted, []string{"ok3@y.test", "ok4@y.test"}) {
		t.Errorf("two recipients: server saw %v", msgs[3].Accepted)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(sent, "DATA") || !slices.Contains(sent, "BDAT") {
		t.Errorf("sent %v, want BDAT and no DATA", sent)
	}
}

// to1 is a one-recipient envelope to local@y.test.
func to1(local string) Envelope {
	return Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: local + "@y.test"}}}
}

// FuzzChunkedReplies is FuzzPipelinedReplies with CHUNKING: whatever the
// peer answers, Send neither panics nor hangs, fails only with an *Error,
// and a final reply only comes with an accepted recipient.
func FuzzChunkedReplies(f *testing.F) {
	for _, s := range []string{
		"250 ok\r\n250 ok\r\n250 done\r\n",
		"550 no\r\n503 no\r\n502 no\r\n",
		"250 ok\r\n550 no\r\n502 no\r\n",
		"250 ok\r\n421 bye\r\n",
		"250 ok\r\n250 ok\r\n354 what\r\n",
		"250 ok\r\n250 ok\r\n250 ok\r\n250 done\r\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, replies []byte, two bool) {
		env := envelope1
		if two {
			env = envelope2
		}
		cli, srv := net.Pipe()
		defer cli.Close()
		go func() {
			go func() { _, _ = io.Copy(io.Discard, srv) }()
			_, _ = srv.Write(replies)
			srv.Close()
		}()
		o := chunkOpts()
		c := &Client{raw: cli, conn: cli, br: bufio.NewReader(cli), opt: o, server: "mx.test",
			ext: map[string]string{"PIPELINING": "", "CHUNKING": ""}}
		res, err := c.Send(context.Background(), env, []byte("hi\r\n"))
		if err != nil && !errors.As(err, new(*Error)) {
			t.Fatalf("err = %v (%T), want an *Error", err, err)
		}
		if (len(res.Rcpts) > 0 && res.Mail.Code/100 != 2) || len(res.Rcpts) > len(env.Rcpts) {
			t.Fatalf("recipient replies after MAIL %d: %+v", res.Mail.Code, res)
		}
		if res.Data != nil && !slices.ContainsFunc(res.Rcpts, func(r RcptResult) bool { return r.Reply.Code/100 == 2 }) {
			t.Fatalf("a final reply without an accepted recipient: %+v", res)
		}
	})
}

// abort resets the connection: a peer in the middle of reading a chunk
// gets an error, not an end of stream it could take for the chunk's end.
func TestAbortResets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer s.Close()
		_, err = io.ReadAll(s) // nil on a FIN, ECONNRESET on a reset
		got <- err
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{conn: conn}
	if _, err := conn.Write([]byte("BDAT 1000 LAST\r\npart of it")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	c.abort()
	if err := <-got; err == nil {
		t.Fatal("the peer saw a clean end of stream; want a reset")
	}
}
