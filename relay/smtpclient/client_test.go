package smtpclient

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/netip"
	"net/textproto"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// stageErr asserts err is an *Error at stage and returns it.
func stageErr(t *testing.T, err error, stage smtpvocab.Stage) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want *Error at %v", err, err, stage)
	}
	if e.Stage != stage {
		t.Fatalf("stage = %v, want %v (%v)", e.Stage, stage, err)
	}
	return e
}

func codes(rs []RcptResult) []int {
	var out []int
	for _, r := range rs {
		out = append(out, r.Reply.Code)
	}
	return out
}

func TestSendHappyPath(t *testing.T) {
	be, addr := startGoSMTP(t, func(s *smtp.Server) { s.TLSConfig = serverTLS() })
	var mu sync.Mutex
	var events []Event
	o := opts(TLSMay)
	o.Trace = func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
	c, err := Dial(context.Background(), nil, addr, "mx.test", o)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.TLS(); !ok {
		t.Error("TLS not used although offered under may")
	}
	if ok, _ := c.Extension("starttls"); ok {
		t.Error("extensions not re-read after STARTTLS")
	}
	if ok, p := c.Extension("size"); !ok || p != "1048576" {
		t.Errorf("Extension(SIZE) = %v, %q", ok, p)
	}
	body := []byte("Subject: hi\r\n\r\nline\n.dot\r\nbare\rcr\r\n")
	env := Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "ok1@y.test"}, {Addr: "ok2@y.test"}}, Size: int64(len(body)), EightBit: true}
	res, err := c.Send(context.Background(), env, body)
	if err != nil {
		t.Fatal(err)
	}
	if res.Mail.Code != 250 || !slices.Equal(codes(res.Rcpts), []int{250, 250}) || res.Data == nil || res.Data.Code != 250 || res.DSN {
		t.Fatalf("result = %+v", res)
	}
	if res.Mail.Enhanced != "2.0.0" {
		t.Errorf("enhanced code not parsed: %+v", res.Mail)
	}
	// A second transaction on the same connection.
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(context.Background(), Envelope{From: "", Rcpts: []Rcpt{{Addr: "ok3@y.test"}}}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := c.Quit(); err != nil {
		t.Errorf("Quit: %v", err)
	}
	msgs, _ := be.snapshot()
	if len(msgs) != 2 {
		t.Fatalf("server saw %d transactions", len(msgs))
	}
	m := msgs[0]
	want := "Subject: hi\r\n\r\nline\r\n.dot\r\nbare cr\r\n"
	if m.Helo != "client.test" || !m.TLS || m.From != "a@x.test" || !slices.Equal(m.Accepted, []string{"ok1@y.test", "ok2@y.test"}) ||
		string(m.Data) != want || m.MailOpts.Size != int64(len(body)) || m.MailOpts.Body != smtp.Body8BitMIME {
		t.Errorf("server saw %+v\nbody %q, want %q", m, m.Data, want)
	}
	if msgs[1].From != "" || string(msgs[1].Data) != "x\r\n" {
		t.Errorf("second transaction: %+v", msgs[1])
	}
	mu.Lock()
	defer mu.Unlock()
	var sent []string
	for _, e := range events {
		if e.Sent != "" {
			sent = append(sent, strings.TrimRight(strings.Fields(e.Sent)[0], "0123456789"))
		}
	}
	if want := []string{"EHLO", "STARTTLS", "EHLO", "MAIL", "RCPT", "RCPT", "DATA", "<", "RSET", "MAIL", "RCPT", "DATA", "<", "QUIT"}; !slices.Equal(sent, want) {
		t.Errorf("trace sent %v, want %v", sent, want)
	}
}

