package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// loadSpec is one load-generator run: N messages of Size bytes over
// Sessions concurrent SMTP sessions.
type loadSpec struct {
	Addr       string // the system under test's SMTP listener
	Messages   int
	Size       int      // total message size in bytes, headers included
	Sessions   int      // concurrent connections
	Reuse      bool     // many messages per connection (MAIL after the previous 250) or a new connection per message
	Pipelining bool     // send MAIL, RCPT and DATA in one write when the server offers PIPELINING (RFC 2920), as Postfix's client does
	Rate       float64  // messages per second in all; 0 means as fast as the server answers
	FirstID    int      // X-Bench-Id of the first message
	Rcpts      []string // recipients per message; default one at dest.test
	Timeout    time.Duration
	// Tool is the load generator: "" or "go" for this harness's client,
	// "postfix" for Postfix's smtp-source (postfixtools.go).
	Tool string
	// ToolGroup is the cgroup smtp-source runs in, so that its CPU time
	// is counted (nil: not counted).
	ToolGroup *cgroup
}

// toolName names the load generator (and sink) of a phase.
func (s *loadSpec) toolName() string {
	if s.Tool == "" {
		return toolsGo
	}
	return s.Tool
}

// loadResult is what the load generator saw.
type loadResult struct {
	Start    time.Time
	LastAck  time.Time // the last 250 to a final dot
	Accepted int
	Failed   int
	Codes    map[string]int  // replies other than 250 (and transport errors), by first line
	Latency  []time.Duration // final dot → 250, per accepted message
	AckAt    []int64         // Unix nanoseconds of each message's 250, indexed by id-FirstID; 0 = not accepted
}

// message is the fixed part of every message of one size: the headers
// are padded so that every message has the same length and the same body.
type message struct {
	size int
	body []byte // everything after the blank line, CRLF lines, never a line starting with '.'
}

// header renders message id's header section (with its blank line).
func (m *message) header(id int, rcpt string) []byte {
	return fmt.Appendf(nil, "From: <bench@load.bench.test>\r\nTo: <%s>\r\nSubject: bench message %010d\r\n"+
		"Message-ID: <%010d@load.bench.test>\r\n%s%010d\r\nMIME-Version: 1.0\r\nContent-Type: text/plain\r\n\r\n",
		rcpt, id, id, benchIDHeader, id)
}

// newMessage builds a body so that header plus body is size bytes (the
// body is at least one line).
func newMessage(size int) *message {
	m := &message{size: size}
	n := max(size-len(m.header(0, "rcpt@dest.test")), 2)
	const line = "The quick brown fox jumps over the lazy dog; greyrelay benchmark filler text 0123"
	body := make([]byte, 0, n)
	for len(body) < n {
		room := n - len(body)
		l := min(len(line), room-2)
		if room-(l+2) == 1 {
			l-- // never leave a single byte: a line needs two
		}
		body = append(body, line[:l]...)
		body = append(body, '\r', '\n')
	}
	m.body = body
	return m
}

// runLoad drives the server. It returns when every message has been tried
// (a failed message is not retried) or ctx ends.
func runLoad(ctx context.Context, spec loadSpec) loadResult {
	if spec.Timeout == 0 {
		spec.Timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	if len(spec.Rcpts) == 0 {
		spec.Rcpts = []string{"rcpt@dest.test"}
	}
	if spec.Tool == toolsPostfix {
		return runSource(ctx, spec)
	}
	msg := newMessage(spec.Size)
	res := loadResult{Codes: map[string]int{}, AckAt: make([]int64, spec.Messages)}
	lat := make([]time.Duration, spec.Messages)
	var next atomic.Int64
	var mu, firstDial sync.Mutex
	var wg sync.WaitGroup
	res.Start = time.Now()
	for range spec.Sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := &generator{spec: &spec, msg: msg, start: res.Start, firstDial: &firstDial}
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= spec.Messages {
					break
				}
				g.pace(ctx, i)
				d, ackAt, err := g.send(ctx, spec.FirstID+i)
				mu.Lock()
				if err != nil {
					res.Failed++
					res.Codes[errKey(err)]++
				} else {
					res.Accepted++
					lat[i] = d
					res.AckAt[i] = ackAt.UnixNano()
					if ackAt.After(res.LastAck) {
						res.LastAck = ackAt
					}
				}
				mu.Unlock()
			}
			g.close()
		}()
	}
	wg.Wait()
	for i, d := range lat {
		if res.AckAt[i] != 0 {
			res.Latency = append(res.Latency, d)
		}
	}
	return res
}

