package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/mx/mxtest"
)

// The other relays a user could pick instead of greyrelay: OpenSMTPD,
// Exim and chasquid from Debian's packages, and maddy from its Go
// module. Each runs as a durable smarthost: it accepts mail for
// dest.test from loopback, queues it on the workspace's disk and relays
// it to the round's sink, as its documentation describes that role.
//
// Debian's opensmtpd, exim4-daemon-light and chasquid conflict with
// postfix (and with each other) as installed packages, so none is
// installed: `apt-get download` and `dpkg-deb -x` unpack each into a
// private root in the cache directory (once; later runs reuse it), and
// maddy is built there from the module proxy. Each peer then runs in a
// private mount namespace (`unshare -m`) where /etc/resolv.conf names
// this harness's loopback DNS server, so that no lookup leaves
// 127.0.0.0/8, and where the compiled-in paths a program insists on
// (OpenSMTPD's spool, Exim's library) are bind mounts into its own
// directory. Each runs in its own cgroup, so its CPU time covers every
// process it forks.

// Loopback addresses of the peers and of the harness's DNS server.
const (
	ipOpenSMTPD = "127.0.0.60"
	ipExim      = "127.0.0.61"
	ipChasquid  = "127.0.0.62"
	ipMaddy     = "127.0.0.63"
	ipPeerDNS   = "127.0.0.64" // port 53: resolv.conf has no port
	// sinkHost is the name chasquid forwards to (it has no smarthost
	// setting and looks up MX records); the harness's DNS server maps
	// it to the sink's address.
	sinkHost = "sink.bench.test"
)

// maddyModule is the maddy release the bench builds.
const maddyModule = "github.com/foxcpp/maddy@v0.8.1"

// peerKind describes one peer.
type peerKind struct {
	name  string
	title string
	ip    string
	debs  []string // Debian packages unpacked into its root (nil: maddy, a Go build)
	// syncs is whether it makes each message durable (fsync) before its
	// 250, as checked with strace -f -e trace=fsync,fdatasync on a short
	// run and in its source; the measured fsync calls per message are
	// printed beside it in every table.
	syncs bool
	note  string // how it was configured, in one line, for the report
}

// peerKinds are the peers, in the order the report lists them.
var peerKinds = []peerKind{
	{name: "opensmtpd", title: "OpenSMTPD", ip: ipOpenSMTPD, debs: []string{"opensmtpd"}, syncs: false,
		note: "queue_fs writes the message and envelope without fsync (only envelope updates after a failed attempt are synced): not durable before its 250"},
	{name: "exim", title: "Exim", ip: ipExim, debs: []string{"exim4-base", "exim4-daemon-light", "libidn12"}, syncs: true,
		note: "fsyncs the -D and -H spool files before its 250; delivers each message at once in a process of its own, one connection each"},
	{name: "chasquid", title: "chasquid", ip: ipChasquid, debs: []string{"chasquid"}, syncs: false,
		note: "writes each queue item to a temporary file and renames it, without fsync: not durable before its 250; relays only for authenticated users, so dest.test is a local domain whose alias forwards to the sink's domain"},
	{name: "maddy", title: "maddy", ip: ipMaddy, syncs: true,
		note: "target.queue (fsyncs header, body and metadata before its 250) to target.smtp, max_parallelism 20"},
}

// peerKindOf finds a peer by name.
func peerKindOf(name string) (peerKind, bool) {
	for _, k := range peerKinds {
		if k.name == name {
			return k, true
		}
	}
	return peerKind{}, false
}

// syncsBefore250 tells, for any system of a comparison, whether it makes
// each message durable before its 250 ("" for the load tools alone).
func syncsBefore250(name string) string {
	switch name {
	case "greyrelay", "postfix":
		return "yes"
	case "sink":
		return ""
	}
	if k, ok := peerKindOf(name); ok && k.syncs {
		return "yes"
	}
	return "no"
}

// titleOf names a system in a table.
func titleOf(name string) string {
	switch name {
	case "greyrelay":
		return "greyrelay"
	case "postfix":
		return "Postfix"
	case "sink":
		return "load tools alone"
	}
	if k, ok := peerKindOf(name); ok {
		return k.title
	}
	return name
}