func TestTLSPolicies(t *testing.T) {
	_, pool := testCert()
	tests := []struct {
		name       string
		offer      bool
		policy     TLSPolicy
		serverName string
		roots      bool
		wantTLS    bool
		wantErr    bool
	}{
		{"may offered", true, TLSMay, "mx.test", false, true, false},
		{"default is may", true, "", "mx.test", false, true, false},
		{"may not offered", false, TLSMay, "mx.test", false, false, false},
		{"none offered", true, TLSNone, "mx.test", false, false, false},
		{"encrypt not offered", false, TLSEncrypt, "mx.test", false, false, true},
		{"encrypt self-signed", true, TLSEncrypt, "mx.test", false, true, false},
		{"verify self-signed", true, TLSVerify, "mx.test", false, false, true},
		{"verify trusted", true, TLSVerify, "mx.test", true, true, false},
		{"verify wrong name", true, TLSVerify, "other.test", true, false, true},
		{"verify not offered", false, TLSVerify, "mx.test", true, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be, addr := startGoSMTP(t, func(s *smtp.Server) {
				if tt.offer {
					s.TLSConfig = serverTLS()
				}
			})
			o := opts(tt.policy)
			if tt.roots {
				o.TLSConfig = &tls.Config{RootCAs: pool}
			}
			c, err := Dial(context.Background(), nil, addr, tt.serverName, o)
			if tt.wantErr {
				e := stageErr(t, err, smtpvocab.StageSTARTTLS)
				var te *smtpvocab.TLSError
				if !errors.As(e, &te) {
					t.Fatalf("err = %v, want a TLSError", err)
				}
				if msgs, _ := be.snapshot(); len(msgs) != 0 {
					t.Fatal("MAIL reached the server")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, ok := c.TLS(); ok != tt.wantTLS {
				t.Fatalf("TLS = %v, want %v", ok, tt.wantTLS)
			}
			res, err := c.Send(context.Background(), Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "ok@y.test"}}}, []byte("hi\r\n"))
			if err != nil || res.Data == nil || res.Data.Code != 250 {
				t.Fatalf("Send = %+v, %v", res, err)
			}
		})
	}
}

func TestStartTLSResponseInjection(t *testing.T) {
	// CVE-2021-38371 style: "250 injected" arrives in plaintext with the 220.
	inject := []step{greet, ehloTLS, {Expect: "STARTTLS", Send: "220 go ahead\r\n250 injected\r\n"}}
	p := startPeer(t, inject, inject, plainScript)
	_, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSEncrypt))
	e := stageErr(t, err, smtpvocab.StageSTARTTLS)
	var te *smtpvocab.TLSError
	if !errors.As(e, &te) || !strings.Contains(err.Error(), "injection") {
		t.Fatalf("err = %v, want TLSError about injection", err)
	}
	// Under "may", DialWithFallback redials once in plaintext.
	c, err := DialWithFallback(context.Background(), nil, p.Addr(), "mx.test", opts(TLSMay))
	if err != nil {
		t.Fatalf("DialWithFallback: %v", err)
	}
	if _, ok := c.TLS(); ok {
		t.Error("fallback connection uses TLS")
	}
	c.Quit()
	if _, _, conns := p.Received(); conns != 3 {
		t.Errorf("peer saw %d connections, want 3", conns)
	}
}

func TestStartTLSHandshakeFailure(t *testing.T) {
	broken := []step{greet, ehloTLS, {Expect: "STARTTLS", Send: "220 go ahead\r\n"}, {Expect: "\x16", Send: "this is not TLS\r\n"}}
	p := startPeer(t, broken, plainScript, broken)
	_, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSMay))
	stageErr(t, err, smtpvocab.StageSTARTTLS)

	p = startPeer(t, broken, plainScript)
	c, err := DialWithFallback(context.Background(), nil, p.Addr(), "mx.test", opts(TLSMay))
	if err != nil {
		t.Fatalf("DialWithFallback: %v", err)
	}
	c.Quit()

	// encrypt never falls back.
	p = startPeer(t, broken, plainScript)
	_, err = DialWithFallback(context.Background(), nil, p.Addr(), "mx.test", opts(TLSEncrypt))
	stageErr(t, err, smtpvocab.StageSTARTTLS)
	if _, _, conns := p.Received(); conns != 1 {
		t.Errorf("encrypt: %d connections, want 1 (no plaintext redial)", conns)
	}
}

func TestStartTLSRefused(t *testing.T) {
	refused := []step{greet, ehloTLS, {Expect: "STARTTLS", Send: "454 4.7.0 TLS not available\r\n"}}
	p := startPeer(t, append(slices.Clone(refused), quit), refused)
	c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSMay))
	if err != nil {
		t.Fatalf("may with 454: %v", err)
	}
	c.Quit()
	_, err = Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSEncrypt))
	e := stageErr(t, err, smtpvocab.StageSTARTTLS)
	var te *smtpvocab.TLSError
	var r *smtpvocab.Reply
	if !errors.As(e, &te) || !errors.As(e, &r) || r.Code != 454 {
		t.Fatalf("err = %v, want TLSError wrapping the 454", err)
	}
}

