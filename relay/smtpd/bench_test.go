package smtpd

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/greyrelay/greyrelay/queue"
)

// discardQueue accepts every message and keeps nothing, so that a
// benchmark measures the SMTP intake alone.
type discardQueue struct{ n atomic.Uint64 }

func (q *discardQueue) Enqueue(queue.NewMessage) (queue.ID, error) {
	return queue.ID(q.n.Add(1)), nil
}

// benchBody is a 4 KiB message of 76-octet lines, as the relay benchmark
// sends (integration/bench).
func benchBody() []byte {
	var b strings.Builder
	b.WriteString("From: a@x.example\r\nTo: b@y.example\r\nSubject: bench\r\n\r\n")
	for b.Len() < 4096 {
		b.WriteString(strings.Repeat("x", 74) + "\r\n")
	}
	return []byte(b.String())
}

// BenchmarkIntake drives a real server over loopback with pipelining
// clients: MAIL, RCPT and DATA in one write, then the body, as Postfix
// does (RFC 2920); and with clients that wait for each reply before the
// next command, as Postfix's smtp-source does. One op is one accepted
// message; allocs/op counts both sides, the client allocating nothing per
// message.
func BenchmarkIntake(b *testing.B) {
	for _, pipelining := range []bool{true, false} {
		for _, sessions := range []int{1, 4} {
			name := "pipelining=" + strconv.FormatBool(pipelining) + "/sessions=" + strconv.Itoa(sessions)
			b.Run(name, func(b *testing.B) { benchIntake(b, sessions, pipelining) })
		}
	}
}

func benchIntake(b *testing.B, sessions int, pipelining bool) {
	cfg := testConfig(b)
	cfg.TrustedNetworks = []string{"127.0.0.0/8"}
	// The production logger's shape: JSON at info level, so that the
	// per-message "accepted" line is part of the cost.
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel)
	// The queue's directory exists (the queue made it), and free space is
	// measured for real.
	if err := os.MkdirAll(filepath.Dir(cfg.Queue.Path), 0o700); err != nil {
		b.Fatal(err)
	}
	srv, err := New(Options{Config: cfg, Queue: &discardQueue{}, Logger: zap.New(core)})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Shutdown(b.Context()) })
	addr := srv.Addrs()[0].String()
	cmds := []byte("MAIL FROM:<a@x.example>\r\nRCPT TO:<b@y.example>\r\nDATA\r\n")
	data := append(benchBody(), ".\r\n"...)
	send := (*benchClient).message
	if !pipelining {
		send = (*benchClient).stepwise
	}
	clients := make([]*benchClient, sessions)
	for i := range clients {
		clients[i] = dialBench(b, addr)
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				if err := send(c, cmds, data); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	for _, c := range clients {
		c.conn.Close()
	}
}

type benchClient struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialBench(b *testing.B, addr string) *benchClient {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Minute))
	c := &benchClient{conn: conn, r: bufio.NewReader(conn)}
	if _, err := c.conn.Write([]byte("EHLO bench.example\r\n")); err != nil {
		b.Fatal(err)
	}
	for _, want := range []string{"220 ", "250 "} {
		if err := c.expect(want); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// message sends one pipelined transaction and checks the four replies.
func (c *benchClient) message(cmds, data []byte) error {
	if _, err := c.conn.Write(cmds); err != nil {
		return err
	}
	for _, want := range []string{"250 ", "250 ", "354 "} {
		if err := c.expect(want); err != nil {
			return err
		}
	}
	if _, err := c.conn.Write(data); err != nil {
		return err
	}
	return c.expect("250 ")
}

// stepwise sends one transaction a command at a time, each after the
// reply to the one before.
func (c *benchClient) stepwise(cmds, data []byte) error {
	replies := []string{"250 ", "250 ", "354 "}
	for i := 0; len(cmds) > 0; i++ {
		n := bytes.IndexByte(cmds, '\n') + 1
		if _, err := c.conn.Write(cmds[:n]); err != nil {
			return err
		}
		if err := c.expect(replies[i]); err != nil {
			return err
		}
		cmds = cmds[n:]
	}
	if _, err := c.conn.Write(data); err != nil {
		return err
	}
	return c.expect("250 ")
}

// expect reads one reply, multi-line or not, whose last line starts with
// want.
func (c *benchClient) expect(want string) error {
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) >= 4 && line[3] == '-' {
			continue
		}
		if len(line) < len(want) || string(line[:len(want)]) != want {
			return &benchError{got: string(line), want: want}
		}
		return nil
	}
}

type benchError struct{ got, want string }

func (e *benchError) Error() string { return "got " + strconv.Quote(e.got) + ", want " + e.want }

// BenchmarkNormalizer is the body normaliser alone on a 4 KiB message.
func BenchmarkNormalizer(b *testing.B) {
	body := benchBody()
	out := make([]byte, 0, 2*len(body))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		n := normalizer{out: out[:0], max: 1 << 20}
		n.write(body)
		n.finish()
	}
}
