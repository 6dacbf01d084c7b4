package delivery

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/relaytest"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
)

// A spooled body is a mapped file; if the file loses its pages under us
// (an I/O error, here a truncation), reading it faults. send must turn the
// fault into a connection-level error instead of crashing the relay.
func TestSend_FaultingBodyIsAnError(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	port := freePort(t)
	mx := startMX(t, ip, port, relaytest.MXOptions{})
	path := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	body, err := syscall.Mmap(int(f.Fd()), 0, 1<<20, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(body)
	if err := os.Truncate(path, 0); err != nil { // every page of body now faults
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := mx.Addr()
	c, err := smtpclient.Dial(ctx, &net.Dialer{}, addr, "mx.test", smtpclient.Options{Hostname: "relay.test"})
	if err != nil {
		t.Fatal(err)
	}
	env := smtpclient.Envelope{From: "a@x.test", Rcpts: []smtpclient.Rcpt{{Addr: "b@y.test"}}}
	_, err = send(ctx, &session{c: c}, env, body)
	var se *smtpclient.Error
	if !errors.As(err, &se) || se.Stage != smtpvocab.StageDATA {
		t.Fatalf("send with a faulting body: %v, want an *smtpclient.Error at DATA", err)
	}
}