// --- configuration files (pure, unit-tested) ---

// peerAddrs are the addresses a peer's configuration names.
type peerAddrs struct {
	listen string // its SMTP listener, ip:port
	sink   string // the next hop, ip:port
	extra  []string
}

// openSMTPDConfig renders smtpd.conf. Departures from the defaults, all
// for a fair run: `smtp limit max-mails` (100 per session) would answer
// 452 to the load generator's long sessions, and the mta's compiled-in
// limits kept delivery at about 15 messages per second: 5 connections
// per route, a new one at most every 5 s, 100 messages per connection,
// and at most 50 envelopes taken per relay (task-hiwat), beyond which it
// holds them back in bursts (a 3,000-message check stalled at 2,137 for
// seconds). The `mta limit` keys (src/limit.c; not in the manual) give it
// the 20 connections greyrelay and Postfix use and room for the whole
// queue.
func openSMTPDConfig(a peerAddrs) string {
	ip, port, _ := net.SplitHostPort(a.listen)
	return fmt.Sprintf(`# OpenSMTPD as a smarthost for the bench: loopback only.
smtp limit max-mails 1000000
smtp max-message-size 64M
mta limit max-conn-per-route 20
mta limit max-conn-per-host 20
mta limit conn-delay-route 0
mta limit conn-delay-relay 0
mta limit reconn-delay-route 0
mta limit session-mail-max 1000
mta limit task-hiwat 100000
mta limit task-lowat 50000
mta limit task-release 10000
listen on %s port %s
action "relay" relay host smtp://%s
match from any for domain "dest.test" action "relay"
`, ip, port, a.sink)
}

// eximConfig renders Exim's runtime configuration: a relay for dest.test
// from 127.0.0.0/8 through a manualroute router to the sink. Departures
// from the defaults: smtp_accept_queue_per_connection 0 (by default the
// 11th message of a connection is only queued, for a queue runner, and
// the load generator sends thousands per connection), smtp_accept_max
// 100 (20 sessions plus the test's own), and no ident, reverse lookups or
// TLS on loopback.
func eximConfig(a peerAddrs, dir string) string {
	ip, port, _ := net.SplitHostPort(a.listen)
	sinkIP, sinkPort, _ := net.SplitHostPort(a.sink)
	return fmt.Sprintf(`# Exim as a smarthost for the bench: loopback only.
primary_hostname = exim.bench.test
exim_user = Debian-exim
exim_group = Debian-exim
never_users =
spool_directory = %[1]s/spool
log_file_path = %[1]s/log/%%slog
pid_file_path = %[1]s/exim.pid
local_interfaces = <; %[2]s.%[3]s
daemon_smtp_ports = %[3]s
host_lookup =
rfc1413_hosts =
tls_advertise_hosts =
smtp_accept_max = 100
smtp_accept_queue_per_connection = 0
message_size_limit = 64M
domainlist relay_to_domains = dest.test
hostlist relay_from_hosts = <; 127.0.0.0/8
acl_smtp_rcpt = acl_check_rcpt

begin acl

acl_check_rcpt:
  accept hosts = +relay_from_hosts
         domains = +relay_to_domains
  deny   message = relay not permitted

begin routers

smarthost:
  driver = manualroute
  domains = +relay_to_domains
  transport = remote_smtp
  route_list = * %[4]s
  self = send
  no_more

begin transports

remote_smtp:
  driver = smtp
  port = %[5]s
  hosts_avoid_tls = *

begin retry

*   *   F,2h,15m; G,16h,1h,1.5; F,4d,6h
`, dir, ip, port, sinkIP, sinkPort)
}

