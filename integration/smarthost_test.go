package integration

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"mime"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestRobustPostfixSmarthost: greyrelay as Postfix's relayhost. An application
// submits 200 messages to a private Postfix whose relayhost is greyrelay
// (submission listener, STARTTLS required by Postfix with
// smtp_tls_security_level = encrypt, SASL PLAIN with a credential made by
// `greyrelay user add` that may send only as @app.test or <>): 180 over
// SMTP, 20 through Postfix's sendmail to a domain its transport map sends
// to the error transport, so Postfix bounces those itself and relays the
// bounces, with MAIL FROM:<>, through greyrelay. greyrelay delivers to a second Postfix
// (the destination), which hands everything to a sink.
//
// Every message arrives exactly once (no duplicates in normal operation),
// byte-identical apart from Received header fields, compared through
// a Message-ID → hash map, with exactly one Received field added by
// greyrelay (saying ESMTPSA: TLS and AUTH). Every bounce arrives once, from
// <>, to the original sender, whole (its MIME structure ends with the
// closing boundary) and names the bounced message.
func TestRobustPostfixSmarthost(t *testing.T) {
	peers.Require(t, "postfix")
	t.Parallel()
	const regular, bounced = 180, 20
	sinkIP, destIP, relayIP, clientIP, appIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)

	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{})
	dest := peers.StartPostfix(t, peers.PostfixConfig{
		Listen: peers.FreeAddr(t, destIP), Hostname: "mx.dest.test",
		RelayDomains: []string{"dest.test", "app.test"}, DeliverTo: sink.Addr,
	})
	cert := peers.NewCert(t, "relay.test", relayIP)
	cfg := rbRelay{IP: relayIP, Trusted: []string{"127.0.0.1/32"},
		Listeners: []rbListener{{Mode: "submission", Cert: cert}},
		UsersFile: rbUsersFile(t, "smarthost", "s3cret-Pass", "@app.test,<>"),
		Routes:    map[string]string{"dest.test": dest.Listen, "app.test": dest.Listen},
		Delivery:  map[string]string{"tls": "may"}}
	r := peers.StartRelay(t, cfg.YAML(t))
	_, relayPort, _ := net.SplitHostPort(r.SMTPAddr)
	client := peers.StartPostfix(t, peers.PostfixConfig{
		Listen: peers.FreeAddr(t, clientIP), Hostname: "client.app.test",
		RelayHost: "[" + relayIP + "]:" + relayPort, SASLUser: "smarthost", SASLPassword: "s3cret-Pass", TLSLevel: "encrypt",
		Main: map[string]string{"transport_maps": "inline:{ {nosuch.test = error:5.1.1 mailbox unavailable} }"},
	})

	// The application: one SMTP session into the client Postfix.
	rng := rand.New(rand.NewPCG(1, 1))
	want := map[string]rbSent{} // regular messages by Message-ID
	bounceFor := map[string]string{}
	app, err := rbDialSMTP(client.Listen, appIP, false, "app.test")
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	for i := range regular + bounced {
		id := fmt.Sprintf("m%03d@app.test", i)
		// The application's own From: the smarthost user may send only as
		// @app.test, in the envelope and in the header (a From of another
		// domain would be refused after DATA).
		data := bytes.Replace(rbMessage(id, "smarthost "+id, 300+rng.IntN(6000), rng),
			[]byte("From: <sender@src.test>"), []byte("From: <app@app.test>"), 1)
		from := "app@app.test"
		rcpts := []string{fmt.Sprintf("user%d@dest.test", i)}
		if i%9 == 0 {
			rcpts = append(rcpts, fmt.Sprintf("other%d@dest.test", i))
		}
		if i >= regular {
			// Through sendmail (pickup), as a local program would: Postfix's
			// smtpd would refuse a recipient of the error transport at RCPT.
			from = fmt.Sprintf("app+%d@app.test", i)
			bounceFor[from] = id
			client.Sendmail(t, from, []string{fmt.Sprintf("user%d@nosuch.test", i)}, data)
			continue
		}
		want[id] = rbSent{id: id, rcpts: rcpts, hash: rbHash(data)}
		if rep, err := app.Send(rbTx{From: from, Rcpts: rcpts, Data: data}); err != nil || rep.Code != 250 {
			t.Fatalf("submitting %s to Postfix: %v %v", id, rep, err)
		}
	}

	sink.WaitFor(t, regular+bounced, 120*time.Second)
	client.WaitQueueEmpty(t, 20*time.Second)
	dest.WaitQueueEmpty(t, 20*time.Second)
	rbWaitUntil(t, 20*time.Second, "an empty relay queue", func() bool { return rbStats(t, r).Messages == 0 })
	msgs := sink.Messages()
	if len(msgs) != regular+bounced {
		t.Errorf("the sink received %d messages, want %d", len(msgs), regular+bounced)
	}

	seen := map[string]int{}
	bounces := map[string]int{}
	for _, m := range msgs {
		rcv := rbReceivedFields(m.Data)
		ours := 0
		for _, f := range rcv {
			if strings.Contains(f, "(greyrelay)") {
				ours++
				if !strings.Contains(f, "with ESMTPSA") {
					t.Errorf("greyrelay's Received field does not say ESMTPSA (TLS and AUTH): %q", f)
				}
			}
		}
		if ours != 1 {
			t.Errorf("%d Received fields by greyrelay, want 1:\n%s", ours, strings.Join(rcv, ""))
		}
		if m.From == "" {
			rbCheckBounce(t, m, bounceFor, bounces)
			continue
		}
		id := rbMessageID(m.Data)
		w, ok := want[id]
		if !ok {
			t.Errorf("unexpected message %q from %q", id, m.From)
			continue
		}
		seen[id]++
		if got := rbHash(rbStripReceived(m.Data)); got != w.hash {
			t.Errorf("%s arrived altered:\n%s", id, rbDiffHint(m.Data))
		}
		if m.From != "app@app.test" || !slices.Equal(slices.Sorted(slices.Values(m.Rcpts)), slices.Sorted(slices.Values(w.rcpts))) {
			t.Errorf("%s: envelope %q → %v, want app@app.test → %v", id, m.From, m.Rcpts, w.rcpts)
		}
	}
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("%s arrived %d times, want once", id, seen[id])
		}
	}
	for from := range bounceFor {
		if bounces[from] != 1 {
			t.Errorf("the bounce to %s arrived %d times, want once", from, bounces[from])
		}
	}
	if t.Failed() {
		t.Logf("client Postfix queue:\n%s", client.Queue(t))
	}
}

