package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/logrepeat"
	"github.com/greyrelay/greyrelay/internal/logtime"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
	"github.com/greyrelay/greyrelay/relay/cluster"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/delivery"
	"github.com/greyrelay/greyrelay/relay/dkim"
	"github.com/greyrelay/greyrelay/relay/events"
	"github.com/greyrelay/greyrelay/relay/metrics"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/sendapi"
	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/smtpd"
	"github.com/greyrelay/greyrelay/relay/suppress"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

// serve runs the relay until SIGTERM or SIGINT. SIGHUP re-reads the DKIM
// keys (reloadDKIM), users_file and api.tokens_file (watchDirectory) and
// suppression.imports (watchImports).
func serve(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "configuration file (default: the embedded default)")
	check := fs.Bool("check-queue", false, "decode every queue record at start and quarantine damaged ones (after a disk problem)")
	if err := fs.Parse(args); err != nil {
		return &exitError{2, err}
	}
	cfg, choice, err := loadConfig(*path, nil)
	if err != nil {
		fmt.Fprintln(stderr, "greyrelay:", choice) // no logger yet: the error names the file it read
		return err
	}
	log, err := newLogger(cfg.Log)
	if err != nil {
		return &exitError{2, err}
	}
	defer log.Sync()
	log.Info(choice.String(), zap.String("config", displayName(choice.path)))
	for _, w := range cfg.Warnings() {
		log.Warn("configuration: "+w, zap.String("config", displayName(choice.path)))
	}
	tuneGC()
	tuneProcs()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	keys, err := dkimKeys(cfg.DKIM)
	if err != nil {
		return &exitError{2, err}
	}
	signer := dkim.NewSigner(keys)
	// Registered before the relay starts: Go's default for SIGHUP is to
	// end the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go reloadDKIM(ctx, hup, choice.path, signer, log)
	go warnUnresolvedHostname(ctx, cfg, log)
	err = runRelay(ctx, cfg, log, *check, signer)
	var damaged *queue.DamagedError
	if errors.As(err, &damaged) {
		log.Error("queue file damaged: stopping", zap.Error(damaged))
		return &exitError{exitDamaged, err}
	}
	return err
}

// warnUnresolvedHostname logs a warning when the hostname does not
// resolve (config.UnresolvedHostname). It runs beside the start, so that
// a slow resolver delays nothing; a stop before the answer says nothing.
func warnUnresolvedHostname(ctx context.Context, cfg *config.Config, log *zap.Logger) {
	lookup, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if w := cfg.UnresolvedHostname(lookup, net.DefaultResolver.LookupHost); w != "" && ctx.Err() == nil {
		log.Warn("configuration: " + w)
	}
}

// exitDamaged is serve's exit status when the queue file is damaged:
// starting again cannot help (the unit's RestartPreventExitStatus), the
// operator salvages the file (greyrelay queue salvage).
const exitDamaged = 3

// defaultGCPercent replaces Go's GOGC=100 unless GOGC is set. The relay's
// live heap is small (tens of MB: bodies of 256 KiB and more are spooled,
// smaller ones are pooled), so at 100 the collector ran several times a
// second under load and took about a tenth of the CPU. 200 gets most of
// the gain; higher values gain a little more throughput but bring a
// 1,000,000-recipient queue's peak RSS too close to the 512 MB it is held
// under (figures in BENCHMARKS.md, "Tuning"). GOMEMLIMIT, if set, still
// caps the heap.
const defaultGCPercent = 200

func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
}

// extraProcs is how many more Ps (GOMAXPROCS) the relay runs than Go's
// default (the CPUs it may use). The journal's and the database's
// writers spend much of their time in blocking fdatasync and pwrite
// calls; a P held by a thread blocked in the kernel runs nothing until
// the runtime's monitor takes it back (tens of microseconds each time, a
// thousand times a second), and with two CPUs that left half the Ps idle
// when the sessions had work. Two more Ps keep the CPUs busy through it,
// and more than two gain nothing (figures in BENCHMARKS.md, "Tuning").
// The number of writers
// blocking at once does not grow with the machine, so neither does this.
const extraProcs = 2

// tuneProcs raises GOMAXPROCS by extraProcs unless GOMAXPROCS is set. Go's
// own default already follows a container's CPU limit.
func tuneProcs() {
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + extraProcs)
	}
}