// chasquidConfig renders chasquid.conf (protobuf text). chasquid has no
// smarthost setting and relays only for authenticated users, and
// neither load generator authenticates: dest.test is a local domain
// whose alias forwards the load's recipient to sinkHost, which chasquid
// then delivers to like any remote domain (MX lookup through the
// harness's DNS server, the port from its testing flag).
func chasquidConfig(a peerAddrs, dir string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# chasquid as a forwarder for the bench: loopback only.\n")
	fmt.Fprintf(&b, "hostname: \"chasquid.bench.test\"\n")
	fmt.Fprintf(&b, "max_data_size_mb: 64\n")
	fmt.Fprintf(&b, "smtp_address: %q\n", a.listen)
	// The submission ports must listen somewhere (the default is
	// systemd's sockets): two more loopback ports.
	fmt.Fprintf(&b, "submission_address: %q\n", a.extra[0])
	fmt.Fprintf(&b, "submission_over_tls_address: %q\n", a.extra[1])
	fmt.Fprintf(&b, "data_dir: %q\n", filepath.Join(dir, "data"))
	fmt.Fprintf(&b, "mail_log_path: %q\n", filepath.Join(dir, "mail.log"))
	fmt.Fprintf(&b, "mail_delivery_agent_bin: \"/bin/false\"\n")
	return b.String()
}

// chasquidAliases forwards the load's recipient to the sink's domain.
func chasquidAliases() string {
	return "# every address the load sends to, forwarded to the sink\nrcpt: rcpt@" + sinkHost + "\n"
}

// maddyConfig renders maddy.conf: an SMTP endpoint for dest.test into a
// target.queue (durable, on disk) that forwards through target.smtp to
// the sink, maddy's documented smarthost arrangement. DMARC checks are
// off (no other system checks policies here), and max_parallelism 20
// (default 16) matches the 20 connections of greyrelay and Postfix.
func maddyConfig(a peerAddrs, dir string) string {
	return fmt.Sprintf(`# maddy as a smarthost for the bench: loopback only.
hostname maddy.bench.test
state_dir %[1]s/state
runtime_dir %[1]s/run
tls off
log stderr

target.smtp sink {
    targets tcp://%[2]s
    starttls no
}

target.queue relay_queue {
    location %[1]s/queue
    target &sink
    max_parallelism 20
}

smtp tcp://%[3]s {
    dmarc no
    max_message_size 64M
    destination dest.test {
        deliver_to &relay_queue
    }
    default_destination {
        reject 550 5.1.1 "relay not permitted"
    }
}
`, dir, a.sink, a.listen)
}

// mount is one change to a peer's private mount namespace.
type mount struct {
	kind     string // "bind", "tmpfs" or "overlay"
	src, dst string // for overlay, src is the lowerdir list
}

// nsScript is the shell script that makes a peer's mounts and then
// execs it, run as `unshare -m --propagation private sh -c SCRIPT`.
func nsScript(mounts []mount, argv []string) string {
	var b strings.Builder
	b.WriteString("set -e\n")
	for _, m := range mounts {
		switch m.kind {
		case "bind":
			fmt.Fprintf(&b, "mount --bind %s %s\n", shq(m.src), shq(m.dst))
		case "tmpfs":
			fmt.Fprintf(&b, "mount -t tmpfs tmpfs %s\n", shq(m.dst))
		case "overlay":
			fmt.Fprintf(&b, "mount -t overlay overlay -o %s %s\n", shq("lowerdir="+m.src), shq(m.dst))
		}
	}
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shq(a)
	}
	fmt.Fprintf(&b, "exec %s\n", strings.Join(q, " "))
	return b.String()
}

// shq quotes s for sh.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// multiarch is Debian's library directory name for this architecture.
func multiarch() string {
	switch runtime.GOARCH {
	case "arm64":
		return "aarch64-linux-gnu"
	case "386":
		return "i386-linux-gnu"
	}
	return "x86_64-linux-gnu"
}

// --- the cache: private roots and the maddy build ---

// peerCacheDir is where unpacked packages and the maddy build are kept
// between runs (-peer-cache, default ~/.cache/greyrelay-bench).
func peerCacheDir(flagValue string) (string, error) {
	if flagValue != "" {
		return filepath.Abs(flagValue)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "greyrelay-bench"), nil
}

