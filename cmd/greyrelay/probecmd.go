package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/probe"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
)

// knownTimeout bounds the CLI probe's questions to the running relay.
const knownTimeout = 10 * time.Second

// probeOptions builds a probe on the relay's own configuration: the same
// router and resolver, pinned source addresses, HELO name, TLS policies
// and classifier rules as delivery, so the probe sees what delivery sees.
// known answers step 5 (what the relay knows about the destination).
func probeOptions(cfg *config.Config, known func(context.Context, string) (*probe.Knowledge, error), cache tlspolicy.Cache) (probe.Options, error) {
	cl, err := classifier.New(cfg.Retry.Rules)
	if err != nil {
		return probe.Options{}, err
	}
	router, err := newRouter(cfg)
	if err != nil {
		return probe.Options{}, err
	}
	// Equal MX preferences are shuffled by the relay; the probe visits
	// them all anyway, in a stable order so that reports compare.
	router.Shuffle = nil
	d4, d6, err := dialers(cfg.Delivery)
	if err != nil {
		return probe.Options{}, err
	}
	d := cfg.Delivery
	policy, err := newTLSPolicy(cfg, router, cache)
	if err != nil {
		return probe.Options{}, err
	}
	opt := probe.Options{
		Hostname: cfg.Hostname, Sender: cfg.Probe.Sender, DNSBL: cfg.Probe.DNSBL,
		Router: router, Dialer4: d4, Dialer6: d6, SourceIPv4: d.SourceIPv4, SourceIPv6: d.SourceIPv6,
		TLS: smtpclient.TLSPolicy(d.TLS), SmarthostTLS: smtpclient.TLSPolicy(d.Smarthost.TLS), TLSConfig: &tls.Config{},
		Username: d.Smarthost.Username, Password: d.Smarthost.Password,
		ConnectTimeout: d.ConnectTimeout, GreetingTimeout: d.GreetingTimeout, CommandTimeout: d.CommandTimeout,
		Classifier: cl, Known: known, Now: time.Now,
	}
	if policy != nil {
		opt.TLSPolicy = policy // a nil *Checker in the interface would not be nil
	}
	return opt, nil
}

// memoryCache keeps MTA-STS policies for one probe run.
type memoryCache struct{ m map[string][]byte }

func (c *memoryCache) Get(domain string) ([]byte, error) { return c.m[domain], nil }

func (c *memoryCache) Put(domain string, v []byte) error {
	if c.m == nil {
		c.m = map[string][]byte{}
	}
	c.m[domain] = v
	return nil
}

func (c *memoryCache) Keys() ([]string, error) {
	var out []string
	for d := range c.m {
		out = append(out, d)
	}
	return out, nil
}

// probeFunc is handed to the admin server so the status page can probe.
// The daemon holds q, so step 5 reads it directly.
func probeFunc(cfg *config.Config, q *queue.Queue) func(ctx context.Context, target string) (any, error) {
	known := probe.QueueKnown(q, time.Now)
	return func(ctx context.Context, target string) (any, error) {
		opt, err := probeOptions(cfg, known, q.Store(tlspolicy.StoreName))
		if err != nil {
			return nil, err
		}
		rep, err := probe.Run(ctx, target, opt)
		if err != nil {
			return nil, err
		}
		return rep, nil
	}
}

// probeCmd runs `greyrelay probe [-config FILE] [-json] [-from SENDER] ADDRESS|DOMAIN`.
// Exit status: 0 the path accepts the recipient, 1 it defers, 2 it refuses
// or cannot be reached (and 2 for usage errors).
func probeCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "configuration file (default: the embedded default)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	from := fs.String("from", "", "sender address: MAIL FROM of the probe, and check SPF, DKIM and DMARC of its domain")
	var targets []string
	for {
		if err := fs.Parse(args); err != nil {
			return &exitError{2, err}
		}
		if fs.NArg() == 0 {
			break
		}
		// Flags may also follow the target.
		targets, args = append(targets, fs.Arg(0)), fs.Args()[1:]
	}
	if len(targets) != 1 {
		return &exitError{2, errors.New("usage: greyrelay probe [-config FILE] [-json] [-from SENDER] ADDRESS|DOMAIN")}
	}
	cfg, _, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	// The daemon holds the queue file's lock: ask it over its admin API.
	api := adminclient.New(cfg)
	api.HTTP = &http.Client{Timeout: knownTimeout}
	// The running relay holds the queue database: the CLI probe keeps the
	// MTA-STS policies it fetches in memory.
	opt, err := probeOptions(cfg, probe.AdminKnown(api), &memoryCache{})
	if err != nil {
		return &exitError{2, err}
	}
	if *from != "" {
		if opt.DKIM, err = dkimKeys(cfg.DKIM); err != nil {
			return &exitError{2, err}
		}
		opt.Sender, opt.From = *from, *from
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rep, err := probe.Run(ctx, targets[0], opt)
	if err != nil {
		return &exitError{2, err}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if rep.ExitCode != 0 {
		return &exitError{rep.ExitCode, fmt.Errorf("probe %s: %s", rep.Target, rep.Verdict)}
	}
	return nil
}
