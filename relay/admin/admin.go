// Package admin is greyrelay's operator surface: a small HTTP server on
// admin.address and the views it serves. Its client is
// relay/admin/adminclient; the CLI commands that print the views are
// relay/admin/admincli. Imports go one way: admincli → adminclient → admin.
//
// Design notes:
//
//   - The queue file is locked by the running daemon, so the CLI never opens
//     it. `greyrelay queue …`, `greyrelay destinations` and `greyrelay health`
//     are thin HTTP clients of the JSON API below (mox and KumoMTA do the
//     same); the API is the one place that reads and changes the queue on an
//     operator's behalf.
//   - One definition of each view (views.go): the handlers encode it,
//     adminclient.Client decodes it through typed methods (List, Message,
//     Shape, Act, Destinations, Destination), and Local builds it from the
//     queue for code inside the daemon, such as the status page's probe.
//     The handlers are built on Local, so in process and over HTTP cannot
//     disagree.
//   - Handlers do constant work per returned row: filtering, counting and
//     paging happen inside the queue, so listing or retrying 100,000
//     recipients costs what the queue costs (see BenchmarkList100k).
//   - The server is private by default (127.0.0.1:8025). A non-loopback
//     address requires admin.token; when a token is set every endpoint but
//     /healthz requires "Authorization: Bearer TOKEN", compared in constant
//     time; reads (GET) also take the token as an HTTP Basic password, so
//     that a browser can open the status page. /healthz stays open so that
//     a container runtime can probe liveness without the secret.
//   - Web pages cannot drive it (guard.go): a state-changing request a
//     browser marks as cross-origin gets 403, and so does any request whose
//     Host is not admin.address's host, a loopback name or address, or a
//     name in admin.allowed_hosts (DNS rebinding).
//   - Queue gauges are computed at scrape time from queue.Stats (kept in
//     memory by the queue, no scan), so they are never stale and cost
//     nothing between scrapes.
//   - Nothing global: an own http.ServeMux, the Registry passed in, the clock
//     injected as Options.Now.
//
// Routes (JSON unless noted; errors are {"error": "..."} with 400 for a bad
// filter or selector, 401 for a missing or wrong token, 403 for a refused
// Host or a cross-origin request, 404 for an unknown id, 409 for a state
// conflict, 503 when a feature is not available):
//
//	GET  /                    HTML status page (refreshes every 10 s)
//	GET  /message/{id}        HTML page of one message: envelope, recipients with
//	                          their attempts and explained last reply, headers
//	GET  /healthz             "ok": the process serves HTTP (no token needed)
//	GET  /readyz              "ok", or 503 with the reason: queue open, listeners up
//	GET  /metrics             Prometheus exposition of Options.Registry
//	GET  /api/stats           queue counters: by status, by reason, oldest, sizes
//	GET  /api/queue           recipients; filters status, reason, domain, sender,
//	                          tag, envid, message_id (the application's names),
//	                          older_than (Go duration: arrived before now-D);
//	                          a final status, or tag, envid or message_id
//	                          without a status, also lists finished messages;
//	                          paging offset, limit (default 100, at most 10000)
//	GET  /api/queue/{id}      one message, every recipient with its attempts and
//	                          an explanation of its last reply; a finished one
//	                          (kept for history.retention) has "finished"
//	GET  /api/queue/{id}/headers, /api/queue/{id}/body
//	                          text/plain: the message's header section or body
//	                          (postcat -h, -b), at most max octets (default 1 MiB);
//	                          X-Greyrelay-Size gives the whole part's size
//	GET  /api/shape           qshape: live recipients by=domain|reason and by
//	                          message age (5, 10, 20 … 1280 minutes, older);
//	                          status, limit (default 100 rows)
//	POST /api/queue/{id}/{action}           action on one message
//	POST /api/queue/{action}?SELECTION      action on the recipients selected
//	                          by domain, status, reason, sender, tag and
//	                          older_than (all that are given must match), or
//	                          all=1 alone for everything; dry_run=1 counts
//	                          without changing anything.
//	                          action: retry, hold, release, delete, bounce,
//	                          requeue; answers {"action", "recipients": n};
//	                          retry and requeue also forget the dead hosts
//	                          and throttle pause of the recipients'
//	                          destinations (a flush)
//	POST /api/destinations/suspend?domain=D[&reason=TEXT][&for=DUR]
//	                          stop delivery to D (all nodes) until resumed or
//	                          for DUR; its mail stays queued
//	POST /api/destinations/resume?domain=D  end it; D's mail is due at once
//	GET  /api/destinations    what was learned per destination domain:
//	                          greylisting and its learned delay, throttling, dead hosts
//	GET  /api/destinations/{domain}         the same shape, with one destination
//	                          (404 when nothing was learned about it)
//	POST /api/destinations/forget?domain=D|all=1  forget what was learned about
//	                          a destination or all of them; answers
//	                          {"action": "forget", "destinations": n}
//	POST /api/probe?target=X  only when Options.Probe is set: its result as JSON
//	                          (target may also come as a form body); 429 with
//	                          Retry-After past admin.probe_concurrency probes at
//	                          once or admin.probe_per_minute per client address
//
// Every GET and HEAD only reads: whatever changes the queue, what was
// learned, or reaches outside the relay (the probe, TLS report sending) is
// a POST, which the cross-origin guard and the bearer-only token rule
// cover. (A read may still settle the intake journal into the database or
// quarantine a record it finds corrupt: the queue's own upkeep, which its
// next read would do anyway.)
//
// A full disk does not stop the reads: when the queue's database cannot be
// written, so that messages accepted (safe in the intake journal) cannot
// enter it, /api/queue, /api/stats, /api/shape and the status page answer
// with what the database holds and say what it lacks,
// "unsettled_recipients": n and "unsettled_error" (omitted otherwise;
// Unsettled), as Postfix's mailq still lists its queue on a full disk.
// GET /api/queue/{id} of a message the database does not hold then
// answers 503 (it may be one of them); the actions fail as before.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/dkim"
	"github.com/greyrelay/greyrelay/relay/metrics"
)

