package smtpd

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/config"
)

// FuzzSession plays random bytes as a client conversation against a real
// server (trusted client, so messages get through to the fake queue), with
// bare_cr normalize (mode even) or reject (mode odd). The server must not
// panic (go-smtp would recover and log it), must end every session once the
// client stops sending, and must never enqueue a body with a CR or LF
// outside a CRLF pair.
func FuzzSession(f *testing.F) {
	seeds := []string{
		"EHLO x\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<c@d.example>\r\nDATA\r\nSubject: x\r\n\r\nbody\r\n.\r\nQUIT\r\n",
		"EHLO x\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<c@d.example>\r\nDATA\r\nbody\r\r\n.\r\nMAIL FROM:<s@x>\r\n.\r\n",
		"EHLO x\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<c@d.example>\r\nDATA\r\nbody\n.\nRSET\r\n.\r\n",
		"EHLO x\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<c@d.example>\r\nDATA\r\nb\r.\r\x00\r\n.\r\n",
		"EHLO x\r\nMAIL FROM:<> SIZE=10 BODY=8BITMIME SMTPUTF8 RET=FULL ENVID=a+2B\r\nRCPT TO:<\"a b\"@c> NOTIFY=DELAY ORCPT=utf-8;\\x{0D}@x\r\n",
		"EHLO x\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<c@d.example>\r\nBDAT 3\r\nabcBDAT 2 LAST\r\n\r\r",
		"EHLO x\r\nAUTH PLAIN AGFsaWNlAGFsaWNlLXB3\r\nAUTH LOGIN\r\n*\r\nNOOP\r\nVRFY x\r\nHELP\r\n",
		"EHLO x\r\nAUTH LOGIN YWxpY2U=\r\nYWxpY2UtcHc=\r\nMAIL FROM:<@a:b@c.example>\r\n",
		"EHLO x\r\nSTARTTLS\r\nRSET\r\n",
		"HELO \x00\r\nMAIL FROM:<a\r@b>\r\nRCPT TO:<x@y@z>\r\nDATA\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"\x16\x03\x01\x00\x05hello",
		"EHLO evil.test\rX-Injected: yes\r\nEHLO x\r\nEHLO [1.2.3.4]\r\nEHLO a\rb\r\n",
		"EHLO x\r\nMAIL FROM:<\"a b\"@c.example>\r\nRCPT TO:<Postmaster>\r\nRCPT TO:<u@[192.0.2.1]>\r\nRCPT TO:<\"q\\\"r\"@s.example>\r\n",
		"EHLO x\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<c@d.example>\r\nDATA\r\n" + strings.Repeat("L", 2100) + "\r\n.\r\nNOOP\r\n",
		"EHLO x\r\nNOOP " + strings.Repeat("n", 2100) + "\r\nNOOP\r\n",
		"EHLO x\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<c@d.example>\r\nBDAT 2100 LAST\r\n" + strings.Repeat("C", 2100) + "NOOP\r\n",
	}
	for i, s := range seeds {
		f.Add(uint8(i), []byte(s))
	}
	cert, key := writeCert(f)
	var envs [2]*testEnv
	for i, mode := range []config.BareCRPolicy{config.BareCRNormalize, config.BareCRReject} {
		cfg := testConfig(f)
		cfg.TrustedNetworks = []string{"127.0.0.0/8"}
		cfg.BareCR = mode
		cfg.Limits.CommandTimeout = 2 * time.Second
		cfg.Listeners[0].TLSCert, cfg.Listeners[0].TLSKey = cert, key
		envs[i] = startServer(f, cfg, withUsers(testUsers(f)))
	}
	f.Fuzz(func(t *testing.T, mode uint8, data []byte) {
		e := envs[mode%2]
		conn, err := net.Dial("tcp", e.addr(0))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		go func() {
			conn.Write(data) // the server may close early; that is fine
			conn.(*net.TCPConn).CloseWrite()
		}()
		// EOF or a reset (the server closed with input unread) both end
		// the session; only a timeout means it hung.
		if _, err := io.Copy(io.Discard, conn); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("session did not end: %v", err)
			}
		}
		for _, entry := range e.logs.TakeAll() {
			if entry.Message == "go-smtp" && entry.Level >= zap.ErrorLevel {
				t.Fatalf("server panicked: %v", entry.ContextMap())
			}
		}
		e.q.mu.Lock()
		msgs := e.q.msgs
		e.q.msgs = nil
		e.q.mu.Unlock()
		for _, m := range msgs {
			if strayCRLF(m.Body) || !bytes.HasSuffix(m.Body, []byte("\r\n")) || bytes.IndexByte(m.Body, 0) >= 0 {
				t.Fatalf("bad body stored: %q", m.Body)
			}
		}
	})
}