// debRoot returns a private root holding pkgs, unpacked once: a
// directory whose marker file lists the packages and their versions.
// A root without its marker (an interrupted run) is made again.
func debRoot(cache, name string, pkgs []string) (root, versions string, err error) {
	dir := filepath.Join(cache, name+"-root")
	marker := filepath.Join(dir, "packages")
	if b, err := os.ReadFile(marker); err == nil && markerHas(string(b), pkgs) {
		return filepath.Join(dir, "root"), strings.TrimSpace(string(b)), nil
	}
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	debs := filepath.Join(tmp, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", "", err
	}
	if err := aptDownload(debs, pkgs); err != nil {
		return "", "", err
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	sort.Strings(files)
	var lines []string
	for _, f := range files {
		if out, err := exec.Command("dpkg-deb", "-x", f, filepath.Join(tmp, "root")).CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("dpkg-deb -x %s: %v: %s", f, err, out)
		}
		out, err := exec.Command("dpkg-deb", "-W", "--showformat=${Package} ${Version}", f).Output()
		if err != nil {
			return "", "", fmt.Errorf("dpkg-deb -W %s: %w", f, err)
		}
		lines = append(lines, strings.TrimSpace(string(out)))
	}
	if err := os.WriteFile(filepath.Join(tmp, "packages"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return "", "", err
	}
	_ = os.RemoveAll(debs)
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return "", "", err
	}
	b, _ := os.ReadFile(marker)
	return filepath.Join(dir, "root"), strings.TrimSpace(string(b)), nil
}

// markerHas reports whether a marker ("Package Version" lines) lists
// every package of pkgs.
func markerHas(marker string, pkgs []string) bool {
	have := map[string]bool{}
	for _, l := range strings.Split(marker, "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			have[f[0]] = true
		}
	}
	for _, p := range pkgs {
		if !have[p] {
			return false
		}
	}
	return len(pkgs) > 0
}

// aptDownload fetches pkgs into dir; when apt does not know a package
// (no package lists yet), it updates the lists once and tries again.
func aptDownload(dir string, pkgs []string) error {
	run := func() ([]byte, error) {
		cmd := exec.Command("apt-get", append([]string{"download", "-q"}, pkgs...)...)
		cmd.Dir = dir
		return cmd.CombinedOutput()
	}
	out, err := run()
	if err == nil {
		return nil
	}
	if up, uerr := exec.Command("apt-get", "update", "-q").CombinedOutput(); uerr != nil {
		return fmt.Errorf("apt-get download %v: %v: %s; apt-get update: %v: %s", pkgs, err, out, uerr, up)
	}
	if out, err = run(); err != nil {
		return fmt.Errorf("apt-get download %v: %v: %s", pkgs, err, out)
	}
	return nil
}

// maddyBinary builds maddy once into the cache. `go install
// module@version` needs the proxy's version list, which the proxy here
// refuses, so the module is downloaded at its version and built in
// place. Without SQLite (no cgo, tag nosqlite3): the relay role needs no
// storage module.
func maddyBinary(cache string) (string, error) {
	_, version, _ := strings.Cut(maddyModule, "@")
	out := filepath.Join(cache, "maddy-"+version, "maddy")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	dl := exec.Command("go", "mod", "download", "-json", maddyModule)
	dl.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	dl.Dir = filepath.Dir(out)
	b, err := dl.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", maddyModule, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(b, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s", maddyModule, err, mod.Error)
	}
	fmt.Fprintf(os.Stderr, "bench: building maddy %s (once; a few minutes)\n", version)
	tmp := out + ".tmp"
	build := exec.Command("go", "build", "-trimpath", "-tags", "nosqlite3", "-o", tmp, "./cmd/maddy")
	build.Dir = mod.Dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly")
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build maddy: %w\n%s", err, b)
	}
	return out, os.Rename(tmp, out)
}

// ensureUser adds a system user (and its group) that a peer's
// compiled-in configuration requires, unless it exists.
func ensureUser(name string) error {
	if _, err := user.Lookup(name); err == nil {
		return nil
	}
	out, err := exec.Command("useradd", "--system", "--user-group", "--no-create-home",
		"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("useradd %s: %v: %s", name, err, out)
	}
	return nil
}

// --- the harness's DNS server ---