// errKey shortens an error for the per-reply count.
func errKey(err error) string {
	s := err.Error()
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}

// generator is one session's client: a raw SMTP dialogue, so that nothing
// but the wire sits between the measurement and the server.
type generator struct {
	spec  *loadSpec
	msg   *message
	start time.Time

	conn     net.Conn
	r        *bufio.Reader
	w        *bufio.Writer
	pipeline bool
	sent     int
	// firstDial is held while a session makes its first connection,
	// so that the sessions connect one after another (each a
	// millisecond or so) rather than all in the same instant: a burst
	// of 20 overflows OpenSMTPD's listen backlog of 5, and a connection
	// the kernel dropped waits a second or more for a SYN-ACK
	// retransmission.
	firstDial *sync.Mutex
	dialed    bool
}

// pace waits until message i's slot when a rate is set.
func (g *generator) pace(ctx context.Context, i int) {
	if g.spec.Rate <= 0 {
		return
	}
	at := g.start.Add(time.Duration(float64(i) / g.spec.Rate * float64(time.Second)))
	if d := time.Until(at); d > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}

// replyError is a non-success SMTP reply.
type replyError struct {
	stage string
	code  int
	line  string
}

func (e *replyError) Error() string { return fmt.Sprintf("%s: %d %s", e.stage, e.code, e.line) }

// send delivers message id: it returns the time from the final dot to the
// 250 and the moment the 250 arrived.
func (g *generator) send(ctx context.Context, id int) (time.Duration, time.Time, error) {
	if g.conn != nil && !g.spec.Reuse {
		g.close()
	}
	if g.conn == nil {
		if !g.dialed && g.firstDial != nil {
			g.firstDial.Lock()
			err := g.connect(ctx)
			g.firstDial.Unlock()
			g.dialed = true
			if err != nil {
				return 0, time.Time{}, err
			}
		} else if err := g.connect(ctx); err != nil {
			return 0, time.Time{}, err
		}
	}
	d, at, err := g.transaction(id)
	if err != nil {
		var re *replyError
		if !errors.As(err, &re) || re.code == 421 {
			g.close() // a transport error or 421: the session is over
		} else {
			_, _ = g.w.WriteString("RSET\r\n")
			if g.w.Flush() != nil || g.readReply("RSET") != nil {
				g.close()
			}
		}
	}
	return d, at, err
}

