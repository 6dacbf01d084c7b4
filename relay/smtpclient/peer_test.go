package smtpclient

import (
	"crypto/tls"
	"crypto/x509"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// testCert is a self-signed certificate for "mx.test" and 127.0.0.1, and a
// pool that trusts it.
var testCert = sync.OnceValues(func() (tls.Certificate, *x509.CertPool) {
	pair, pool, err := relaytest.SelfSigned("mx.test", "127.0.0.1")
	if err != nil {
		panic(err)
	}
	return pair, pool
})

func serverTLS() *tls.Config {
	cert, _ := testCert()
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}

// step is one move of a transcript peer.
type step = relaytest.Step

// startPeer starts a relaytest.Peer on 127.0.0.1: connection i follows
// scripts[i]; a step with TLS set presents testCert.
func startPeer(t *testing.T, scripts ...[]step) *relaytest.Peer {
	t.Helper()
	return relaytest.StartPeer(t, "127.0.0.1:0", relaytest.PeerOptions{TLS: serverTLS()}, scripts...)
}

// Script fragments.
var (
	greet       = step{Send: "220 mx.test ESMTP\r\n"}
	ehloPlain   = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250-8BITMIME\r\n250 SIZE 100000\r\n"}
	ehloTLS     = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250 STARTTLS\r\n"}
	ehloPipe    = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250-8BITMIME\r\n250 PIPELINING\r\n"}
	ehloChunk   = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250-PIPELINING\r\n250 CHUNKING\r\n"}
	ehloChunk1  = step{Expect: "EHLO client.test", Send: "250-mx.test\r\n250 CHUNKING\r\n"} // without PIPELINING
	mailOK      = step{Expect: "MAIL FROM:", Send: "250 2.1.0 ok\r\n"}
	rcptOK      = step{Expect: "RCPT TO:", Send: "250 2.1.5 ok\r\n"}
	dataGo      = step{Expect: "DATA", Send: "354 go ahead\r\n"}
	dataDone    = step{Data: true, Send: "250 2.0.0 queued\r\n"}
	quit        = step{Expect: "QUIT", Send: "221 bye\r\n"}
	plainScript = []step{greet, ehloPlain, quit}
)

// msg is a transaction seen by the go-smtp fake MX.
type msg = relaytest.Tx

// backend is a go-smtp fake MX for realistic dialogues. Recipients whose
// local part starts with "temp" get 450, with "perm" 550; AUTH PLAIN
// takes user "user" with password "secret".
type backend struct{ *relaytest.FakeMX }

// snapshot returns the transactions and the AUTH attempts so far.
func (b backend) snapshot() ([]msg, []string) { return b.Transactions(), b.Auths() }

// startGoSMTP runs a go-smtp fake MX on 127.0.0.1; configure adjusts it.
func startGoSMTP(t *testing.T, configure func(*smtp.Server)) (backend, netip.AddrPort) {
	t.Helper()
	f := relaytest.StartMX(t, "127.0.0.1:0", relaytest.MXOptions{
		Users: map[string]string{"user": "secret"},
		Script: relaytest.Script{Rcpt: func(_ int, to string) error {
			switch {
			case strings.HasPrefix(to, "temp"):
				return relaytest.Reply("450 4.2.0 greylisted")
			case strings.HasPrefix(to, "perm"):
				return relaytest.Reply("550 5.1.1 no such user")
			}
			return nil
		}},
		Configure: func(s *smtp.Server) {
			s.ReadTimeout, s.WriteTimeout = 2*time.Second, 2*time.Second
			s.MaxMessageBytes, s.MaxRecipients = 1<<20, 50
			if configure != nil {
				configure(s)
			}
		},
	})
	return backend{f}, f.Addr()
}

// opts returns client options with short timeouts.
func opts(policy TLSPolicy) Options {
	return Options{Hostname: "client.test", TLS: policy,
		ConnectTimeout: time.Second, GreetingTimeout: time.Second, CommandTimeout: time.Second, DataTimeout: time.Second}
}