// peerEnv is what every peer of one run shares: the cache and the DNS
// server.
type peerEnv struct {
	cache    string
	dns      *mxtest.Server
	resolv   string // a resolv.conf naming the DNS server
	servers  []*dns.Server
	mu       sync.Mutex
	versions map[string]string // peer → "package version" lines, for the report
}

// peerEnv starts (once per run) the DNS server every peer's resolv.conf
// names: it answers sinkHost (MX and A, the sink's address) and NXDOMAIN
// for every other name, so that the peers' lookups (PTR of a client,
// SPF, MTA-STS) are answered at once and stay on loopback.
func (e *env) peerEnv(cacheFlag string) (*peerEnv, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.peers != nil {
		return e.peers, nil
	}
	cache, err := peerCacheDir(cacheFlag)
	if err != nil {
		return nil, err
	}
	pe := &peerEnv{cache: cache, dns: &mxtest.Server{}, versions: map[string]string{}}
	pe.dns.MX(sinkHost, 10, sinkHost).A(sinkHost, ipSink)
	addr := net.JoinHostPort(ipPeerDNS, "53")
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("DNS server for the peers: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("DNS server for the peers: %w", err)
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: pe.dns}, {Listener: ln, Handler: pe.dns}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		pe.servers = append(pe.servers, srv)
	}
	// Exim runs as Debian-exim and must reach its spool inside the
	// workspace, which MkdirTemp made private.
	if err := os.Chmod(e.root, 0o711); err != nil {
		return nil, err
	}
	pe.resolv = filepath.Join(e.root, "resolv.conf")
	if err := os.WriteFile(pe.resolv, []byte("nameserver "+ipPeerDNS+"\noptions timeout:1 attempts:1\n"), 0o644); err != nil {
		return nil, err
	}
	e.cleanups = append(e.cleanups, func() {
		for _, s := range pe.servers {
			_ = s.Shutdown()
		}
	})
	e.peers = pe
	return pe, nil
}

// --- running a peer ---

// peerMTA is one running peer: a sut.
type peerMTA struct {
	kind      peerKind
	dir       string
	smtp      string
	queueDirs []string // empty of files when everything is delivered
	logPath   string
	cg        *cgroup
	cmd       *exec.Cmd
	done      chan struct{}
	exitErr   error
}

// launch is how one peer is started.
type launch struct {
	files     map[string]string // path → content, written before start
	mounts    []mount
	argv      []string
	queueDirs []string
}

// startPeer prepares and starts a peer relaying dest.test to sink.
func startPeer(e *env, cacheFlag, name, sink string) (*peerMTA, error) {
	kind, ok := peerKindOf(name)
	if !ok {
		return nil, fmt.Errorf("unknown system %q", name)
	}
	pe, err := e.peerEnv(cacheFlag)
	if err != nil {
		return nil, err
	}
	dir, err := e.dir(name)
	if err != nil {
		return nil, err
	}
	cg, err := e.group(filepath.Base(dir))
	if err != nil {
		return nil, fmt.Errorf("%s needs a cgroup2 filesystem to count its processes: %w", name, err)
	}
	listen, err := freeAddr(kind.ip)
	if err != nil {
		return nil, err
	}
	a := peerAddrs{listen: listen, sink: sink}
	var l launch
	switch name {
	case "opensmtpd":
		l, err = openSMTPDLaunch(pe, dir, a)
	case "exim":
		l, err = eximLaunch(pe, dir, a)
	case "chasquid":
		l, err = chasquidLaunch(pe, dir, a, peers.NewCert(e.tb(name+"-cert"), "chasquid.bench.test"))
	case "maddy":
		l, err = maddyLaunch(pe, dir, a)
	}
	if err != nil {
		return nil, err
	}
	for path, content := range l.files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	p := &peerMTA{kind: kind, dir: dir, smtp: listen, queueDirs: l.queueDirs, logPath: filepath.Join(dir, "peer.log"), cg: cg}
	mounts := append([]mount{{kind: "bind", src: pe.resolv, dst: "/etc/resolv.conf"}}, l.mounts...)
	if err := p.start(nsScript(mounts, l.argv)); err != nil {
		return nil, err
	}
	e.defer_(func() { _ = p.Stop() })
	if err := p.waitGreeting(60 * time.Second); err != nil {
		_ = p.Stop()
		return nil, err
	}
	return p, nil
}