// rbCheckBounce checks one of Postfix's own bounces as the sink got it.
func rbCheckBounce(t *testing.T, m peers.Received, bounceFor map[string]string, count map[string]int) {
	t.Helper()
	if len(m.Rcpts) != 1 || bounceFor[m.Rcpts[0]] == "" {
		t.Errorf("a null-sender message to %v, which is no bouncing sender", m.Rcpts)
		return
	}
	count[m.Rcpts[0]]++
	orig := bounceFor[m.Rcpts[0]]
	if !bytes.Contains(m.Data, []byte("<"+orig+">")) {
		t.Errorf("the bounce to %s does not name %s", m.Rcpts[0], orig)
	}
	var ct string
	for _, f := range rbHeaderFields(m.Data) {
		if name, v, _ := strings.Cut(f, ":"); strings.EqualFold(name, "Content-Type") {
			ct = strings.TrimSpace(v)
		}
	}
	mt, params, err := mime.ParseMediaType(strings.ReplaceAll(ct, "\r\n", ""))
	if err != nil || mt != "multipart/report" || params["boundary"] == "" {
		t.Errorf("the bounce to %s has Content-Type %q (%v), want multipart/report", m.Rcpts[0], ct, err)
		return
	}
	if end := "--" + params["boundary"] + "--\r\n"; !bytes.HasSuffix(m.Data, []byte(end)) {
		t.Errorf("the bounce to %s does not end with its closing boundary %q: truncated?", m.Rcpts[0], end)
	}
}

// rbDiffHint shows the header section of an altered message.
func rbDiffHint(data []byte) string {
	if i := bytes.Index(data, []byte("\r\n\r\n")); i >= 0 {
		return string(data[:i])
	}
	return string(data[:min(len(data), 500)])
}
