package smtpd

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/queue"
)

// startSpoolServer runs a server on a real queue, which spools bodies from
// queue.SpoolThreshold on.
func startSpoolServer(t *testing.T, mutate func(*testEnv)) (*testEnv, *queue.Queue) {
	t.Helper()
	cfg := trustedConfig(t)
	cfg.Limits.MaxMessageBytes = 4 << 20
	q, err := queue.Open(cfg.Queue.Path, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	e := startServer(t, cfg, func(o *Options) { o.Queue = q })
	if mutate != nil {
		mutate(e)
	}
	return e, q
}

// bigBody is a message of about size octets whose lines end in CRLF, bare
// LF or carry a stray CR, so normalisation happens across the points
// where the body is moved to the spool file.
func bigBody(size int) string {
	var b strings.Builder
	b.WriteString("Subject: big\r\n\r\n")
	for i := 0; b.Len() < size; i++ {
		switch i % 7 {
		case 3:
			fmt.Fprintf(&b, "line %d bare LF\n", i)
		case 5:
			fmt.Fprintf(&b, "line %d stray\rCR\r\n", i)
		default:
			fmt.Fprintf(&b, "line %d %s\r\n", i, strings.Repeat("x", i%90))
		}
	}
	return b.String()
}

func spoolFiles(t *testing.T, q *queue.Queue, path string) []string {
	t.Helper()
	ents, err := os.ReadDir(path + ".bodies")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// A large body is spooled as it is read and stored exactly as the same
// body held in memory would have been.
func TestSpool_LargeBodyMatchesInMemory(t *testing.T) {
	body := bigBody(queue.SpoolThreshold*3 + 12345)

	cfg := trustedConfig(t)
	cfg.Limits.MaxMessageBytes = 4 << 20
	mem := startServer(t, cfg)
	c := dial(t, mem.addr(0))
	c.hello()
	c.sendMessage("a@example.org", []string{"r@example.net"}, body)
	want := bodyOf(mem.q.messages()[0].Body)

	e, q := startSpoolServer(t, nil)
	c = dial(t, e.addr(0))
	c.hello()
	last := c.sendMessage("a@example.org", []string{"r@example.net"}, body)
	if !strings.HasPrefix(last, "250 ") {
		t.Fatalf("reply %q", last)
	}
	id, err := queue.ParseID(last[strings.LastIndexByte(last, ' ')+1:])
	if err != nil {
		t.Fatal(err)
	}
	got, err := q.Body(id)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bodyOf(got), want) {
		t.Errorf("spooled body (%d octets) differs from the in-memory one (%d)", len(bodyOf(got)), len(want))
	}
	if strayCRLF(got) {
		t.Error("stray CR or LF in the stored body")
	}
	if m, _ := q.Show(id); m.Size != int64(len(got)) {
		t.Errorf("Size = %d, body has %d", m.Size, len(got))
	}
	if n := len(spoolFiles(t, q, e.srv.cfg.Queue.Path)); n != 1 {
		t.Errorf("%d spool files, want 1", n)
	}
}

// A spooled body that is refused leaves no file behind, and the session
// goes on.
func TestSpool_RefusedBodiesLeaveNoFile(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		want  string
		setup func(*testEnv)
	}{
		{"too big", bigBody(5 << 20), "552 5.3.4", nil},
		{"mail loop", strings.Repeat("Received: from x by y; Mon, 1 Jan 2024 00:00:00 +0000\r\n", 200) +
			"\r\n" + bigBody(queue.SpoolThreshold*2), "554 5.4.6", nil},
		{"NUL", bigBody(queue.SpoolThreshold*2) + "nul \x00 here\r\n", "554 5.6.0", nil},
		{"disk low", bigBody(queue.SpoolThreshold * 2), "452 4.3.1", func(e *testEnv) { e.disk.Store(1000) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, q := startSpoolServer(t, nil)
			c := dial(t, e.addr(0))
			c.hello()
			c.cmd("MAIL FROM:<a@example.org>", "250 ")
			c.cmd("RCPT TO:<r@example.net>", "250 ")
			c.cmd("DATA", "354 ")
			if tt.setup != nil {
				tt.setup(e)
			}
			c.write(tt.body + ".\r\n")
			lines := c.reply()
			if got := lines[len(lines)-1]; !strings.HasPrefix(got, tt.want) {
				t.Fatalf("reply %q, want %s", got, tt.want)
			}
			if names := spoolFiles(t, q, e.srv.cfg.Queue.Path); len(names) != 0 {
				t.Errorf("spool files left: %v", names)
			}
			c.cmd("NOOP", "250 ")
		})
	}
}

// The check after the final dot reuses the young measurement taken at MAIL
// for a body held in memory (a system call per message less), and
// measures again for a spooled one, which took longer and wrote to the
// disk.
func TestCheckDiskAfterDot(t *testing.T) {
	tests := []struct {
		name string
		body string
		want int64 // measurements for MAIL and the final dot
	}{
		{"in memory", "Subject: small\r\n\r\nhello\r\n", 1},
		{"spooled", bigBody(queue.SpoolThreshold * 2), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, _ := startSpoolServer(t, nil)
			c := dial(t, e.addr(0))
			c.hello()
			e.statfs.Store(0)
			c.cmd("MAIL FROM:<a@example.org>", "250 ")
			c.cmd("RCPT TO:<r@example.net>", "250 ")
			c.cmd("DATA", "354 ")
			c.write(tt.body + ".\r\n")
			if lines := c.reply(); !strings.HasPrefix(lines[len(lines)-1], "250 ") {
				t.Fatalf("reply %q", lines)
			}
			if got := e.statfs.Load(); got != tt.want {
				t.Errorf("%d free-space measurements, want %d", got, tt.want)
			}
		})
	}
}