func (p *peerMTA) start(script string) error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Dir, cmd.Stdout, cmd.Stderr = p.dir, logf, logf
	cmd.Env = peers.CleanEnv()
	attr, release, err := p.cg.procAttr()
	if err != nil {
		return err
	}
	cmd.SysProcAttr = attr
	err = cmd.Start()
	release()
	if err != nil {
		return fmt.Errorf("%s: %w", p.kind.name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { p.exitErr = cmd.Wait(); close(p.done) }()
	return nil
}

func (p *peerMTA) waitGreeting(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v\n%s", p.kind.name, p.exitErr, tailFile(p.logPath, 30))
		default:
		}
		if peers.Greets(p.smtp, false) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no SMTP greeting within %v\n%s", p.kind.name, timeout, tailFile(p.logPath, 30))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *peerMTA) Name() string     { return p.kind.name }
func (p *peerMTA) SMTPAddr() string { return p.smtp }
func (p *peerMTA) QueueDir() string { return p.dir }
func (p *peerMTA) Pids() []int      { return p.cg.procs() }
func (p *peerMTA) group() *cgroup   { return p.cg }

// QueueEmpty: no file left in its queue directories.
func (p *peerMTA) QueueEmpty() (bool, error) {
	for _, d := range p.queueDirs {
		n, err := countFiles(d)
		if err != nil || n > 0 {
			return false, err
		}
	}
	return true, nil
}

// countFiles counts regular files below dir (0 when dir does not exist
// yet).
func countFiles(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			n++
		}
		return nil
	})
	return n, err
}

// Stop sends SIGTERM, waits up to 20 s, then kills the whole group.
func (p *peerMTA) Stop() error {
	if p.cmd == nil {
		return nil
	}
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	p.cg.remove()
	return nil
}

// --- per-peer launches ---

func openSMTPDLaunch(pe *peerEnv, dir string, a peerAddrs) (launch, error) {
	root, err := pe.root("opensmtpd")
	if err != nil {
		return launch{}, err
	}
	for _, u := range []string{"opensmtpd", "opensmtpq"} {
		if err := ensureUser(u); err != nil {
			return launch{}, err
		}
	}
	// Compiled-in paths: the chroot directory and the spool, which is
	// the mount point for this run's own spool; the control socket goes
	// to a private /run.
	for _, d := range []string{"/var/lib/opensmtpd/empty", "/var/spool/smtpd"} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return launch{}, err
		}
	}
	spool := filepath.Join(dir, "spool")
	if err := os.Mkdir(spool, 0o711); err != nil {
		return launch{}, err
	}
	if err := os.Chmod(spool, 0o711); err != nil {
		return launch{}, err
	}
	conf := filepath.Join(dir, "smtpd.conf")
	return launch{
		files: map[string]string{conf: openSMTPDConfig(a)},
		mounts: []mount{
			{kind: "bind", src: spool, dst: "/var/spool/smtpd"},
			{kind: "tmpfs", dst: "/run"},
		},
		argv:      []string{filepath.Join(root, "usr/sbin/smtpd"), "-d", "-f", conf},
		queueDirs: []string{filepath.Join(spool, "queue"), filepath.Join(spool, "incoming")},
	}, nil
}

