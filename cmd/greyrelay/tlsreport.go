package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/address"
	"github.com/greyrelay/greyrelay/relay/admin/admincli"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

// queueReports enqueues mailed reports. They are marked as DSNs so that
// an undeliverable report is dropped rather than bounced to our own
// reporting address.
type queueReports struct{ q *queue.Queue }

// EnqueueReport implements tlsrpt.Enqueuer.
func (r queueReports) EnqueueReport(m tlsrpt.Mail) error {
	nm := queue.NewMessage{From: m.From, Body: m.Body, Arrival: time.Now(), DSN: true}
	for _, to := range m.To {
		_, dom, _ := strings.Cut(to, "@")
		nm.To = append(nm.To, queue.NewRecipient{Addr: to, Domain: address.DomainKey(dom)})
	}
	_, err := r.q.Enqueue(nm)
	return err
}

// newTLSReports builds the TLS reporting of cfg, or nil when it is off.
func newTLSReports(cfg *config.Config, router *mx.Router, q *queue.Queue, log *zap.Logger) (*tlsrpt.Reporter, error) {
	t := cfg.TLSReporting
	if !t.Enabled {
		return nil, nil
	}
	roots, err := tlspolicy.Roots(cfg.Delivery.TLSCAFile)
	if err != nil {
		return nil, errors.New("delivery." + err.Error())
	}
	sub := tlsrpt.Submitter{Organization: t.Organization, Contact: t.Contact, Host: cfg.Hostname}
	if sub.Organization == "" {
		sub.Organization = cfg.Hostname
	}
	if sub.Contact == "" {
		sub.Contact = cfg.Postmaster
	}
	if sub.Contact == "" {
		sub.Contact = "postmaster@" + cfg.Hostname
	}
	from := t.From
	if from == "" {
		from = "noreply-tlsrpt@" + cfg.Hostname
	}
	// RFC 8460 §5.2: the POST goes to the rua as published, over TLS
	// verified with the relay's roots, bounded in time; no redirects.
	hc := &http.Client{Timeout: t.Timeout,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, Proxy: nil,
			DialContext:       (&tlsrpt.Dialer{Resolver: router.Resolver, AllowPrivate: t.AllowPrivateRUA}).DialContext,
			DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	r := &tlsrpt.Reporter{Agg: tlsrpt.NewAggregator(), Log: log, Store: q.Store(tlsrpt.StoreName), Now: time.Now, Sender: &tlsrpt.Sender{
		Submitter: sub, From: from, TXT: router.Resolver, Queue: queueReports{q}, HTTP: hc, Rand: rand.Reader}}
	if err := r.Load(); err != nil {
		return nil, err
	}
	return r, nil
}

// tlsReportFunc is the admin API's POST /api/tls-report/send.
func tlsReportFunc(r *tlsrpt.Reporter) func(context.Context) (any, error) {
	return func(ctx context.Context) (any, error) {
		res := r.Send(ctx, true)
		if res == nil {
			res = []tlsrpt.Result{}
		}
		return res, nil
	}
}

// tlsReportCmd runs `greyrelay tls-report send`.
func tlsReportCmd(args []string, stdout, stderr io.Writer) error {
	c, rest, err := clientFor(args, stderr)
	if err != nil {
		return err
	}
	if len(rest) != 1 || rest[0] != "send" {
		return &exitError{2, errors.New("usage: greyrelay tls-report send [-config FILE]")}
	}
	return admincli.RunTLSReport(rest, c, stdout)
}
