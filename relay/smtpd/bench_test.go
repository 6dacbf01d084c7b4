package smtpd

import (
	"bufio"
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
// does (RFC 2920). One op is one accepted message; allocs/op counts both
// sides, the client allocating nothing per message.
func BenchmarkIntake(b *testing.B) {
	for _, sessions := range []int{1, 4} {
		b.Run("sessions="+strconv.Itoa(sessions), func(b *testing.B) { benchIntake(b, sessions) })
	}
}

func benchIntake(b *testing.B, sessions int) {
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
				if err := c.message(cmds, data); err != nil {
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