func newLogger(c config.Log) (*zap.Logger, error) {
	zc := zap.NewProductionConfig()
	zc.Encoding = c.Format
	zc.Sampling = nil // a delivery log must not drop lines
	// No "caller" field: a source location means nothing to an operator,
	// and finding it walks the stack for every line.
	zc.DisableCaller = true
	// Nor a stack trace per error: on a full disk every worker fails
	// the same way, and the traces would fill the log's disk too.
	zc.DisableStacktrace = true
	zc.EncoderConfig.TimeKey = "time"
	zc.EncoderConfig.EncodeTime = logtime.ISO8601 // zapcore.ISO8601TimeEncoder's output, faster
	if c.Format == "console" {
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
	}
	lvl, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, err
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	// A warning or error that repeats is written once a minute, with the
	// number of lines like it left out (internal/logrepeat).
	return zc.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return logrepeat.Wrap(c, time.Minute) }))
}

// relayParts is everything runRelay starts, kept together so that the
// shutdown order is written once.
type relayParts struct {
	queue  *queue.Queue
	smtp   *smtpd.Server
	engine *delivery.Engine
	admin  *admin.Server
	api    *sendapi.Server    // nil without api.address
	policy *tlspolicy.Checker // nil without DANE and MTA-STS
	report *tlsrpt.Reporter   // nil without tls_reporting
	charts *chartKeeper
}