// Engine is the part of the delivery engine the admin API needs; it is
// implemented by relay/delivery.Engine.
type Engine interface {
	// Bounce fails the selected live recipients now, generating DSNs as
	// expiry would, and returns how many it failed.
	Bounce(sel queue.Selector, now time.Time) (int, error)
	// Retry is the operator's flush: it forgets the dead hosts and the
	// throttle pause of the selected recipients' destinations and makes
	// the recipients due now; it returns how many it made due.
	Retry(sel queue.Selector, now time.Time) (int, error)
	// Forget drops what was learned about domain, or about every
	// destination with all, and returns how many destinations changed.
	Forget(domain string, all bool, now time.Time) (int, error)
	// Requeue routes the selected recipients again (queue.Requeue) after
	// a flush of their destinations, as Retry does; it returns how many
	// it requeued.
	Requeue(sel queue.Selector, now time.Time) (int, error)
	// Suspend stops delivery to domain until until (zero: until Resume),
	// across the cluster; Resume ends it and makes the domain's waiting
	// recipients due, reporting whether it was suspended and how many.
	Suspend(domain, reason string, until, now time.Time) (queue.Suspension, error)
	Resume(domain string, now time.Time) (bool, int, error)
	// Operate holds, releases or deletes the selected recipients
	// (action queue.ReasonHeld, ReasonReleased or ReasonDeleted), as
	// queue.Operate does, and reports each change as an outcome (its
	// event, log line and counter); it returns how many it changed.
	Operate(action string, sel queue.Selector, now time.Time) (int, error)
	// Kick asks the scheduler to look for due work now.
	Kick()
}