func TestAuth(t *testing.T) {
	withTLS := func(s *smtp.Server) { s.TLSConfig = serverTLS() }
	tests := []struct {
		name      string
		configure func(*smtp.Server)
		policy    TLSPolicy
		pass      string
		wantErr   bool
		wantAuths []string
	}{
		{"plain over tls", withTLS, TLSMay, "secret", false, []string{"user:secret"}},
		{"wrong password", withTLS, TLSMay, "wrong", true, []string{"user:wrong"}},
		{"refused in plaintext", func(s *smtp.Server) { s.AllowInsecureAuth = true }, TLSMay, "secret", true, nil},
		{"refused with tls none", func(s *smtp.Server) { s.AllowInsecureAuth = true; withTLS(s) }, TLSNone, "secret", true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be, addr := startGoSMTP(t, tt.configure)
			var trace []string
			o := opts(tt.policy)
			o.Username, o.Password = "user", tt.pass
			o.Trace = func(e Event) { trace = append(trace, e.Sent) }
			c, err := Dial(context.Background(), nil, addr, "mx.test", o)
			if tt.wantErr {
				stageErr(t, err, smtpvocab.StageAuth)
			} else if err != nil {
				t.Fatal(err)
			} else {
				c.Quit()
			}
			if _, auths := be.snapshot(); !slices.Equal(auths, tt.wantAuths) {
				t.Errorf("server saw AUTH %v, want %v", auths, tt.wantAuths)
			}
			secret := base64.StdEncoding.EncodeToString([]byte("\x00user\x00" + tt.pass))
			for _, l := range trace {
				if strings.Contains(l, secret) || strings.Contains(l, tt.pass) {
					t.Errorf("trace leaks credentials: %q", l)
				}
			}
		})
	}
}

func TestAuthLogin(t *testing.T) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	p := startPeer(t, []step{greet, ehloTLS,
		{Expect: "STARTTLS", Send: "220 go ahead\r\n", TLS: true},
		{Expect: "EHLO client.test", Send: "250-mx.test\r\n250 AUTH LOGIN\r\n"},
		{Expect: "AUTH LOGIN", Send: "334 VXNlcm5hbWU6\r\n"},
		{Expect: b64("user") + "\r\n", Send: "334 UGFzc3dvcmQ6\r\n"},
		{Expect: b64("pw") + "\r\n", Send: "235 2.7.0 ok\r\n"},
		quit})
	o := opts(TLSMay)
	o.Username, o.Password = "user", "pw"
	var trace []string
	o.Trace = func(e Event) { trace = append(trace, e.Sent) }
	c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", o)
	if err != nil {
		t.Fatal(err)
	}
	c.Quit()
	if slices.Contains(trace, b64("pw")) || slices.Contains(trace, b64("user")) {
		t.Errorf("trace leaks credentials: %q", trace)
	}
}

