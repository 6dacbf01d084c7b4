package delivery

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
)

// authenticatedPolicy says every MX host is reached over TLS it
// authenticates, as DANE or MTA-STS would; the fake MX's self-signed
// certificate is accepted.
type authenticatedPolicy struct{}

func (authenticatedPolicy) Decide(_ context.Context, domain string, hosts []string) tlspolicy.Decision {
	d := tlspolicy.Decision{Domain: domain, Hosts: map[string]tlspolicy.Rule{}}
	for _, h := range hosts {
		d.Hosts[strings.ToLower(h)] = tlspolicy.Rule{Label: tlspolicy.LabelDANE, Mode: smtpclient.TLSEncrypt,
			Config: &tls.Config{InsecureSkipVerify: true}, Authenticated: true}
	}
	return d
}

// A REQUIRETLS message whose first, authenticated MX does not offer
// REQUIRETLS goes to the next MX, which does (RFC 8689 §4.2.1), with
// REQUIRETLS on its MAIL; the first never sees a MAIL.
// Hosts passed over this way do not count against
// delivery.mx_session_limit (here 1): the third MX is reached.
func TestRequireTLSNextMX(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) { c.Delivery.MXSessionLimit = 1 })
	h.dns.MX("rt.test", 10, "mx1.rt.test").MX("rt.test", 20, "mx2.rt.test").MX("rt.test", 30, "mx3.rt.test").
		A("mx1.rt.test", "127.0.0.73").A("mx2.rt.test", "127.0.0.77").A("mx3.rt.test", "127.0.0.74")
	cfg := &tls.Config{Certificates: []tls.Certificate{testCert(t, "mx.rt.test")}}
	first := startMX(t, "127.0.0.73", h.port, fakeOpt{tls: cfg})
	startMX(t, "127.0.0.77", h.port, fakeOpt{tls: cfg})
	second := startMX(t, "127.0.0.74", h.port, fakeOpt{tls: cfg, requireTLS: true})
	id := h.enqueueMsg(queue.NewMessage{From: "s@sender.test", RequireTLS: true,
		Body: []byte("Subject: rt\r\n\r\nbody\r\n")}, "u@rt.test")
	h.start(func(o *Options) { o.TLSPolicy = authenticatedPolicy{} })
	eventually(t, wait, "delivered", func() bool { return h.gone(id) })
	if txs := first.transactions(); len(txs) != 0 {
		t.Errorf("the MX without REQUIRETLS saw %d transactions, want none", len(txs))
	}
	got := second.delivered()
	if len(got) != 1 || !got[0].requireTLS {
		t.Fatalf("the MX with REQUIRETLS got %+v, want one transaction with REQUIRETLS", got)
	}
	if len(h.dsns()) != 0 {
		t.Errorf("a DSN was sent for a delivered message")
	}
}

// When no MX offers REQUIRETLS the message bounces with 5.7.30, and the
// bounce returns the headers only although RET=FULL was asked, and is
// itself sent with REQUIRETLS (RFC 8689 §5).
func TestRequireTLSBounce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.dns.MX("nort.test", 10, "mx1.nort.test").MX("nort.test", 20, "mx2.nort.test").
		A("mx1.nort.test", "127.0.0.75").A("mx2.nort.test", "127.0.0.76")
	cfg := &tls.Config{Certificates: []tls.Certificate{testCert(t, "mx.nort.test")}}
	startMX(t, "127.0.0.75", h.port, fakeOpt{tls: cfg})
	startMX(t, "127.0.0.76", h.port, fakeOpt{tls: cfg})
	h.sink.srv.TLSConfig = cfg
	h.sink.srv.EnableREQUIRETLS = true
	const secret = "the secret body line"
	id := h.enqueueMsg(queue.NewMessage{From: "s@sender.test", RequireTLS: true, RET: "FULL",
		Body: []byte("Subject: rt\r\n\r\n" + secret + "\r\n")}, "u@nort.test")
	h.start(func(o *Options) { o.TLSPolicy = authenticatedPolicy{} })
	eventually(t, wait, "bounced", func() bool { return h.gone(id) && len(h.dsns()) == 1 })
	d := h.dsns()[0]
	if !strings.Contains(d.data, "5.7.30") || !strings.Contains(d.data, "Subject: rt") {
		t.Errorf("bounce lacks 5.7.30 or the original headers:\n%s", d.data)
	}
	if strings.Contains(d.data, secret) {
		t.Errorf("bounce of a REQUIRETLS message returned its body:\n%s", d.data)
	}
	if !d.requireTLS {
		t.Errorf("bounce of a REQUIRETLS message was sent without REQUIRETLS")
	}
}
