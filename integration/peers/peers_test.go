package peers

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/miekg/dns"
	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// fakeRelayEnv makes the test binary behave as a minimal greyrelay, so the
// Relay harness (start, readiness, kill, restart, stop) is tested even
// where the real binary cannot be built.
const fakeRelayEnv = "PEERS_TEST_FAKE_RELAY"

func TestMain(m *testing.M) {
	if os.Getenv(fakeRelayEnv) != "" {
		os.Exit(fakeRelay(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeRelay serves a 220 greeting on every listener and 200 on /readyz
// until SIGTERM, like `greyrelay serve -config FILE`.
func fakeRelay(args []string) int {
	if len(args) != 3 || args[0] != "serve" || args[1] != "-config" {
		fmt.Fprintln(os.Stderr, "usage: serve -config FILE")
		return 2
	}
	b, err := os.ReadFile(args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var v relayConfigView
	if err := yaml.Unmarshal(b, &v); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	for _, l := range v.Listeners {
		ln, err := net.Listen("tcp", l.Address)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		go serveGreeting(ln)
	}
	ln, err := net.Listen("tcp", *v.Admin.Address)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
		}
	}))
	fmt.Println("fake relay ready")
	<-ctx.Done()
	fmt.Println("fake relay stopping")
	return 0
}

func serveGreeting(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			fmt.Fprintf(c, "220 fake ESMTP\r\n")
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if err != nil || strings.HasPrefix(strings.ToUpper(line), "QUIT") {
					fmt.Fprintf(c, "221 bye\r\n")
					return
				}
				fmt.Fprintf(c, "250 ok\r\n")
			}
		}()
	}
}

func TestRelayHarnessLifecycle(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	smtpAddr, adminAddr := FreeAddr(t, "127.0.0.1"), FreeAddr(t, "127.0.0.1")
	cfg := fmt.Sprintf("listeners:\n  - address: %s\nadmin:\n  address: %s\n", smtpAddr, adminAddr)
	r := StartRelay(t, cfg, WithBinary(self), WithEnv(fakeRelayEnv+"=1"))

	if r.SMTPAddr != smtpAddr || r.AdminAddr != adminAddr {
		t.Fatalf("addresses %q %q, want %q %q", r.SMTPAddr, r.AdminAddr, smtpAddr, adminAddr)
	}
	if code, _ := r.Get(t, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz = %d", code)
	}
	r.Kill()
	if r.Running() {
		t.Fatal("running after Kill")
	}
	if err := Greets(smtpAddr, false); err == nil {
		t.Fatal("listener still answers after Kill")
	}
	r.Restart(t)
	if err := Greets(smtpAddr, false); err != nil {
		t.Fatalf("after Restart: %v", err)
	}
	if err := r.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	log := r.Log()
	if n := strings.Count(log, "--- peers:"); n != 2 {
		t.Errorf("log has %d start markers, want 2:\n%s", n, log)
	}
	if !strings.Contains(log, "fake relay stopping") {
		t.Errorf("SIGTERM not delivered; log:\n%s", log)
	}
}

func TestStartRelayRefusesConfigWithoutAddresses(t *testing.T) {
	for name, cfg := range map[string]string{
		"no listeners": "admin:\n  address: \"\"\n",
		"no admin":     "listeners:\n  - address: 127.0.0.1:1\n",
	} {
		r := &Relay{Dir: t.TempDir()}
		if err := r.readConfig(cfg); err == nil {
			t.Errorf("%s: readConfig accepted %q", name, cfg)
		}
	}
}

// rawSMTP is a client that writes exactly the given lines, so tests can do
// what a real client library refuses to (DATA after every RCPT failed).
type rawSMTP struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr, localIP string) *rawSMTP {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := &rawSMTP{t: t, c: c, br: bufio.NewReader(c)}
	r.expect("220")
	return r
}

// send writes line and checks the reply code.
func (r *rawSMTP) send(line, code string) string {
	r.t.Helper()
	if _, err := io.WriteString(r.c, line+"\r\n"); err != nil {
		r.t.Fatal(err)
	}
	return r.expect(code)
}