// runRelay runs the relay until ctx ends. checkQueue makes the queue
// decode every record at start (queue.Options.FullScan).
func runRelay(ctx context.Context, cfg *config.Config, log *zap.Logger, checkQueue bool, signer *dkim.Signer) error {
	var ready atomic.Bool
	reg := prometheus.NewRegistry()
	// Every line names the node: queue IDs are unique across the nodes
	// (their low bits are the node's tag), and the name says which node
	// to ask about one without decoding it.
	log = log.With(zap.String("node", cfg.NodeName()))
	ev, err := newEvents(cfg.Events, cfg.NodeName(), log, metrics.NewEvents(reg))
	if err != nil {
		return err
	}
	// Said before bbolt tries: its error would be a bare mkdir or open
	// failure, without the path's origin or what to do.
	if err := config.QueueWritable(cfg.Queue.Path, nil); err != nil {
		return fmt.Errorf("queue.path: %w", err)
	}
	reserve, err := queueReserve(cfg.Queue.Path, cfg.Queue.ReservePercent)
	if err != nil {
		return err
	}
	q, err := queue.Open(cfg.Queue.Path, ev.QueueOptions(queue.Options{
		Node:        cluster.IDTag(cfg.NodeName()),
		Reserve:     reserve,
		LockTimeout: cfg.Queue.LockTimeout,
		CommitDelay: cfg.Queue.CommitDelay,
		FullScan:    checkQueue,
		History:     queue.HistoryOptions{Retention: cfg.History.Retention, MaxMessages: cfg.History.MaxMessages},
		OnQuarantine: func(bucket string, key []byte, err error) {
			log.Error("queue record quarantined", zap.String("bucket", bucket), zap.Binary("key", key), zap.Error(err))
		},
	}))
	if err != nil {
		return fmt.Errorf("queue.path: %w", err) // the queue's error names the file
	}
	defer q.Close()
	defer runEvents(ctx, ev, q)() // stopped before the queue closes
	if n := q.Replayed(); n > 0 {
		// Accepted (250 sent) but not yet in the database when the last
		// run stopped: a crash, not a clean stop.
		log.Warn("queue journal replayed after an unclean stop", zap.Int("messages", n))
	}
	if checkQueue {
		st, err := q.Stats()
		fields := []zap.Field{zap.Int("messages", st.Messages), zap.Int("recipients", st.Recipients)}
		if err != nil { // on a full disk the counts are the database's, without what the journal holds
			fields = append(fields, zap.Error(err))
		}
		log.Info("queue checked: every record decoded, damaged ones quarantined", fields...)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	p := relayParts{queue: q, charts: restoreCharts(q, m.Recent, log)}
	shared, err := newCluster(cfg, log, reg)
	if err != nil {
		return err
	}
	if shared != nil {
		defer shared.Close()
		go reportQueued(ctx, q, shared)
	}
	sup, err := openSuppressions(cfg, shared)
	if err != nil {
		return err
	}
	if sup != nil {
		defer sup.Close()
		go pruneSuppressions(ctx, sup, log)
		if shared != nil {
			go syncSuppressions(ctx, sup, log)
		}
		if files := cfg.Suppression.Imports; len(files) > 0 {
			for _, f := range files {
				loadImport(sup, f, "start", log)
			}
			go watchImports(ctx, files, sup, log)
		}
	}
	if p.engine, p.policy, p.report, err = newEngine(cfg, q, log, m, ev, shared, sup); err != nil {
		return err
	}
	users, err := loadDirectory(cfg)
	if err != nil {
		return err
	}
	if users != nil {
		go watchDirectory(ctx, cfg, users, log)
	}
	if p.smtp, err = newSMTP(cfg, q, log, m, signer, users, sup, shared, ev); err != nil {
		return err
	}
	if cfg.API.Address != "" {
		if p.api, err = sendapi.New(sendapi.Options{Config: cfg, Intake: p.smtp, Users: users, Logger: log, Now: time.Now,
			Find: findSubmitted(q)}); err != nil {
			return err
		}
	}
	aopt := admin.Options{Config: cfg, Queue: q, Engine: p.engine, Registry: reg,
		Logger: log, Now: time.Now, Probe: probeFunc(cfg, q), Recent: m.Recent, Nodes: nodesFunc(shared),
		NodeStats: adminclient.NodeStats(cfg.Admin.Token), DKIM: signer,
		Ready: func() error {
			if !ready.Load() {
				return errors.New("starting")
			}
			return nil
		}}
	if p.report != nil {
		aopt.TLSReport = tlsReportFunc(p.report)
	}
	if sup != nil {
		aopt.Suppressions = announcedList{list: sup, q: q, ev: ev, log: log}
	}
	p.admin, err = admin.New(aopt)
	if err != nil {
		return err
	}
	return p.run(ctx, cfg, log, &ready)
}

func (p relayParts) run(ctx context.Context, cfg *config.Config, log *zap.Logger, ready *atomic.Bool) error {
	if cfg.Admin.Address != "" {
		if err := p.admin.Start(); err != nil {
			return fmt.Errorf("admin: %w", err)
		}
	}
	engineCtx, stopEngine := context.WithCancel(context.Background())
	engineDone := make(chan error, 1)
	go func() { engineDone <- p.engine.Run(engineCtx) }()
	if p.policy != nil {
		go refreshPolicies(engineCtx, p.policy, log)
	}
	if p.report != nil {
		go p.report.Run(engineCtx)
	}
	// The charts' keeper stops last, when run returns: its final save
	// has the engine's last outcomes, and the queue is still open.
	chartsCtx, stopCharts := context.WithCancel(context.Background())
	chartsDone := make(chan struct{})
	go func() { p.charts.run(chartsCtx); close(chartsDone) }()
	defer func() { stopCharts(); <-chartsDone }()
	if err := p.startIntake(); err != nil {
		stopEngine()
		<-engineDone
		return err
	}
	usageCtx, stopUsage := context.WithCancel(context.Background())
	usageDone := make(chan struct{})
	go func() { p.smtp.KeepUsage(usageCtx); close(usageDone) }()
	ready.Store(true)
	log.Info("greyrelay started", zap.String("version", version()), zap.String("hostname", cfg.Hostname),
		zap.Stringers("smtp", p.smtp.Addrs()), zap.String("admin", cfg.Admin.Address), zap.String("queue", cfg.Queue.Path))
	var stopErr error
	select {
	case <-ctx.Done():
	case err := <-engineDone:
		log.Error("delivery engine stopped", zap.Error(err))
		engineDone <- err // for the wait below
	case <-p.queue.Damaged():
		// Nothing more can be read or stored: stop rather than answer
		// every client 451 and deliver nothing until someone looks.
	}
	if err := p.queue.Err(); err != nil {
		stopErr = err
	}
	ready.Store(false)
	log.Info("shutting down")
	// Intake first: sessions finish (or are refused) before the queue closes,
	// so no client ever reads a 250 for a message we did not commit.
	shutCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if p.api != nil {
		if err := p.api.Shutdown(shutCtx); err != nil {
			log.Warn("sending API shutdown", zap.Error(err))
		}
	}
	if err := p.smtp.Shutdown(shutCtx); err != nil {
		log.Warn("smtp shutdown", zap.Error(err))
	}
	stopUsage() // after the last session: its message counts after a restart
	<-usageDone
	stopEngine()
	<-engineDone
	if p.report != nil {
		p.report.Save() // the day's counts so far, for the next start
	}
	if cfg.Admin.Address != "" {
		p.admin.Shutdown(shutCtx)
	}
	return stopErr
}

// startIntake starts the SMTP listeners and the sending API.
func (p relayParts) startIntake() error {
	if err := p.smtp.Start(); err != nil {
		return err
	}
	if p.api == nil {
		return nil
	}
	if err := p.api.Start(); err != nil {
		p.smtp.Shutdown(context.Background())
		return err
	}
	return nil
}

// loadDirectory reads users_file and, with the sending API on,
// api.tokens_file; nil when neither is used (no AUTH offered).
func loadDirectory(cfg *config.Config) (*smtpd.Users, error) {
	tokens := ""
	if cfg.API.Address != "" {
		tokens = cfg.API.TokensFile
	}
	if cfg.UsersFile == "" && tokens == "" {
		return nil, nil
	}
	u, err := smtpd.LoadDirectory(cfg.UsersFile, tokens)
	if err != nil {
		return nil, fmt.Errorf("users_file or api.tokens_file: %w", err)
	}
	return u, nil
}

// usageStoreName is the queue store that keeps a lone node's user_limits
// counts.
const usageStoreName = "user-usage"

func newSMTP(cfg *config.Config, q *queue.Queue, log *zap.Logger, m *metrics.Metrics, signer *dkim.Signer,
	users *smtpd.Users, sup *suppress.List, shared *cluster.Cluster, ev *events.Events) (*smtpd.Server, error) {
	opt := smtpd.Options{Config: cfg, Queue: q, Users: users, Logger: log, Metrics: m, Now: time.Now, DKIM: signer}
	if sup != nil {
		opt.Suppress = sup
		opt.OnRefused = refusedEvents(q, ev, log)
	}
	// user_limits counts outlive a restart: in the cluster's Redis, shared
	// by the nodes, or in the queue's file.
	if shared != nil {
		opt.Usage = shared
	} else {
		opt.Usage = smtpd.NewStoredUsage(q.Store(usageStoreName))
	}
	return smtpd.New(opt)
}

// newCluster connects to the shared Redis when cluster.redis is set; nil
// for a node on its own.
func newCluster(cfg *config.Config, log *zap.Logger, reg prometheus.Registerer) (*cluster.Cluster, error) {
	c := cfg.Cluster
	if len(c.Redis.Addresses) == 0 {
		return nil, nil
	}
	cluster.RouteRedisLogs(log)
	node := cluster.Node{Name: cfg.NodeName(), AdminURL: c.AdminURL,
		Version: version(), Started: time.Now().UTC()}
	if node.AdminURL == "" && cfg.Admin.Address != "" {
		node.AdminURL = "http://" + cfg.Admin.Address
	}
	// A node name that another running process already uses is reported
	// by the cluster's heartbeat (an error, a metric, cluster status), not
	// refused here: at start, another process's fresh entry may as well be
	// this node's previous run that crashed, here or on the host whose
	// queue this node took over, and a refusal would keep the node down
	// until that entry expires (3×lease_ttl), or loop its restarts.
	return cluster.New(cluster.Options{Config: c, Node: node, Logger: log, Registry: reg})
}

// nodesFunc lists the cluster's nodes for the status page; nil for a node
// on its own.
func nodesFunc(c *cluster.Cluster) func(context.Context) ([]admin.ClusterNode, error) {
	if c == nil {
		return nil
	}
	return func(ctx context.Context) ([]admin.ClusterNode, error) {
		ns, err := c.Nodes(ctx)
		out := make([]admin.ClusterNode, len(ns))
		for i, n := range ns {
			out[i] = admin.ClusterNode{Name: n.Name, AdminURL: n.AdminURL, Version: n.Version, Seen: n.Seen,
				ConflictWith: n.ConflictWith}
		}
		return out, err
	}
}

// reportQueued keeps the node's registry entry's queue count current.
func reportQueued(ctx context.Context, q *queue.Queue, c *cluster.Cluster) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		st, err := q.Stats()
		var un *queue.UnsettledError
		switch {
		case errors.As(err, &un): // a full disk: the accepted recipients the database lacks count too
			c.SetQueued(st.Recipients + un.Recipients)
		case err == nil:
			c.SetQueued(st.Recipients)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func newEngine(cfg *config.Config, q *queue.Queue, log *zap.Logger, m *metrics.Metrics, ev *events.Events, c *cluster.Cluster,
	sup *suppress.List) (*delivery.Engine, *tlspolicy.Checker, *tlsrpt.Reporter, error) {
	cl, err := classifier.New(cfg.Retry.Rules)
	if err != nil {
		return nil, nil, nil, err
	}
	router, err := newRouter(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	d4, d6, err := dialers(cfg.Delivery)
	if err != nil {
		return nil, nil, nil, err
	}
	policy, err := newTLSPolicy(cfg, router, q.Store(tlspolicy.StoreName))
	if err != nil {
		return nil, nil, nil, err
	}
	report, err := newTLSReports(cfg, router, q, log)
	if err != nil {
		return nil, nil, nil, err
	}
	opt := delivery.Options{Config: cfg, Queue: q, Classifier: cl, Router: router,
		Dialer4: d4, Dialer6: d6, TLSConfig: &tls.Config{}, Logger: log, Metrics: m,
		Now: time.Now, Rand: rand.Float64, Events: ev}
	if policy != nil {
		opt.TLSPolicy = policy // a nil *Checker in the interface would not be nil
	}
	if c != nil { // a nil *cluster.Cluster in the interface would not be nil
		opt.Shared, opt.Suspensions, opt.Node = c, c, cfg.NodeName()
	}
	if report != nil {
		opt.TLSReport = report.Agg
	}
	opt.Suppress = suppressFunc(sup, log)
	if sup != nil && cfg.Suppression.Action == config.SuppressBounce {
		opt.Suppressed = sup.Why
	}
	e, err := delivery.New(opt)
	return e, policy, report, err
}

func newRouter(cfg *config.Config) (*mx.Router, error) {
	server := cfg.Delivery.Resolver
	if server == "" {
		s, err := mx.SystemServer("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("delivery.resolver is empty and /etc/resolv.conf has no nameserver: %w", err)
		}
		server = s
	}
	return &mx.Router{
		Resolver: mx.NewDNS(server, 10*time.Second), Routes: cfg.Delivery.Routes,
		Smarthost: cfg.Delivery.Smarthost.Address, Port: cfg.Delivery.Port,
		AllowPrivate: cfg.Delivery.AllowPrivateDestinations,
		Literals:     cfg.Delivery.AddressLiterals == "deliver",
		MaxAddrs:     cfg.Delivery.MXAddressLimit,
		IPv4:         true, IPv6: cfg.Delivery.SourceIPv6 != "",
		Shuffle: rand.Shuffle,
	}, nil
}

// dialers pins the source addresses. An address that cannot be bound fails
// startup: sending from another address would restart every receiver's
// greylisting clock, so we never fall back silently.
func dialers(d config.Delivery) (v4, v6 smtpclient.Dialer, err error) {
	v4dial := &net.Dialer{Timeout: d.ConnectTimeout}
	if d.SourceIPv4 != "" {
		if v4dial.LocalAddr, err = bindable(d.SourceIPv4); err != nil {
			return nil, nil, fmt.Errorf("delivery.source_ipv4: %w", err)
		}
	}
	if d.SourceIPv6 == "" {
		return v4dial, nil, nil
	}
	v6dial := &net.Dialer{Timeout: d.ConnectTimeout}
	if v6dial.LocalAddr, err = bindable(d.SourceIPv6); err != nil {
		return nil, nil, fmt.Errorf("delivery.source_ipv6: %w", err)
	}
	return v4dial, v6dial, nil
}

func bindable(ip string) (*net.TCPAddr, error) {
	addr := &net.TCPAddr{IP: net.ParseIP(ip)}
	l, err := net.ListenTCP("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s is not bindable on this host: %w", ip, err)
	}
	l.Close()
	return addr, nil
}