// Options configure New. Config and Queue are required.
type Options struct {
	Config   *config.Config
	Queue    *queue.Queue
	Engine   Engine               // nil: bounce and forget answer 503, retry only makes recipients due
	Ready    func() error         // nil: always ready
	Registry *prometheus.Registry // nil: a private registry with only the queue gauges
	Logger   *zap.Logger          // nil: no logging
	Now      func() time.Time     // nil: time.Now
	// Probe, when set, is exposed as POST /api/probe (target=X), within
	// admin.probe_concurrency and admin.probe_per_minute (probe.go).
	Probe func(ctx context.Context, target string) (any, error)
	// Recent, when set, gives the status page its charts of outcomes per
	// minute (relay/metrics keeps it; the delivery engine feeds it).
	Recent *metrics.Recent
	// Nodes, when set with NodeStats, lists the cluster's registered
	// nodes: the status page then shows each node's queue, which NodeStats
	// asks from the node's admin API (adminclient.NodeStats) within ctx.
	Nodes     func(ctx context.Context) ([]ClusterNode, error)
	NodeStats func(ctx context.Context, n ClusterNode) (Stats, error)
	// DKIM, when set, gives the status page the signing keys' DNS
	// records (the keys in use, also after a SIGHUP reloaded them).
	DKIM *dkim.Signer
	// TLSReport, when set, is exposed as POST /api/tls-report/send: it
	// sends the TLS reports (RFC 8460) of everything counted so far.
	TLSReport func(ctx context.Context) (any, error)
	// Suppressions, when set, is served under /api/suppressions (suppress.go).
	Suppressions SuppressionList
}

// Server is the admin HTTP server.
type Server struct {
	opt     Options
	local   *Local // the views the API serves
	log     *zap.Logger
	token   [sha256.Size]byte // hash of the token; valid only when hasTok
	hasTok  bool
	handler http.Handler
	page    *template.Template
	probes  *probeGate
	started time.Time // when New ran: the charts mark it

	mu  sync.Mutex
	srv *http.Server
	ln  net.Listener
}

// Server timeouts. Reads are small (no request bodies); writes are bounded
// by the largest page (limit 10000) or a probe.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 90 * time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
)

// New builds the server and registers the queue gauges on Options.Registry.
// It refuses a non-loopback admin.address without a token, even if the
// configuration was not validated.
func New(opt Options) (*Server, error) {
	if opt.Config == nil || opt.Queue == nil {
		return nil, errors.New("admin: Config and Queue are required")
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.Registry == nil {
		opt.Registry = prometheus.NewRegistry()
	}
	a := opt.Config.Admin
	if a.Address != "" && !isLoopback(a.Address) && a.Token == "" {
		return nil, fmt.Errorf("admin: %s is not a loopback address, so admin.token is required", a.Address)
	}
	page, err := template.New("status").Parse(statusHTML)
	if err == nil {
		_, err = page.New("message").Parse(messageHTML)
	}
	if err != nil {
		return nil, fmt.Errorf("admin: status page: %w", err)
	}
	if err := opt.Registry.Register(newQueueCollector(opt.Queue, opt.Now)); err != nil {
		return nil, fmt.Errorf("admin: register queue gauges: %w", err)
	}
	s := &Server{opt: opt, local: NewLocal(opt.Queue, opt.Config.NodeName(), opt.Now), log: opt.Logger.Named("admin"), page: page,
		started: opt.Now(), probes: newProbeGate(a.ProbeConcurrency, a.ProbePerMinute, opt.Now)}
	if a.Token != "" {
		s.token, s.hasTok = sha256.Sum256([]byte(a.Token)), true
	}
	s.handler = s.routes()
	return s, nil
}

// isLoopback reports whether a host:port names a loopback address, using
// the same rule as config validation.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeText(w, http.StatusOK, "ok") })
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.opt.Registry, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, ErrorLog: zap.NewStdLog(s.log)}))
	mux.HandleFunc("GET /{$}", s.statusPage)
	mux.HandleFunc("GET /message/{id}", s.messagePage)
	mux.HandleFunc("GET /api/stats", s.stats)
	mux.HandleFunc("GET /api/queue", s.list)
	mux.HandleFunc("GET /api/queue/{id}", s.show)
	mux.HandleFunc("GET /api/queue/{id}/headers", s.content("headers"))
	mux.HandleFunc("GET /api/queue/{id}/body", s.content("body"))
	mux.HandleFunc("GET /api/shape", s.shape)
	mux.HandleFunc("POST /api/queue/{id}/{action}", s.actionOne)
	mux.HandleFunc("POST /api/queue/{action}", s.actionMany)
	mux.HandleFunc("GET /api/destinations", s.destinations)
	mux.HandleFunc("GET /api/destinations/{domain}", s.destination)
	mux.HandleFunc("POST /api/destinations/forget", s.forget)
	mux.HandleFunc("POST /api/destinations/suspend", s.suspend)
	mux.HandleFunc("POST /api/destinations/resume", s.resume)
	if s.opt.Probe != nil {
		// It sends SMTP: a POST, so that a web page cannot make a
		// browser run it (guard.go), and limited (probe.go).
		mux.HandleFunc("POST /api/probe", s.probe)
	}
	if s.opt.TLSReport != nil {
		mux.HandleFunc("POST /api/tls-report/send", s.tlsReport)
	}
	if s.opt.Suppressions != nil {
		mux.HandleFunc("GET /api/suppressions", s.suppressions)
		mux.HandleFunc("POST /api/suppressions", s.suppressAdd)
		mux.HandleFunc("POST /api/suppressions/remove", s.suppressRemove)
	}
	return s.guard(s.auth(mux))
}

