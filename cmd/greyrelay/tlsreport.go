package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin/admincli"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

// tlsReports counts TLS sessions and sends the reports (RFC 8460).
type tlsReports struct {
	agg    *tlsrpt.Aggregator
	sender *tlsrpt.Sender
	store  tlsrpt.Store // the queue database: counts and reports owed survive a restart
	log    *zap.Logger
	mu     sync.Mutex    // one send at a time: the daily one or the operator's
	owed   []tlsrpt.Owed // reports not yet delivered everywhere; under mu
}

// queueReports enqueues mailed reports. They are marked as DSNs so that
// an undeliverable report is dropped rather than bounced to our own
// reporting address.
type queueReports struct{ q *queue.Queue }

// EnqueueReport implements tlsrpt.Enqueuer.
func (r queueReports) EnqueueReport(m tlsrpt.Mail) error {
	nm := queue.NewMessage{From: m.From, Body: m.Body, Arrival: time.Now(), DSN: true}
	for _, to := range m.To {
		_, dom, _ := strings.Cut(to, "@")
		nm.To = append(nm.To, queue.NewRecipient{Addr: to, Domain: strings.ToLower(dom)})
	}
	_, err := r.q.Enqueue(nm)
	return err
}

// newTLSReports builds the TLS reporting of cfg, or nil when it is off.
func newTLSReports(cfg *config.Config, router *mx.Router, q *queue.Queue, log *zap.Logger) (*tlsReports, error) {
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
	r := &tlsReports{agg: tlsrpt.NewAggregator(), log: log, store: q, sender: &tlsrpt.Sender{
		Submitter: sub, From: from, TXT: router.Resolver, Queue: queueReports{q}, HTTP: hc, Rand: rand.Reader}}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

// load reads the counts and the reports owed that the last run saved.
func (r *tlsReports) load() error {
	if err := r.agg.Load(r.store); err != nil {
		return err
	}
	owed, err := tlsrpt.LoadOwed(r.store)
	r.owed = owed
	return err
}

// save stores the counts (when they changed); it runs every minute and
// once more after the delivery engine stopped.
func (r *tlsReports) save() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.agg.Save(r.store); err != nil {
		r.log.Warn("TLS report counts not saved", zap.Error(err))
	}
}

// send sends the reports of the finished days, or of everything counted
// when all is set, and tries again the reports owed whose time has come.
// The reports still owed are saved before the counts they were taken
// from are dropped from the store: a crash in between sends a report
// twice rather than never.
func (r *tlsReports) send(ctx context.Context, all bool) []tlsrpt.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	res, owed := r.sender.Deliver(ctx, r.agg.Take(now, all), r.owed, now)
	r.owed = owed
	for _, x := range res {
		r.log.Info("TLS report", zap.String("domain", x.Domain), zap.Strings("sent", x.Sent), zap.Strings("errors", x.Errors))
	}
	if len(res) == 0 {
		return res
	}
	if err := tlsrpt.SaveOwed(r.store, owed); err != nil {
		r.log.Warn("TLS reports owed not saved", zap.Error(err))
	}
	if err := r.agg.Save(r.store); err != nil {
		r.log.Warn("TLS report counts not saved", zap.Error(err))
	}
	return res
}

// reportTick is how often counts are saved and due reports are sent: Take
// hands out only finished days, so a day's report leaves within a tick
// of midnight UTC.
const reportTick = time.Minute

// run saves the counts and sends the reports that are due, every
// reportTick until ctx ends.
func (r *tlsReports) run(ctx context.Context) {
	t := time.NewTicker(reportTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.send(ctx, false)
			r.save()
		}
	}
}

// adminFunc is the admin API's POST /api/tls-report/send.
func (r *tlsReports) adminFunc() func(context.Context) (any, error) {
	return func(ctx context.Context) (any, error) {
		res := r.send(ctx, true)
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