func TestMixedRecipients(t *testing.T) {
	be, addr := startGoSMTP(t, nil)
	c, err := Dial(context.Background(), nil, addr, "mx.test", opts(TLSMay))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	env := Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "ok@y.test"}, {Addr: "temp@y.test"}, {Addr: "perm@y.test"}}}
	res, err := c.Send(context.Background(), env, []byte("hi"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(codes(res.Rcpts), []int{250, 450, 550}) || res.Rcpts[1].Reply.Enhanced != "4.2.0" ||
		res.Rcpts[2].Rcpt.Addr != "perm@y.test" || res.Data == nil || res.Data.Code != 250 {
		t.Fatalf("result = %+v", res)
	}
	// No recipient accepted: no DATA.
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	env.Rcpts = env.Rcpts[1:]
	res, err = c.Send(context.Background(), env, []byte("hi"))
	if err != nil || res.Data != nil || !slices.Equal(codes(res.Rcpts), []int{450, 550}) {
		t.Fatalf("all refused: %+v, %v", res, err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	msgs, _ := be.snapshot()
	if len(msgs) != 2 || msgs[0].DataCalls != 1 || msgs[1].DataCalls != 0 || !slices.Equal(msgs[0].Accepted, []string{"ok@y.test"}) {
		t.Fatalf("server saw %+v", msgs)
	}
}

func TestDSNParameters(t *testing.T) {
	env := Envelope{From: "a@x.test", RET: "hdrs", EnvID: "id+1=x",
		Rcpts: []Rcpt{{Addr: "ok@y.test", Notify: "SUCCESS,FAILURE", ORCPT: "rfc822;orig+x=@y.test"}}}
	for _, enable := range []bool{true, false} {
		be, addr := startGoSMTP(t, func(s *smtp.Server) { s.EnableDSN = enable })
		c, err := Dial(context.Background(), nil, addr, "mx.test", opts(TLSNone))
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Send(context.Background(), env, []byte("hi"))
		c.Close()
		if err != nil || res.Data == nil || res.Data.Code != 250 || res.DSN != enable {
			t.Fatalf("DSN %v: %+v, %v", enable, res, err)
		}
		msgs, _ := be.snapshot()
		m := msgs[0]
		if !enable {
			if m.MailOpts.Return != "" || m.MailOpts.EnvelopeID != "" || m.RcptOpts[0].Notify != nil || m.RcptOpts[0].OriginalRecipient != "" {
				t.Errorf("DSN params sent to a peer without DSN: %+v %+v", m.MailOpts, m.RcptOpts)
			}
			continue
		}
		ro := m.RcptOpts[0]
		if m.MailOpts.Return != smtp.DSNReturnHeaders || m.MailOpts.EnvelopeID != "id+1=x" ||
			!slices.Equal(ro.Notify, []smtp.DSNNotify{smtp.DSNNotifySuccess, smtp.DSNNotifyFailure}) ||
			ro.OriginalRecipientType != smtp.DSNAddressTypeRFC822 || ro.OriginalRecipient != "orig+x=@y.test" {
			t.Errorf("server saw mail %+v rcpt %+v", m.MailOpts, ro)
		}
	}
}

func TestSMTPUTF8(t *testing.T) {
	env := Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "jürgen@y.test"}}}
	for _, enable := range []bool{false, true} {
		be, addr := startGoSMTP(t, func(s *smtp.Server) { s.EnableSMTPUTF8 = enable })
		c, err := Dial(context.Background(), nil, addr, "mx.test", opts(TLSNone))
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Send(context.Background(), env, []byte("hi"))
		c.Close()
		msgs, _ := be.snapshot()
		if !enable {
			if err != nil || res.Mail.Code != 553 || res.Mail.Enhanced != "5.6.7" || len(msgs) != 0 {
				t.Errorf("without SMTPUTF8: %+v, %v, server saw %d", res, err, len(msgs))
			}
			continue
		}
		if err != nil || res.Data == nil || res.Data.Code != 250 || !msgs[0].MailOpts.UTF8 {
			t.Errorf("with SMTPUTF8: %+v, %v", res, err)
		}
	}
}

func TestBodyOnTheWire(t *testing.T) {
	// Every end-of-data impostor (SMTP smuggling) plus stray CR/LF must
	// arrive normalised.
	seqs := []string{"\n.\n", "\r.\r", "\r.\n", "\n.\r", "\n.\r\n", "\r\n.\n", "\r.\r\n", "\r\n.\r", "\r\n\x00.\r\n",
		"\r\n.\x00\r\n", "\r\n.\r\r\n", "\r\r\n.\r\r\n", "\r\r\n.\r\n", "\r\n.\r\n"}
	var body strings.Builder
	body.WriteString("Subject: t\r\n\r\n")
	for _, s := range seqs {
		body.WriteString("body" + s + "MAIL FROM:<smuggled@x>\r\n")
	}
	body.WriteString(".leading dot\r\nbare\rcr and bare\nlf\r\nno final newline")
	p := startPeer(t, []step{greet, ehloPlain, mailOK, rcptOK, dataGo, dataDone, quit})
	c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSMay))
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Send(context.Background(), Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}}}, []byte(body.String()))
	if err != nil || res.Data == nil || res.Data.Code != 250 {
		t.Fatalf("Send = %+v, %v", res, err)
	}
	c.Quit()
	lines, data, _ := p.Received()
	if len(data) != 1 {
		t.Fatalf("peer saw %d payloads", len(data))
	}
	checkWire(t, data[0])
	if !strings.Contains(string(data[0]), "\r\n..leading dot\r\nbare cr and bare\r\nlf\r\nno final newline\r\n.\r\n") {
		t.Errorf("payload tail wrong: %q", data[0])
	}
	if n := strings.Count(string(data[0]), "\r\n..\r\n"); n < 2 {
		t.Errorf("dots not stuffed: %q", data[0])
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "MAIL FROM:<smuggled") {
			t.Fatalf("smuggled command reached the command channel")
		}
	}
}

