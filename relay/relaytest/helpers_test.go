package relaytest

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/smtp"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
)

func TestReply(t *testing.T) {
	for _, c := range []struct {
		line string
		want gosmtp.SMTPError
	}{
		{"450 4.2.1 mailbox busy, try later", gosmtp.SMTPError{Code: 450, EnhancedCode: gosmtp.EnhancedCode{4, 2, 1}, Message: "mailbox busy, try later"}},
		{"421 4.7.0", gosmtp.SMTPError{Code: 421, EnhancedCode: gosmtp.EnhancedCode{4, 7, 0}}},
		{"550 no such user", gosmtp.SMTPError{Code: 550, EnhancedCode: gosmtp.NoEnhancedCode, Message: "no such user"}},
		{"451 5.7.1 class differs", gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.NoEnhancedCode, Message: "5.7.1 class differs"}},
		{"554 5.1.1000 too long", gosmtp.SMTPError{Code: 554, EnhancedCode: gosmtp.NoEnhancedCode, Message: "5.1.1000 too long"}},
	} {
		var got *gosmtp.SMTPError
		if !errors.As(Reply(c.line), &got) || *got != c.want {
			t.Errorf("Reply(%q) = %+v, want %+v", c.line, got, c.want)
		}
	}
	for _, bad := range []string{"", "ok", "199 too low", "600 too high", "25 short"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Reply(%q) did not panic", bad)
				}
			}()
			Reply(bad)
		}()
	}
}

// FuzzReply: a line Reply accepts starts with its code and ends with its
// text; anything else panics (a mistake in a test), never a wrong reply.
func FuzzReply(f *testing.F) {
	for _, s := range []string{"450 4.2.1 busy", "550 no", "421 4.7.0", "299 2.0.0 x y", "25"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		var e *gosmtp.SMTPError
		func() {
			defer func() { _ = recover() }()
			_ = errors.As(Reply(line), &e)
		}()
		if e == nil {
			return
		}
		code := fmt.Sprint(e.Code)
		if (line != code && !strings.HasPrefix(line, code+" ")) || !strings.HasSuffix(line, e.Message) {
			t.Errorf("Reply(%q) = %d %v %q", line, e.Code, e.EnhancedCode, e.Message)
		}
	})
}

func TestLoopback(t *testing.T) {
	var first string
	t.Run("hands out distinct addresses", func(t *testing.T) {
		seen := map[string]bool{}
		for range 20 {
			a := Loopback(t)
			if seen[a] || !strings.HasPrefix(a, "127.0.0.") || a == "127.0.0.1" || a == "127.0.0.2" {
				t.Fatalf("Loopback gave %s (seen before: %v)", a, seen[a])
			}
			seen[a] = true
			if first == "" {
				first = a
			}
		}
	})
	if again := Loopback(t); again != first {
		t.Errorf("after the subtest ended, Loopback gave %s, want %s back", again, first)
	}
}