func (r *rawSMTP) expect(code string) string {
	r.t.Helper()
	var all string
	var p smtpvocab.Parser
	for {
		line, err := r.br.ReadString('\n')
		if err != nil {
			r.t.Fatalf("reading reply: %v (so far %q)", err, all)
		}
		all += line
		rep, err := p.Add(strings.TrimRight(line, "\r\n"))
		if err != nil {
			r.t.Fatalf("malformed reply %q: %v", all, err)
		}
		if rep != nil {
			break
		}
	}
	if !strings.HasPrefix(all, code) {
		r.t.Fatalf("reply %q, want %s", all, code)
	}
	return all
}

func TestSinkRecordsAndScripts(t *testing.T) {
	sink := StartSink(t, "", SinkOptions{
		Rcpt: func(rcpt string, attempt int) *smtp.SMTPError {
			switch {
			case strings.HasPrefix(rcpt, "grey@"):
				return Greylist(1)(rcpt, attempt)
			case strings.HasPrefix(rcpt, "bad@"):
				return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
			}
			return nil
		},
		Data: func(rcpts []string, attempt int) *smtp.SMTPError {
			if attempt == 1 {
				return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try later"}
			}
			return nil
		},
	})
	clientIP := relaytest.Loopback(t)
	c := dialRaw(t, sink.Addr, clientIP)
	c.send("EHLO client.test", "250")
	c.send("MAIL FROM:<a@src.test> SIZE=100 BODY=8BITMIME", "250")
	c.send("RCPT TO:<grey@dest.test>", "450 4.2.0")
	c.send("RCPT TO:<bad@dest.test>", "550 5.1.1")
	c.send("DATA", "502") // go-smtp refuses by itself: no recipient accepted
	c.send("RSET", "250")

	body := "Subject: x\r\n\r\n..leading dot\r\nlast line\r\n"
	for _, want := range []string{"451", "250"} { // the Data script refuses the first DATA
		c.send("MAIL FROM:<a@src.test>", "250")
		c.send("RCPT TO:<grey@dest.test>", "250")
		c.send("RCPT TO:<ok@dest.test>", "250")
		c.send("DATA", "354")
		c.send(body+".", want)
	}
	c.send("QUIT", "221")

	got := sink.Messages()
	if len(got) != 1 {
		t.Fatalf("%d messages, want 1\n%s", len(got), sink.describe())
	}
	m := got[0]
	wantData := "Subject: x\r\n\r\n.leading dot\r\nlast line\r\n" // dot-unstuffed
	if string(m.Data) != wantData {
		t.Errorf("Data = %q, want %q", m.Data, wantData)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"ClientIP", m.ClientIP, clientIP},
		{"HELO", m.HELO, "client.test"},
		{"Conn", m.Conn, 1},
		{"Rcpts", strings.Join(m.Rcpts, ","), "grey@dest.test,ok@dest.test"},
		{"SHA256 length", len(m.SHA256), 64},
		{"transactions", len(sink.Transactions()), 3},
		{"first tx rejected", strings.Join(sink.Transactions()[0].Rejected, ","), "grey@dest.test,bad@dest.test"},
		{"first tx SIZE", sink.Transactions()[0].MailOptions.Size, int64(100)},
		{"first tx BODY", sink.Transactions()[0].MailOptions.Body, smtp.Body8BitMIME},
		{"second tx reply", sink.Transactions()[1].Reply.Code, 451},
		{"DATA commands", sink.Commands()["DATA"], 3},
		{"RCPT commands", sink.Commands()["RCPT"], 6},
		{"connections", sink.Connections(), 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// A client that goes away inside a BDAT chunk has not delivered a message:
// the sink (go-smtp underneath) must not record the short chunk as one.
func TestSinkIgnoresCutBDATChunk(t *testing.T) {
	sink := StartSink(t, "", SinkOptions{})
	c, err := net.Dial("tcp", sink.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	fmt.Fprintf(c, "EHLO client.test\r\nMAIL FROM:<a@x.test>\r\nRCPT TO:<b@y.test>\r\nBDAT 1000 LAST\r\nSubject: cut\r\n\r\npart")
	for replies := 0; replies < 4; { // the greeting, EHLO's last line, MAIL and RCPT
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if len(line) > 3 && line[3] == ' ' {
			replies++
		}
	}
	c.(*net.TCPConn).CloseWrite()
	time.Sleep(200 * time.Millisecond)
	if n := len(sink.Messages()); n != 0 {
		t.Fatalf("the sink recorded %d messages from a cut chunk", n)
	}
}

func TestSinkTLSAndAuth(t *testing.T) {
	cert := NewCert(t)
	users := map[string]string{"user": "secret"}
	for _, implicit := range []bool{false, true} {
		t.Run(fmt.Sprintf("implicit=%v", implicit), func(t *testing.T) {
			sink := StartSink(t, "", SinkOptions{TLS: cert.Config, ImplicitTLS: implicit, Users: users})
			clientTLS := &tls.Config{RootCAs: cert.Pool, ServerName: "127.0.0.1"}
			var c *smtp.Client
			var err error
			if implicit {
				c, err = smtp.DialTLS(sink.Addr, clientTLS)
			} else {
				c, err = smtp.DialStartTLS(sink.Addr, clientTLS)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Auth(sasl.NewPlainClient("", "user", "wrong")); err == nil {
				t.Fatal("wrong password accepted")
			}
			if err := c.Auth(sasl.NewPlainClient("", "user", "secret")); err != nil {
				t.Fatal(err)
			}
			if err := c.SendMail("a@src.test", []string{"b@dest.test"}, strings.NewReader("Subject: tls\r\n\r\nx\r\n")); err != nil {
				t.Fatal(err)
			}
			m := sink.WaitFor(t, 1, 5*time.Second)[0]
			if !m.TLS || m.User != "user" {
				t.Errorf("TLS=%v User=%q, want true, user", m.TLS, m.User)
			}
			// Before STARTTLS only EHLO and STARTTLS are visible on the wire.
			if want := map[bool]int{false: 0, true: 1}[implicit]; sink.Commands()["MAIL"] != want {
				t.Errorf("MAIL counted %d times, want %d", sink.Commands()["MAIL"], want)
			}
		})
	}
}

func TestDNS(t *testing.T) {
	d := StartDNS(t)
	d.MX("dest.test", 10, "mx.dest.test").A("mx.dest.test", "127.0.0.10").NullMX("null.test").ServFail("broken.test")
	tests := []struct {
		name  string
		qtype uint16
		rcode int
		n     int
	}{
		{"dest.test", dns.TypeMX, dns.RcodeSuccess, 1},
		{"mx.dest.test", dns.TypeA, dns.RcodeSuccess, 1},
		{"null.test", dns.TypeMX, dns.RcodeSuccess, 1},
		{"broken.test", dns.TypeMX, dns.RcodeServerFailure, 0},
		{"missing.test", dns.TypeMX, dns.RcodeNameError, 0},
	}
	for _, tc := range tests {
		for _, network := range []string{"udp", "tcp"} {
			m := new(dns.Msg).SetQuestion(dns.Fqdn(tc.name), tc.qtype)
			in, _, err := (&dns.Client{Net: network, Timeout: 2 * time.Second}).Exchange(m, d.Addr())
			if err != nil {
				t.Fatalf("%s %s: %v", network, tc.name, err)
			}
			if in.Rcode != tc.rcode || len(in.Answer) != tc.n {
				t.Errorf("%s %s: rcode %d with %d answers, want %d with %d", network, tc.name, in.Rcode, len(in.Answer), tc.rcode, tc.n)
			}
		}
	}
}

// TestPostfixDestination: Postfix on its own loopback address accepts mail
// for dest.test from swaks and passes it to a sink, from its own address;
// unknown recipients get 550 5.1.1.
func TestPostfixDestination(t *testing.T) {
	Require(t, "postfix", "swaks")
	t.Parallel()
	sink := StartSink(t, "", SinkOptions{})
	mxIP, clientIP := relaytest.Loopback(t), relaytest.Loopback(t)
	px := StartPostfix(t, PostfixConfig{
		Listen:          FreeAddr(t, mxIP),
		Hostname:        "mx.dest.test",
		RelayDomains:    []string{"dest.test"},
		KnownRecipients: []string{"known@dest.test"},
		DeliverTo:       sink.Addr,
		ServerCert:      NewCert(t, "mx.dest.test"),
	})
	msg := SwaksMessage{Server: px.Listen, From: "a@src.test", LocalIP: clientIP,
		Data: []byte("Subject: to postfix\r\nX-Test: 1\r\n\r\nbody line\r\n")}

	t.Run("known recipient is relayed to the sink", func(t *testing.T) {
		msg.To = []string{"known@dest.test"}
		if out, code := msg.Send(t); code != 0 {
			t.Fatalf("swaks exit %d:\n%s", code, out)
		}
		m := sink.WaitFor(t, 1, 15*time.Second)[0]
		if m.ClientIP != mxIP || m.HELO != "mx.dest.test" {
			t.Errorf("sink saw client %s HELO %q, want %s mx.dest.test", m.ClientIP, m.HELO, mxIP)
		}
		if m.From != "a@src.test" || strings.Join(m.Rcpts, ",") != "known@dest.test" {
			t.Errorf("envelope %q -> %v", m.From, m.Rcpts)
		}
		if !strings.Contains(string(m.Data), "X-Test: 1\r\n\r\nbody line\r\n") {
			t.Errorf("data %q lacks the original message", m.Data)
		}
		px.WaitQueueEmpty(t, 10*time.Second)
	})
	t.Run("STARTTLS is offered with the given certificate", func(t *testing.T) {
		m := msg
		m.To, m.Args = []string{"known@dest.test"}, []string{"-tls"}
		if out, code := m.Send(t); code != 0 || !strings.Contains(out, "220 2.0.0 Ready to start TLS") {
			t.Fatalf("swaks -tls exit %d:\n%s", code, out)
		}
		sink.WaitFor(t, 2, 15*time.Second)
		if log := px.Log(); !strings.Contains(log, "Anonymous TLS connection established from") {
			t.Errorf("maillog shows no TLS session:\n%s", log)
		}
	})
	t.Run("unknown recipient gets 550 5.1.1", func(t *testing.T) {
		msg.To = []string{"nobody@dest.test"}
		out, code := msg.Send(t)
		if code == 0 || !strings.Contains(out, "550 5.1.1") {
			t.Fatalf("swaks exit %d, want a 550 5.1.1 refusal:\n%s", code, out)
		}
		// Postfix writes its log through postlogd, a moment after the reply.
		err := poll(5*time.Second, func() error {
			if !strings.Contains(px.Log(), "nobody@dest.test") {
				return errors.New("no reject line yet")
			}
			return nil
		})
		if err != nil {
			t.Errorf("maillog does not mention the reject:\n%s", px.Log())
		}
	})
}

// TestPostfixPostgrey: postgrey (--delay=3) greylists the first attempt and
// accepts the same triplet from the same client IP after 3 s; another
// client IP is a new triplet (--lookup-by-host).
func TestPostfixPostgrey(t *testing.T) {
	Require(t, "postfix", "postgrey", "swaks")
	t.Parallel()
	sink := StartSink(t, "", SinkOptions{})
	mxIP, clientIP, otherIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	grey := StartPostgrey(t, "", 3*time.Second)
	px := StartPostfix(t, PostfixConfig{
		Listen:       FreeAddr(t, mxIP),
		RelayDomains: []string{"dest.test"},
		DeliverTo:    sink.Addr,
		Postgrey:     grey,
	})
	send := func(localIP string) (string, int) {
		return SwaksMessage{Server: px.Listen, From: "a@src.test", To: []string{"b@dest.test"}, LocalIP: localIP}.Send(t)
	}
	const greylisted = "450 4.2.0 <b@dest.test>: Recipient address rejected: Greylisted"

	var last time.Time
	for i := range 2 { // the second try, too early, is still greylisted
		last = time.Now()
		if out, code := send(clientIP); code == 0 || !strings.Contains(out, greylisted) {
			t.Fatalf("try %d: swaks exit %d, want %q:\n%s", i+1, code, greylisted, out)
		}
	}
	if out, code := send(otherIP); code == 0 || !strings.Contains(out, greylisted) {
		t.Fatalf("other client IP: swaks exit %d, want greylisting:\n%s", code, out)
	}
	// The delay under test, not a synchronisation. It is counted from the
	// second try: postgrey sometimes records a try made within a second
	// of the first as new again ("reason=new" twice), and it counts in
	// whole seconds, hence the extra second.
	time.Sleep(time.Until(last.Add(grey.Delay + 1200*time.Millisecond)))
	if out, code := send(clientIP); code != 0 {
		t.Fatalf("after the delay: swaks exit %d:\n%s\npostgrey:\n%s", code, out, grey.Log())
	}
	if m := sink.WaitFor(t, 1, 15*time.Second)[0]; m.ClientIP != mxIP {
		t.Errorf("sink saw client %s, want %s", m.ClientIP, mxIP)
	}
	if !strings.Contains(grey.Log(), "client_address="+clientIP) {
		t.Errorf("postgrey log lacks the client:\n%s", grey.Log())
	}
}

// TestPostfixSmarthostClient: Postfix as a client delivers a
// sendmail-injected message to its relayhost (a plain sink).
func TestPostfixSmarthostClient(t *testing.T) {
	Require(t, "postfix")
	t.Parallel()
	sink := StartSink(t, "", SinkOptions{})
	ip := relaytest.Loopback(t)
	px := StartPostfix(t, PostfixConfig{
		RelayHost:   "[127.0.0.1]:" + portOf(sink.Addr),
		BindAddress: ip,
	})
	px.Sendmail(t, "sender@src.test", []string{"x@far.test", "y@far.test"}, []byte("Subject: via sendmail\n\nhello\n.\nend\n"))
	m := sink.WaitFor(t, 1, 15*time.Second)[0]
	if m.ClientIP != ip || m.From != "sender@src.test" || strings.Join(m.Rcpts, ",") != "x@far.test,y@far.test" {
		t.Errorf("sink saw %s: %q -> %v", m.ClientIP, m.From, m.Rcpts)
	}
	if !strings.Contains(string(m.Data), "\r\nhello\r\n.\r\nend\r\n") {
		t.Errorf("data %q", m.Data)
	}
	px.WaitQueueEmpty(t, 10*time.Second)
}

// TestPostfixSmarthostSASL: the client role with TLS and AUTH, as a
// smarthost user configures it, against a sink that demands both.
func TestPostfixSmarthostSASL(t *testing.T) {
	Require(t, "postfix")
	t.Parallel()
	sink := StartSink(t, "", SinkOptions{TLS: NewCert(t).Config, Users: map[string]string{"relayuser": "pa ss:word"}})
	StartPostfix(t, PostfixConfig{
		RelayHost: "[127.0.0.1]:" + portOf(sink.Addr),
		SASLUser:  "relayuser", SASLPassword: "pa ss:word",
		TLSLevel: "encrypt",
	}).Sendmail(t, "sender@src.test", []string{"x@far.test"}, []byte("Subject: auth\n\nx\n"))
	if m := sink.WaitFor(t, 1, 15*time.Second)[0]; !m.TLS || m.User != "relayuser" {
		t.Errorf("TLS=%v User=%q", m.TLS, m.User)
	}
}

func TestRequireSkipsOrFails(t *testing.T) {
	SkipShort(t) // under -short, Require skips before it looks at the environment
	if _, err := lookPath("surely-not-installed-peer"); err == nil {
		t.Skip("a program by that name exists")
	}
	for _, required := range []bool{false, true} {
		if required {
			t.Setenv(RequireEnv, "1")
		} else {
			t.Setenv(RequireEnv, "")
		}
		skipped, failed := runRequire("surely-not-installed-peer")
		if skipped == required || failed != required {
			t.Errorf("%s=%v: skipped=%v failed=%v", RequireEnv, required, skipped, failed)
		}
	}
}

// runRequire calls Require on a recording testing.TB.
func runRequire(bin string) (skipped, failed bool) {
	rec := &recordingTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Require(rec, bin)
	}()
	<-done
	return rec.skipped, rec.failed
}

// recordingTB records Skip and Fatal instead of ending a real test.
type recordingTB struct {
	testing.TB
	skipped, failed bool
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Skipf(string, ...any) {
	r.skipped = true
	runtime.Goexit()
}
func (r *recordingTB) Fatalf(string, ...any) {
	r.failed = true
	runtime.Goexit()
}

// TestPostfixStartFailureIsExplained: a config Postfix refuses fails fast,
// and the failure message carries Postfix's own reason.
func TestPostfixStartFailureIsExplained(t *testing.T) {
	Require(t, "postfix")
	t.Parallel()
	rec := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		StartPostfix(rec, PostfixConfig{Main: map[string]string{"mail_owner": "no-such-user-here"}})
	}()
	<-done
	for _, want := range []string{"did not start", "postfix -c", "no-such-user-here", "--- maillog:"} {
		if !strings.Contains(rec.msg, want) {
			t.Errorf("failure message lacks %q:\n%s", want, rec.msg)
		}
	}
}

// fatalTB records Fatalf and ends the goroutine instead of the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