func TestHostilePeers(t *testing.T) {
	tx := []step{greet, ehloPlain, mailOK, rcptOK, dataGo}
	tests := []struct {
		name   string
		script []step
		send   bool // Dial succeeds; failure is in Send
		stage  smtpvocab.Stage
		check  func(t *testing.T, err error)
	}{
		{name: "stalled greeting", script: []step{{Hang: true}}, stage: smtpvocab.StageGreeting, check: isTimeout},
		{name: "5xx greeting", script: []step{{Send: "554 5.7.1 go away\r\n"}}, stage: smtpvocab.StageGreeting, check: isCode(554)},
		{name: "421 greeting", script: []step{{Send: "421 4.3.2 busy\r\n"}}, stage: smtpvocab.StageGreeting, check: isCode(421)},
		{name: "greeting without CRLF", script: []step{{Send: "220 mx.test", Close: true}}, stage: smtpvocab.StageGreeting,
			check: func(t *testing.T, err error) {
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Errorf("err = %v, want unexpected EOF", err)
				}
			}},
		{name: "garbage code", script: []step{{Send: "999 hello\r\n"}}, stage: smtpvocab.StageGreeting, check: isProtocol},
		{name: "http server", script: []step{{Send: "HTTP/1.1 400 Bad Request\r\n"}}, stage: smtpvocab.StageGreeting, check: isProtocol},
		{name: "endless continuation", script: []step{greet, {Expect: "EHLO", Flood: "250-AAAAAAAAAAAAAAAAAAAA\r\n"}},
			stage: smtpvocab.StageEHLO, check: isProtocol},
		{name: "endless line", script: []step{greet, {Expect: "EHLO", Flood: "2222222222222222222222222"}},
			stage: smtpvocab.StageEHLO, check: isProtocol},
		{name: "dripping reply", script: []step{greet, {Expect: "EHLO", Drip: 20 * time.Millisecond,
			Send: "250-mx.test\r\n250-PIPELINING\r\n250-8BITMIME\r\n250-SIZE 100000\r\n250 ENHANCEDSTATUSCODES\r\n"}},
			stage: smtpvocab.StageEHLO, check: isTimeout},
		{name: "ehlo 421", script: []step{greet, {Expect: "EHLO", Send: "421 4.7.0 bye\r\n"}}, stage: smtpvocab.StageEHLO, check: isCode(421)},
		{name: "helo refused too", script: []step{greet, {Expect: "EHLO", Send: "502 no\r\n"}, {Expect: "HELO client.test", Send: "550 no\r\n"}},
			stage: smtpvocab.StageEHLO, check: isCode(550)},
		{name: "final dot never answered", script: append(slices.Clone(tx), step{Data: true, Hang: true}), send: true,
			stage: smtpvocab.StageEndOfData, check: isTimeout},
		{name: "421 at RCPT", script: []step{greet, ehloPlain, mailOK, {Expect: "RCPT", Send: "421 4.4.2 closing\r\n"}}, send: true,
			stage: smtpvocab.StageRCPT, check: isCode(421)},
		{name: "421 after dot", script: append(slices.Clone(tx), step{Data: true, Send: "421 4.3.0 shutting down\r\n"}), send: true,
			stage: smtpvocab.StageEndOfData, check: isCode(421)},
		{name: "250 to DATA", script: []step{greet, ehloPlain, mailOK, rcptOK, {Expect: "DATA", Send: "250 what\r\n"}}, send: true,
			stage: smtpvocab.StageDATA, check: isProtocol},
		{name: "garbage at MAIL", script: []step{greet, ehloPlain, {Expect: "MAIL", Send: "ok\r\n"}}, send: true,
			stage: smtpvocab.StageMAIL, check: isProtocol},
		{name: "silence at RCPT", script: []step{greet, ehloPlain, mailOK, {Expect: "RCPT", Hang: true}}, send: true,
			stage: smtpvocab.StageRCPT, check: isTimeout},
		{name: "close at RCPT", script: []step{greet, ehloPlain, mailOK, {Expect: "RCPT", Close: true}}, send: true,
			stage: smtpvocab.StageRCPT, check: func(t *testing.T, err error) {
				if !errors.Is(err, io.EOF) {
					t.Errorf("err = %v, want EOF", err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startPeer(t, tt.script)
			o := opts(TLSMay)
			o.GreetingTimeout, o.CommandTimeout, o.DataTimeout = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
			c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", o)
			if tt.send {
				if err != nil {
					t.Fatal(err)
				}
				var res TxResult
				res, err = c.Send(context.Background(), Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}}}, []byte("hi"))
				if _, err2 := c.Send(context.Background(), Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}}}, nil); !errors.Is(err2, net.ErrClosed) {
					t.Errorf("connection still usable after %v: %v", err, err2)
				}
				if tt.stage == smtpvocab.StageEndOfData && (res.Mail.Code != 250 || len(res.Rcpts) != 1) {
					t.Errorf("partial result lost: %+v", res)
				}
			}
			tt.check(t, stageErr(t, err, tt.stage))
		})
	}
}

