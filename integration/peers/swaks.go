package peers

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// swaksTimeout bounds one swaks run; its own --timeout (default 30 s) bounds
// each SMTP step.
const swaksTimeout = 60 * time.Second

// Swaks runs swaks with args and returns its combined output and exit code
// (0: the whole transaction succeeded; 23, 24, 25: refused at MAIL, RCPT,
// DATA; see swaks(1)). A swaks that cannot be run fails the test.
func Swaks(t testing.TB, args ...string) (out string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), swaksTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, mustLookPath(t, "swaks"), args...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return buf.String(), 0
	case errors.As(err, &exit) && ctx.Err() == nil:
		return buf.String(), exit.ExitCode()
	default:
		t.Fatalf("peers: swaks %s: %v\n%s", strings.Join(args, " "), err, buf.String())
		return "", -1
	}
}

// SwaksMessage is one message to submit with swaks.
type SwaksMessage struct {
	Server  string   // host:port
	From    string   // envelope sender; "" is the null sender <>
	To      []string // envelope recipients
	Helo    string   // EHLO name; default "client.test"
	LocalIP string   // source address to connect from (a distinct "host"); default: the kernel's choice
	// Data is the message (headers and body) without the final dot. swaks
	// adds dot-stuffing; note that it also expands %TOKENS% and, in data
	// without a line feed, "\n" escapes. Nil: swaks's default test message.
	Data []byte
	Args []string // further swaks arguments (-tls, --auth, --quit-after RCPT...)
}

// Send submits m with swaks; see Swaks for the results.
func (m SwaksMessage) Send(t testing.TB) (out string, code int) {
	t.Helper()
	args := []string{"--server", m.Server, "--from", m.From, "--helo", cmp.Or(m.Helo, "client.test"),
		"--to", strings.Join(m.To, ","), "--hide-informational", "--timeout", "20"}
	if m.From == "" {
		args[3] = "<>"
	}
	if m.LocalIP != "" {
		args = append(args, "--local-interface", m.LocalIP)
	}
	if m.Data != nil {
		f := filepath.Join(t.TempDir(), "message.eml")
		if err := os.WriteFile(f, m.Data, 0o644); err != nil {
			t.Fatalf("peers: %v", err)
		}
		args = append(args, "--data", "@"+f)
	}
	return Swaks(t, append(args, m.Args...)...)
}