// auth requires the bearer token on everything except /healthz.
func (s *Server) auth(next http.Handler) http.Handler {
	if !s.hasTok {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || s.tokenOK(r) {
			next.ServeHTTP(w, r)
			return
		}
		// RFC 7235 §4.1: one challenge per scheme. A browser offers its
		// login dialog for Basic, so the status page can be opened.
		w.Header().Add("WWW-Authenticate", `Bearer realm="greyrelay"`)
		w.Header().Add("WWW-Authenticate", `Basic realm="greyrelay", charset="UTF-8"`)
		writeError(w, http.StatusUnauthorized, errors.New("missing or wrong admin token"))
	})
}

// tokenOK reports whether r carries the token: as "Bearer TOKEN", or, for
// reading only (GET, HEAD), as the password of HTTP Basic (RFC 7617; any
// user name), which is what a browser can send. Basic is not enough to
// act on the queue: a browser sends cached Basic credentials with any
// request, also one a hostile page makes it send (cross-site request
// forgery), and a bearer token is never sent that way. Hashes are
// compared, so that neither the content nor the length of the token leaks
// through timing.
func (s *Server) tokenOK(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok {
		got = strings.TrimSpace(got)
	} else if r.Method == http.MethodGet || r.Method == http.MethodHead {
		_, got, ok = r.BasicAuth()
	}
	if !ok {
		return false
	}
	h := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(h[:], s.token[:]) == 1
}

// Start listens on admin.address and serves in the background. It fails
// when the address is empty (the admin server is disabled) or in use.
func (s *Server) Start() error {
	addr := s.opt.Config.Admin.Address
	if addr == "" {
		return errors.New("admin: admin.address is empty (admin server disabled)")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          zap.NewStdLog(s.log),
	}
	s.mu.Lock()
	s.srv, s.ln = srv, ln
	s.mu.Unlock()
	s.log.Info("admin server listening", zap.String("address", ln.Addr().String()))
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server stopped", zap.Error(err))
		}
	}()
	return nil
}

// Shutdown stops accepting connections and waits for requests in flight
// until ctx ends. It is a no-op before Start.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Shutdown(ctx)
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if s.opt.Ready != nil {
		if err := s.opt.Ready(); err != nil {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
	}
	writeText(w, http.StatusOK, "ok")
}

func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}