func isTimeout(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("err = %v, want a timeout", err)
	}
}

func isProtocol(t *testing.T, err error) {
	t.Helper()
	var pe textproto.ProtocolError
	if !errors.As(err, &pe) {
		t.Errorf("err = %v, want a protocol error", err)
	}
}

func isCode(code int) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		var r *smtpvocab.Reply
		if !errors.As(err, &r) || r.Code != code {
			t.Errorf("err = %v, want reply %d", err, code)
		}
	}
}

func TestHELOFallbackAndDataRefused(t *testing.T) {
	p := startPeer(t, []step{greet, {Expect: "EHLO client.test", Send: "502 5.5.1 what\r\n"}, {Expect: "HELO client.test", Send: "250 mx.test\r\n"},
		mailOK, rcptOK, {Expect: "DATA", Send: "554 5.7.1 no thanks\r\n"}, {Expect: "RSET", Send: "250 ok\r\n"}, quit})
	c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSMay))
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.Extension("8BITMIME"); ok {
		t.Error("extensions after HELO")
	}
	res, err := c.Send(context.Background(), Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}}, Size: 10, EightBit: true}, []byte("hi"))
	if err != nil || res.Data == nil || res.Data.Code != 554 {
		t.Fatalf("Send = %+v, %v", res, err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	c.Quit()
	lines, _, _ := p.Received()
	if !slices.Contains(lines, "MAIL FROM:<a@x.test>") {
		t.Errorf("MAIL carried parameters the peer did not advertise: %q", lines)
	}
}

func TestLowLevelMailRcpt(t *testing.T) {
	p := startPeer(t, []step{greet, ehloPlain, {Expect: "MAIL FROM:<> SIZE=5\r\n", Send: "250 ok\r\n"},
		{Expect: "RCPT TO:<x@y.test>\r\n", Send: "550 5.1.1 unknown\r\n"}, {Expect: "RCPT TO:<z@y.test>", Send: "421 bye\r\n"}})
	c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSMay))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.Mail("", "SIZE=5"); err != nil || r.Code != 250 {
		t.Fatalf("Mail = %v, %v", r, err)
	}
	if r, err := c.Rcpt("x@y.test"); err != nil || r.Code != 550 || r.Enhanced != "5.1.1" {
		t.Fatalf("Rcpt = %v, %v", r, err)
	}
	if _, err := c.Rcpt("a\r\nDATA"); err == nil {
		t.Fatal("Rcpt sent a CRLF-injected address")
	}
	if r, err := c.Rcpt("z@y.test"); r == nil || r.Code != 421 || err == nil {
		t.Fatalf("Rcpt 421 = %v, %v", r, err)
	}
}

func TestPinnedSourceAddress(t *testing.T) {
	be, addr := startGoSMTP(t, nil)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	c, err := Dial(context.Background(), d, addr, "mx.test", opts(TLSMay))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.LocalAddr().Addr(); got != netip.MustParseAddr("127.0.0.2") {
		t.Errorf("LocalAddr = %v", got)
	}
	if c.RemoteAddr() != addr {
		t.Errorf("RemoteAddr = %v, want %v", c.RemoteAddr(), addr)
	}
	if _, err := c.Send(context.Background(), Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "ok@y.test"}}}, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	msgs, _ := be.snapshot()
	if ap := netip.MustParseAddr(msgs[0].Client).Unmap(); ap != netip.MustParseAddr("127.0.0.2") {
		t.Errorf("peer saw connection from %v, want 127.0.0.2", ap)
	}
}