// TestFakeMX: a scripted answer reaches the client, and the transaction,
// the AUTH attempt and the transcript are recorded.
func TestFakeMX(t *testing.T) {
	f := StartMX(t, "127.0.0.1:0", MXOptions{Users: map[string]string{"u": "p"}, Configure: func(s *gosmtp.Server) { s.AllowInsecureAuth = true },
		Script: Script{Rcpt: func(tx int, to string) error {
			if strings.HasPrefix(to, "grey@") && tx == 0 {
				return Reply("450 4.2.0 greylisted")
			}
			return nil
		}}})
	c, err := smtp.Dial(f.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Auth(smtp.PlainAuth("", "u", "p", f.Addr().Addr().String())); err != nil {
		t.Fatal(err)
	}
	if err := c.Mail("a@x.test"); err != nil {
		t.Fatal(err)
	}
	var te *textproto.Error
	if err := c.Rcpt("grey@y.test"); !errors.As(err, &te) || te.Code != 450 || te.Msg != "4.2.0 greylisted" {
		t.Errorf("RCPT grey: %v, want 450 4.2.0 greylisted", err)
	}
	if err := c.Rcpt("b@y.test"); err != nil {
		t.Fatal(err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, "hi\r\n")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	c.Quit()
	txs := f.Delivered()
	if len(txs) != 1 || txs[0].From != "a@x.test" || !slices.Equal(txs[0].Tried, []string{"grey@y.test", "b@y.test"}) ||
		!slices.Equal(txs[0].Accepted, []string{"b@y.test"}) || txs[0].Data != "hi\r\n" || txs[0].DataCalls != 1 {
		t.Errorf("delivered %+v", txs)
	}
	if got := f.Auths(); !slices.Equal(got, []string{"u:p"}) || !slices.Equal(f.Authed(), []string{"u"}) {
		t.Errorf("AUTH %v / %v", got, f.Authed())
	}
	if tr := f.Transcript(); !strings.Contains(tr, "RCPT TO:<grey@y.test>") || !strings.Contains(tr, "450 4.2.0 greylisted") {
		t.Errorf("transcript lacks the greylisted RCPT:\n%s", tr)
	}
	if conns := f.Connections(); len(conns) != 1 || net.ParseIP(conns[0]) == nil {
		t.Errorf("connections %v", conns)
	}
}

// TestPeer: a client that follows the script gets the scripted bytes; one
// that strays is reported.
func TestPeer(t *testing.T) {
	p := StartPeer(t, "127.0.0.1:0", PeerOptions{}, []Step{
		{Send: "220 peer.test\r\n"},
		{Expect: "EHLO", Send: "250 peer.test\r\n"},
		{Expect: "MAIL", Pipe: []string{"RCPT"}, Send: "250 ok\r\n250 ok\r\n"},
		{Expect: "DATA", Send: "354 go\r\n"},
		{Data: true, Send: "250 queued\r\n", Close: true},
	})
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "EHLO me\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@y>\r\nDATA\r\nhi\r\n.\r\n")
	got, err := io.ReadAll(c)
	if want := "220 peer.test\r\n250 peer.test\r\n250 ok\r\n250 ok\r\n354 go\r\n250 queued\r\n"; string(got) != want {
		t.Errorf("client read %q (%v), want %q", got, err, want)
	}
	p.Close()
	lines, data, conns := p.Received()
	if !slices.Equal(lines, []string{"EHLO me", "MAIL FROM:<a@x>", "RCPT TO:<b@y>", "DATA"}) || len(data) != 1 ||
		string(data[0]) != "hi\r\n.\r\n" || conns != 1 || len(p.Conns()) != 1 {
		t.Errorf("peer received %q %q over %d connections", lines, data, conns)
	}
}

// TestFakeMXRecordsRefusals: a refused MAIL, a refused recipient and a
// refused message are recorded with the script's answer, the refused
// message's bytes included; the authenticated user goes with each
// transaction; Changed announces each of them.
func TestFakeMXRecordsRefusals(t *testing.T) {
	f := StartMX(t, "127.0.0.1:0", MXOptions{Users: map[string]string{"u": "p"}, NoTranscript: true,
		Configure: func(s *gosmtp.Server) { s.AllowInsecureAuth = true },
		Script: Script{
			Mail: func(tx int) error {
				if tx == 0 {
					return Reply("421 4.7.0 come back later")
				}
				return nil
			},
			Rcpt: func(_ int, to string) error {
				if strings.HasPrefix(to, "bad@") {
					return Reply("550 5.1.1 no such user")
				}
				return nil
			},
			Data: func(int) error { return Reply("554 5.7.1 spam") },
		}})
	changed := f.Changed()
	c, err := smtp.Dial(f.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-changed: // the connection
	case <-time.After(10 * time.Second):
		t.Fatal("no change announced for a connection")
	}
	if err := c.Auth(smtp.PlainAuth("u", "u", "p", f.Addr().Addr().String())); err != nil {
		t.Fatal(err)
	}
	if err := c.Mail("a@x.test"); err == nil {
		t.Fatal("first MAIL accepted, want 421")
	}
	if err := c.Mail("a@x.test"); err != nil {
		t.Fatal(err)
	}
	c.Rcpt("bad@y.test")
	if err := c.Rcpt("b@y.test"); err != nil {
		t.Fatal(err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, "spam\r\n")
	if err := w.Close(); err == nil {
		t.Fatal("message accepted, want 554")
	}
	txs := f.Transactions()
	var code *gosmtp.SMTPError
	if len(txs) != 2 || !errors.As(txs[0].MailErr, &code) || code.Code != 421 || txs[1].MailErr != nil {
		t.Fatalf("transactions %+v, want a refused MAIL and an accepted one", txs)
	}
	tx := txs[1]
	if !slices.Equal(tx.Refused, []string{"bad@y.test"}) || !slices.Equal(tx.Accepted, []string{"b@y.test"}) ||
		string(tx.Body) != "spam\r\n" || !errors.As(tx.DataErr, &code) || code.Code != 554 || tx.Delivered || tx.Data != "" ||
		tx.User != "u" || txs[0].User != "u" {
		t.Errorf("transaction %+v", tx)
	}
	if f.Transcript() != "" {
		t.Errorf("a transcript with NoTranscript")
	}
	// An authorization identity other than the user's own is refused.
	c2, err := smtp.Dial(f.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := c2.Auth(smtp.PlainAuth("someone-else", "u", "p", f.Addr().Addr().String())); err == nil {
		t.Error("AUTH as another identity accepted")
	}
}

// TestFakeMXImplicitTLSAndWrapConn: with ImplicitTLS the server speaks
// TLS from the first byte, a transaction over it is marked TLS, and
// WrapConn sees the plaintext dialogue inside.
func TestFakeMXImplicitTLSAndWrapConn(t *testing.T) {
	cert := NewCert(t)
	var mu sync.Mutex
	var seen bytes.Buffer
	f := StartMX(t, "127.0.0.1:0", MXOptions{TLS: cert.Config, ImplicitTLS: true,
		WrapConn: func(c net.Conn, n int) net.Conn {
			if n != 0 {
				t.Errorf("connection index %d, want 0", n)
			}
			return &tapConn{Conn: c, mu: &mu, w: &seen}
		}})
	conn, err := tls.Dial("tcp", f.Addr().String(), &tls.Config{RootCAs: cert.Pool, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := smtp.NewClient(conn, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Mail("a@x.test"); err != nil {
		t.Fatal(err)
	}
	c.Quit()
	if txs := f.Transactions(); len(txs) != 1 || !txs[0].TLS {
		t.Errorf("transactions %+v, want one over TLS", txs)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(seen.String(), "MAIL FROM:<a@x.test>") {
		t.Errorf("WrapConn saw %q, want the plaintext MAIL", seen.String())
	}
}

// tapConn copies what the client sends to w.
type tapConn struct {
	net.Conn
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.w.Write(p[:n])
	c.mu.Unlock()
	return n, err
}
