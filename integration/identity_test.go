package integration

// A sender's identity with the real binary: one domain in all its
// spellings (U-label, A-label, case) is one owner, one route and one
// destination; users are made with `greyrelay user add`, submitted with
// swaks, or with a raw SMTPUTF8 dialogue where swaks cannot speak it.

import (
	"fmt"
	"net"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// usersFile runs `greyrelay user add NAME SENDER...` for each line (the
// password is NAME-pw) and returns the users file they make.
func usersFile(t *testing.T, lines ...[]string) string {
	t.Helper()
	dir := t.TempDir()
	var file strings.Builder
	for _, l := range lines {
		res := runGreyrelay(t, dir, l[0]+"-pw\n", nil, append([]string{"user", "add"}, l...)...)
		if res.Code != 0 {
			t.Fatalf("user add %q: %s", l, res)
		}
		file.WriteString(res.Stdout)
	}
	p := filepath.Join(dir, "users")
	if err := os.WriteFile(p, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// rawSMTP sends each command to the SMTP server at addr after the greeting
// and returns the replies, each as "code text" of its last line. "DATA"
// followed by a message (any command containing "\r\n") is sent as is.
func rawSMTP(t *testing.T, addr string, cmds ...string) []string {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	c := textproto.NewConn(nc)
	if _, _, err := c.ReadResponse(220); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	var out []string
	for _, cmd := range cmds {
		if strings.Contains(cmd, "\r\n") {
			_, err = c.W.WriteString(cmd)
			if err == nil {
				err = c.W.Flush()
			}
		} else {
			err = c.PrintfLine("%s", cmd)
		}
		if err != nil {
			t.Fatalf("%q: %v", cmd, err)
		}
		code, msg, err := c.ReadResponse(0)
		if err != nil && code == 0 {
			t.Fatalf("%q: %v", cmd, err)
		}
		lines := strings.Split(msg, "\n")
		out = append(out, fmt.Sprintf("%d %s", code, lines[len(lines)-1]))
	}
	return out
}

// TestSenderOwnerIDNSpellings: carol owns *@bücher.test (U-label in the
// users file), dora *@xn--mnchen-3ya.test (A-label). bob may use neither
// domain in any spelling: the A-label of carol's (swaks, plain ASCII) and
// the U-label of dora's (SMTPUTF8) get 553 5.7.1 as the spelling the file
// uses does; the owners send in the other spelling.
func TestSenderOwnerIDNSpellings(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	users := usersFile(t, []string{"carol", "*@bücher.test"}, []string{"dora", "*@xn--mnchen-3ya.test"}, []string{"bob"})
	r := n.relay("users_file="+users, "trusted_networks=[]")

	swaks := func(user, from string) (string, int) {
		return peers.SwaksMessage{Server: r.SMTPAddr, From: from, To: []string{"x@dest.test"},
			Data: message(from, "x@dest.test", user+" as "+from),
			Args: []string{"--auth", "PLAIN", "--auth-user", user, "--auth-password", user + "-pw"}}.Send(t)
	}
	for _, c := range []struct {
		user, from, reply string
		code              int
	}{
		{"bob", "x@xn--bcher-kva.test", "553 5.7.1 <x@xn--bcher-kva.test>: Sender address rejected: not owned by user bob", 23},
		{"bob", "x@XN--BCHER-KVA.TEST", "553 5.7.1", 23},
		{"bob", "x@xn--mnchen-3ya.test", "553 5.7.1", 23},
		{"carol", "carol@xn--bcher-kva.test", "250 2.0.0 OK queued as", 0},
		{"bob", "bob@b.test", "250 2.0.0 OK queued as", 0},
	} {
		if out, code := swaks(c.user, c.from); code != c.code || !strings.Contains(out, c.reply) {
			t.Errorf("%s as %s: want swaks exit %d with %q, got %d:\n%s", c.user, c.from, c.code, c.reply, code, out)
		}
	}
	for _, c := range []struct{ user, from, want string }{
		{"bob", "x@bücher.test", "553 5.7.1"},
		{"bob", "x@münchen.test", "553 5.7.1"},
		{"bob", "x@MÜNCHEN.test", "553 5.7.1"},
		{"dora", "dora@münchen.test", "250 "},
	} {
		got := rawSMTP(t, r.SMTPAddr, "EHLO client.test", authPlain(c.user, c.user+"-pw"), "MAIL FROM:<"+c.from+"> SMTPUTF8", "QUIT")
		if !strings.HasPrefix(got[2], c.want) {
			t.Errorf("%s as %s: MAIL got %q, want %q", c.user, c.from, got[2], c.want)
		}
	}
	sink.WaitFor(t, 2, 30*time.Second)
}

// TestRouteIDNSpellings: a route configured for bücher.test takes mail for
// xn--bcher-kva.test and BÜCHER.test (SMTPUTF8), and the queue holds one
// destination for both.
func TestRouteIDNSpellings(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	routed := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{
		Configure: func(s *smtp.Server) { s.EnableSMTPUTF8 = true }})
	r := n.relay(`delivery.routes={"Bücher.test.": "` + routed.Addr + `"}`)

	r.send(peers.SwaksMessage{From: "a@app.test", To: []string{"x@xn--bcher-kva.test"}, Data: message("a@app.test", "x@xn--bcher-kva.test", "a-label")})
	got := rawSMTP(t, r.SMTPAddr, "EHLO client.test", "MAIL FROM:<a@app.test> SMTPUTF8", "RCPT TO:<y@BÜCHER.test>", "DATA",
		"From: a@app.test\r\nSubject: u-label\r\n\r\nhello\r\n.\r\n", "QUIT")
	if !strings.HasPrefix(got[4], "250 ") {
		t.Fatalf("SMTPUTF8 message: %q", got)
	}
	ms := routed.WaitFor(t, 2, 30*time.Second)
	var rcpts []string
	for _, m := range ms {
		rcpts = append(rcpts, m.Rcpts...)
	}
	if strings.Join(rcpts, ",") != "x@xn--bcher-kva.test,y@bücher.test" && strings.Join(rcpts, ",") != "y@bücher.test,x@xn--bcher-kva.test" {
		t.Errorf("the route got %q", rcpts)
	}
	r.waitQueueEmpty(20 * time.Second)
	var domains []string
	for _, e := range r.logEntries() {
		if d := e.str("domain"); d != "" {
			domains = append(domains, d)
		}
	}
	if len(domains) < 2 || strings.Count(strings.Join(domains, ","), "xn--bcher-kva.test") != len(domains) {
		t.Errorf("delivery logged domains %q, want only xn--bcher-kva.test", domains)
	}
}