func TestContextAndDialErrors(t *testing.T) {
	p := startPeer(t, []step{{Hang: true}})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	o := opts(TLSMay)
	o.GreetingTimeout = 10 * time.Second
	_, err := Dial(ctx, nil, p.Addr(), "mx.test", o)
	if e := stageErr(t, err, smtpvocab.StageGreeting); !errors.Is(e, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	_, err = Dial(context.Background(), nil, closed, "", opts(TLSMay))
	stageErr(t, err, smtpvocab.StageConnect)

	for _, o := range []Options{{Hostname: ""}, {Hostname: "a b"}, {Hostname: "x\r\n"}, {Hostname: "ok.test", TLS: "maybe"}} {
		if _, err := Dial(context.Background(), nil, closed, "", o); err == nil || errors.As(err, new(*Error)) {
			t.Errorf("Dial(%+v) err = %v, want an options error", o, err)
		}
	}
	c := &Client{closed: true}
	if _, err := c.Send(context.Background(), Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}}}, nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send on closed client: %v", err)
	}
}

func TestSendRejectsBadEnvelope(t *testing.T) {
	p := startPeer(t, []step{greet, {Expect: "EHLO", Send: "250-mx.test\r\n250 DSN\r\n"}, quit})
	c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", opts(TLSMay))
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range []Envelope{
		{From: "a\r\nRCPT TO:<x@y>", Rcpts: []Rcpt{{Addr: "b@y.test"}}},
		{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}, {Addr: "c\x00@y.test"}}},
		{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test", Notify: "ALWAYS"}}},
		{From: "a@x.test", RET: "ALL", Rcpts: []Rcpt{{Addr: "b@y.test"}}},
		{From: strings.Repeat("a", 1000) + "@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}}},
	} {
		if _, err := c.Send(context.Background(), env, nil); err == nil || errors.As(err, new(*Error)) {
			t.Errorf("Send(%.40q) err = %v, want a plain envelope error", env.From, err)
		}
	}
	c.Quit()
	lines, _, _ := p.Received()
	if len(lines) != 2 { // EHLO and QUIT only
		t.Errorf("bad envelopes reached the wire: %q", lines)
	}
}

// TestResetQuitContext: RSET and QUIT to a peer that never answers end
// when the context does (cancelled, or a short deadline), not after the
// command timeout, and leave the connection closed.
func TestResetQuitContext(t *testing.T) {
	for _, tt := range []struct {
		name string
		verb string
		call func(c *Client, ctx context.Context) error
		ctx  func() (context.Context, context.CancelFunc)
		want []error // any of these
	}{
		{"reset cancelled", "RSET", (*Client).ResetContext, cancelSoon, []error{context.Canceled}},
		{"quit cancelled", "QUIT", (*Client).QuitContext, cancelSoon, []error{context.Canceled}},
		{"quit deadline", "QUIT", (*Client).QuitContext, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, []error{context.DeadlineExceeded, os.ErrDeadlineExceeded}}, // the context's or the connection's
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startPeer(t, []step{greet, ehloPlain, {Expect: tt.verb, Hang: true}})
			o := opts(TLSNone)
			o.CommandTimeout = time.Minute
			c, err := Dial(context.Background(), nil, p.Addr(), "mx.test", o)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := tt.ctx()
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tt.call(c, ctx) }()
			select {
			case err := <-done:
				if !slices.ContainsFunc(tt.want, func(w error) bool { return errors.Is(err, w) }) {
					t.Errorf("err = %v, want %v", err, tt.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s still waiting 10s after the context ended (command timeout %v)", tt.verb, o.CommandTimeout)
			}
			if _, err := c.Send(context.Background(), Envelope{From: "a@x.test", Rcpts: []Rcpt{{Addr: "b@y.test"}}}, nil); !errors.Is(err, net.ErrClosed) {
				t.Errorf("connection still open after an interrupted %s: %v", tt.verb, err)
			}
		})
	}
}

// cancelSoon is a context cancelled 50ms from now.
func cancelSoon() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	return ctx, cancel
}
