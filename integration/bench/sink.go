package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emersion/go-smtp"
)

// benchIDHeader carries the load generator's message number, so that the
// sink can tell a duplicate from a new message and time each delivery.
const benchIDHeader = "X-Bench-Id: "

// sink is the destination MTA of every benchmark: a go-smtp server that
// keeps no message, only counts, hashes and timestamps what it receives.
// Unlike integration/peers.Sink it does not record transactions or watch
// the wire, so that it costs the shared CPUs as little as possible.
//
// A message is "good" when its body (everything after the header section)
// hashes to the body the load generator sent: the relay may add headers
// (Received) but must not change a byte of the body.
type sink struct {
	Addr string
	srv  *smtp.Server
	ln   net.Listener

	deferAll bool // answer 451 to every MAIL: a destination that defers everything

	mu       sync.Mutex
	wantBody [32]byte
	arrived  []int64 // Unix nanoseconds of the first arrival of message i; 0 = not yet
	good     int64
	bad      int64 // body hash mismatch or no id
	dups     int64
	last     time.Time

	mails atomic.Int64 // MAIL commands seen (deferred ones too)

	// readers are Data's 64 KiB buffers, reused: a new one per message
	// (allocated and zeroed) was 7% of the harness's CPU at full rate.
	readers sync.Pool
}

// startSink listens on addr ("ip:0" for a free port).
func startSink(addr string, deferAll bool) (*sink, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &sink{Addr: ln.Addr().String(), ln: ln, deferAll: deferAll}
	s.srv = smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &sinkSession{s: s}, nil }))
	s.srv.Domain = "sink.bench.test"
	s.srv.ReadTimeout, s.srv.WriteTimeout = 5*time.Minute, time.Minute
	s.srv.MaxMessageBytes = 64 << 20
	s.srv.MaxRecipients = 1000
	s.srv.ErrorLog = log.New(io.Discard, "", 0)
	go func() { _ = s.srv.Serve(coalescingListener{ln}) }()
	return s, nil
}

// coalescingListener hands go-smtp connections whose replies wait until
// the server is about to read again, as RFC 2920 §3.2 asks of a pipelining
// server and as Postfix's smtpd does: the replies to a pipelined group
// (MAIL, RCPT…, DATA or BDAT) leave in one write instead of one each.
// go-smtp flushes every reply; left alone, the sink would cost every
// sender (greyrelay or Postfix) a wakeup and a read per reply, and the
// shared CPUs a write per reply.
type coalescingListener struct{ net.Listener }

func (l coalescingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &coalescingConn{Conn: c, in: bufio.NewReaderSize(c, 16<<10)}, nil
}

// coalescingConn buffers writes until the next Read or Close. go-smtp
// reads only when its own buffer holds no more input, so a reply waits at
// most until the commands already received have been answered. Reads go
// through a buffer larger than go-smtp's 4 KiB one, so that a message
// and its envelope take one read(2) rather than one per 4 KiB: the sink
// shares the CPUs with the system it measures.
type coalescingConn struct {
	net.Conn
	in  *bufio.Reader
	mu  sync.Mutex
	out []byte
}

func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out = append(c.out, p...)
	return len(p), nil
}

func (c *coalescingConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.out) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.out)
	c.out = c.out[:0]
	return err
}

func (c *coalescingConn) Read(p []byte) (int, error) {
	if err := c.flush(); err != nil {
		return 0, err
	}
	return c.in.Read(p)
}

func (c *coalescingConn) Close() error {
	_ = c.flush()
	return c.Conn.Close()
}

// expect resets the counters for a run of n messages with the given body.
func (s *sink) expect(n int, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wantBody = sha256.Sum256(body)
	s.arrived = make([]int64, n)
	s.good, s.bad, s.dups, s.last = 0, 0, 0, time.Time{}
}

// sinkCounts is a snapshot of the counters.
type sinkCounts struct {
	Good, Bad, Dups int64
	Last            time.Time
}

func (s *sink) counts() sinkCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sinkCounts{s.good, s.bad, s.dups, s.last}
}

// arrivals returns a copy of the per-message arrival times.
func (s *sink) arrivals() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.arrived...)
}

func (s *sink) close()       { _ = s.srv.Close() }
func (s *sink) addr() string { return s.Addr }

// destination is the next hop of a measured phase: this harness's sink
// or Postfix's smtp-sink (postfixtools.go).
type destination interface {
	addr() string
	// expect resets the counters for a run of n messages with the given
	// body.
	expect(n int, body []byte)
	counts() sinkCounts
	// arrivals are the arrival times by message number (Unix
	// nanoseconds, 0 = not yet), or nil when the sink cannot tell
	// messages apart.
	arrivals() []int64
	close()
}

func (s *sink) record(id int, ok bool) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !ok || id < 0 || id >= len(s.arrived):
		s.bad++
	case s.arrived[id] != 0:
		s.dups++
	default:
		s.arrived[id] = now.UnixNano()
		s.good++
		s.last = now
	}
}

type sinkSession struct {
	s     *sink
	rcpts int
}

var errDeferAll = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Temporary local problem, please try again later"}

func (ss *sinkSession) Mail(string, *smtp.MailOptions) error {
	ss.s.mails.Add(1)
	if ss.s.deferAll {
		return errDeferAll
	}
	return nil
}

func (ss *sinkSession) Rcpt(string, *smtp.RcptOptions) error { ss.rcpts++; return nil }

// Data reads the header section for the bench id, then hashes the body as
// it streams by: a 10 MB message never sits in memory.
func (ss *sinkSession) Data(r io.Reader) error {
	br, _ := ss.s.readers.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	br.Reset(r)
	defer func() {
		br.Reset(nil) // keep no reference to the finished message
		ss.s.readers.Put(br)
	}()
	id := -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			ss.s.record(-1, false)
			return nil
		}
		if rest, ok := bytes.CutPrefix(line, []byte(benchIDHeader)); ok {
			if n, err := strconv.Atoi(string(bytes.TrimSpace(rest))); err == nil {
				id = n
			}
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			break
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, br); err != nil {
		return err
	}
	var sum [32]byte
	h.Sum(sum[:0])
	ss.s.mu.Lock()
	ok := sum == ss.s.wantBody
	ss.s.mu.Unlock()
	// One message may carry several recipients (scale runs); count it once.
	ss.s.record(id, ok)
	return nil
}

func (ss *sinkSession) Reset()        { ss.rcpts = 0 }
func (ss *sinkSession) Logout() error { return nil }

// blackhole accepts TCP connections and never says a word: a destination
// whose SMTP server hangs after the handshake. Each held connection ties
// up one of the relay's delivery workers until its greeting timeout.
type blackhole struct {
	Addr  string
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	seen  atomic.Int64
}

func startBlackhole(addr string) (*blackhole, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b := &blackhole{Addr: ln.Addr().String(), ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.seen.Add(1)
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
		}
	}()
	return b, nil
}

func (b *blackhole) close() {
	_ = b.ln.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_ = c.Close()
	}
}