// connect opens the session. A connection reset before the greeting is
// tried again (up to 10 times, 20 ms apart), as any MTA would retry it:
// OpenSMTPD listens with a backlog of 5, and when the load's 20 sessions
// connect at once the kernel resets those beyond it.
func (g *generator) connect(ctx context.Context) error {
	var err error
	for range 10 {
		if err = g.dial(ctx); err == nil {
			return nil
		}
		g.close()
		if !errors.Is(err, syscall.ECONNRESET) || ctx.Err() != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

func (g *generator) dial(ctx context.Context) error {
	dl := net.Dialer{Timeout: 10 * time.Second}
	c, err := dl.DialContext(ctx, "tcp", g.spec.Addr)
	if err != nil {
		return err
	}
	g.conn = c
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	g.r, g.w = bufio.NewReaderSize(c, 16<<10), bufio.NewWriterSize(c, 64<<10)
	if err := g.readReply("greeting"); err != nil {
		return err
	}
	_, _ = g.w.WriteString("EHLO load.bench.test\r\n")
	if err := g.w.Flush(); err != nil {
		return err
	}
	lines, err := g.readLines("EHLO")
	if err != nil {
		return err
	}
	g.pipeline = false
	for _, l := range lines {
		if strings.EqualFold(strings.TrimSpace(l), "PIPELINING") {
			g.pipeline = g.spec.Pipelining
		}
	}
	return nil
}

// transaction runs MAIL, RCPT..., DATA and the message.
func (g *generator) transaction(id int) (time.Duration, time.Time, error) {
	_ = g.conn.SetDeadline(time.Now().Add(2 * time.Minute))
	cmds := []string{fmt.Sprintf("MAIL FROM:<bench@load.bench.test> SIZE=%d", g.msg.size)}
	for _, r := range g.spec.Rcpts {
		cmds = append(cmds, "RCPT TO:<"+r+">")
	}
	cmds = append(cmds, "DATA")
	if err := g.commands(cmds); err != nil {
		return 0, time.Time{}, err
	}
	// The body and the final dot leave in one write, as from Postfix's
	// client and most libraries (a dot in a packet of its own costs the
	// server a read and a wakeup more per message). The clock starts
	// just before that write: loopback carries 4 KiB in microseconds.
	_, _ = g.w.Write(g.msg.header(id, g.spec.Rcpts[0]))
	_, _ = g.w.Write(g.msg.body)
	_, _ = g.w.WriteString(".\r\n")
	t0 := time.Now()
	if err := g.w.Flush(); err != nil {
		return 0, time.Time{}, err
	}
	if err := g.readReply("final dot"); err != nil {
		return 0, time.Time{}, err
	}
	at := time.Now()
	g.sent++
	return at.Sub(t0), at, nil
}

// commands sends the envelope, pipelined when allowed, and reads every
// reply; the last one (DATA) must be 354. A refused recipient fails the
// message: the benchmark sends only to recipients that should be accepted.
func (g *generator) commands(cmds []string) error {
	if g.pipeline {
		for _, c := range cmds {
			_, _ = g.w.WriteString(c + "\r\n")
		}
		if err := g.w.Flush(); err != nil {
			return err
		}
		var first error
		for _, c := range cmds {
			if err := g.readReply(verb(c)); err != nil && first == nil {
				first = err
			} else if err == nil && first != nil && c == "DATA" {
				// Some recipient failed but DATA was accepted: end the
				// empty message so that the session stays in step.
				_, _ = g.w.WriteString(".\r\n")
				if err := g.w.Flush(); err != nil {
					return err
				}
				_ = g.readReply("final dot")
			}
		}
		return first
	}
	for _, c := range cmds {
		_, _ = g.w.WriteString(c + "\r\n")
		if err := g.w.Flush(); err != nil {
			return err
		}
		if err := g.readReply(verb(c)); err != nil {
			return err
		}
	}
	return nil
}

func verb(cmd string) string {
	if i := strings.IndexAny(cmd, " :"); i > 0 {
		return cmd[:i]
	}
	return cmd
}

// readReply reads one (possibly multi-line) reply and checks its code
// against what the stage expects.
func (g *generator) readReply(stage string) error {
	_, err := g.readLines(stage)
	return err
}

func (g *generator) readLines(stage string) ([]string, error) {
	r, lines, err := smtpvocab.Read(g.r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", stage, err)
	}
	if !expected(stage, r.Code) {
		return nil, &replyError{stage: stage, code: r.Code, line: lines[len(lines)-1]}
	}
	return lines, nil
}

func expected(stage string, code int) bool {
	switch stage {
	case "greeting":
		return code == 220
	case "DATA":
		return code == 354
	case "QUIT":
		return code == 221
	}
	return code >= 200 && code < 300
}

func (g *generator) close() {
	if g.conn == nil {
		return
	}
	_ = g.conn.SetDeadline(time.Now().Add(2 * time.Second))
	_, _ = g.w.WriteString("QUIT\r\n")
	if g.w.Flush() == nil {
		_, _ = g.readLines("QUIT")
	}
	_ = g.conn.Close()
	g.conn = nil
}

// percentile returns the p-th percentile (0..100) of sorted durations,
// nearest rank.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

func sortDurations(d []time.Duration) []time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}