func eximLaunch(pe *peerEnv, dir string, a peerAddrs) (launch, error) {
	root, err := pe.root("exim")
	if err != nil {
		return launch{}, err
	}
	if err := ensureUser("Debian-exim"); err != nil {
		return launch{}, err
	}
	u, err := user.Lookup("Debian-exim")
	if err != nil {
		return launch{}, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	for _, d := range []string{"spool", "log"} {
		p := filepath.Join(dir, d)
		if err := os.Mkdir(p, 0o750); err != nil {
			return launch{}, err
		}
		if err := os.Chown(p, uid, gid); err != nil {
			return launch{}, err
		}
	}
	conf := filepath.Join(dir, "exim.conf")
	// Exim re-executes itself, as Debian-exim, for every delivery, at
	// its compiled-in path /usr/sbin/exim4: the private root's sbin is
	// mounted there. The binary is setuid root, so the loader ignores
	// LD_LIBRARY_PATH for it: the library it needs from the private root
	// (libidn12) is laid over the system's library directory instead.
	lib := "/usr/lib/" + multiarch()
	return launch{
		files: map[string]string{conf: eximConfig(a, dir)},
		mounts: []mount{
			{kind: "bind", src: filepath.Join(root, "usr/sbin"), dst: "/usr/sbin"},
			{kind: "overlay", src: filepath.Join(root, lib) + ":" + lib, dst: lib},
		},
		argv:      []string{"/usr/sbin/exim4", "-C", conf, "-bdf", "-q30s"},
		queueDirs: []string{filepath.Join(dir, "spool", "input")},
	}, nil
}

func chasquidLaunch(pe *peerEnv, dir string, a peerAddrs, cert *peers.Cert) (launch, error) {
	root, err := pe.root("chasquid")
	if err != nil {
		return launch{}, err
	}
	ip, _, _ := net.SplitHostPort(a.listen)
	for range 2 {
		x, err := freeAddr(ip)
		if err != nil {
			return launch{}, err
		}
		a.extra = append(a.extra, x)
	}
	_, sinkPort, _ := net.SplitHostPort(a.sink)
	etc := filepath.Join(dir, "etc")
	// chasquid will not start without a certificate: a self-signed one.
	// It then offers STARTTLS, which neither load generator uses.
	certPEM, err := os.ReadFile(cert.CertFile)
	if err != nil {
		return launch{}, err
	}
	keyPEM, err := os.ReadFile(cert.KeyFile)
	if err != nil {
		return launch{}, err
	}
	certDir := filepath.Join(etc, "certs", "chasquid.bench.test")
	return launch{
		files: map[string]string{
			filepath.Join(certDir, "fullchain.pem"):               string(certPEM),
			filepath.Join(certDir, "privkey.pem"):                 string(keyPEM),
			filepath.Join(etc, "chasquid.conf"):                   chasquidConfig(a, dir),
			filepath.Join(etc, "domains", "dest.test", "aliases"): chasquidAliases(),
		},
		argv: []string{filepath.Join(root, "usr/bin/chasquid"), "-config_dir", etc,
			"-testing__outgoing_smtp_port", sinkPort, "-logfile", filepath.Join(dir, "chasquid.log")},
		queueDirs: []string{filepath.Join(dir, "data", "queue")},
	}, nil
}

func maddyLaunch(pe *peerEnv, dir string, a peerAddrs) (launch, error) {
	bin, err := maddyBinary(pe.cache)
	if err != nil {
		return launch{}, err
	}
	pe.mu.Lock()
	pe.versions["maddy"] = "maddy " + strings.TrimPrefix(maddyModule[strings.Index(maddyModule, "@")+1:], "v")
	pe.mu.Unlock()
	for _, d := range []string{"state", "run", "queue"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return launch{}, err
		}
	}
	conf := filepath.Join(dir, "maddy.conf")
	return launch{
		files:     map[string]string{conf: maddyConfig(a, dir)},
		argv:      []string{bin, "--config", conf, "run"},
		queueDirs: []string{filepath.Join(dir, "queue")},
	}, nil
}

// root returns a peer's private root, unpacking it on first use.
func (pe *peerEnv) root(name string) (string, error) {
	kind, _ := peerKindOf(name)
	root, versions, err := debRoot(pe.cache, name, kind.debs)
	if err != nil {
		return "", err
	}
	pe.mu.Lock()
	pe.versions[name] = versions
	pe.mu.Unlock()
	return root, nil
}

// describe lists the peers' versions and configurations for the report.
func (pe *peerEnv) describe() string {
	if pe == nil {
		return ""
	}
	pe.mu.Lock()
	defer pe.mu.Unlock()
	var b bytes.Buffer
	for _, k := range peerKinds {
		v, ok := pe.versions[k.name]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "- %s (%s): %s\n", k.title, strings.ReplaceAll(v, "\n", ", "), k.note)
	}
	return b.String()
}
