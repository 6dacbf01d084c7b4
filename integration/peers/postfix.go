package peers

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PostfixConfig describes a private Postfix instance. One instance can play
// both roles: a destination (it accepts mail for RelayDomains on Listen)
// and a client (it sends what it accepted or what Sendmail injected).
type PostfixConfig struct {
	Listen   string // smtpd listener "ip:port"; default 127.0.0.1 on a free port
	Hostname string // myhostname, its EHLO name and greeting; default "postfix.test"

	// Destination role.
	RelayDomains    []string  // accept mail for these domains (relay_domains)
	KnownRecipients []string  // if set, other recipients get 550 5.1.1 (relay_recipient_maps)
	DeliverTo       string    // host:port (a Sink) that mail for RelayDomains is passed on to, so a test can read the exact bytes
	Postgrey        *Postgrey // greylist at RCPT time via check_policy_service
	ServerCert      *Cert     // offer STARTTLS with this certificate (smtpd_tls_security_level = may)

	// Client role (a smarthost user).
	RelayHost              string // relayhost, e.g. "[127.0.0.1]:2525"
	SASLUser, SASLPassword string // AUTH to RelayHost (needs TLSLevel "encrypt" or "may" with a TLS server)
	TLSLevel               string // smtp_tls_security_level: none, may, encrypt...; default none
	BindAddress            string // smtp_bind_address: the source IP of its deliveries; default the Listen IP

	MyNetworks []string          // trusted clients (may relay anywhere); default 127.0.0.0/8
	Main       map[string]string // further main.cf parameters; they win over everything above
}

// Postfix is a running private Postfix instance: its own main.cf,
// master.cf, queue and data directory in one t.TempDir(), its own log file.
type Postfix struct {
	Dir     string // everything lives here: etc/, spool/, data/, maillog
	Listen  string // the smtpd listener address
	LogPath string // maillog_file: every connection, reject and delivery
	Config  PostfixConfig

	etc     string
	p       *proc
	stopped bool
}

// StartPostfix writes the instance's configuration, runs
// `postfix -c DIR/etc start-fg` (so the master process is a child of this
// test, not of init) and waits up to 20 s for the listener's 220. It stops
// the instance in t.Cleanup. A start failure reports `postfix check`, the
// start output and the maillog, because Postfix says why it refused a
// config nowhere else.
func StartPostfix(t testing.TB, c PostfixConfig) *Postfix {
	t.Helper()
	Require(t, "postfix")
	if c.Listen == "" {
		c.Listen = FreeAddr(t, "127.0.0.1")
	}
	dir := t.TempDir()
	traversable(t, dir)
	px := &Postfix{Dir: dir, Listen: c.Listen, LogPath: filepath.Join(dir, "maillog"), Config: c, etc: filepath.Join(dir, "etc")}
	px.writeConfig(t)
	cmd := exec.Command(mustLookPath(t, "postfix"), "-c", px.etc, "start-fg")
	cmd.Dir = dir
	p, err := startProc(cmd, filepath.Join(dir, "start.log"))
	if err != nil {
		t.Fatalf("peers: %v", err)
	}
	px.p = p
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("peers: postfix %s maillog:\n%s", px.Listen, tail(px.Log(), 60))
		}
		if err := px.stop(); err != nil {
			t.Errorf("peers: postfix stop: %v", err)
		}
	})
	if err := poll(readyTimeout, px.ready); err != nil {
		t.Fatalf("peers: postfix %s did not start: %v\n%s", px.Listen, err, px.diagnose())
	}
	return px
}

// writeConfig creates the directory tree and both config files.
func (px *Postfix) writeConfig(t testing.TB) {
	t.Helper()
	for _, d := range []string{"etc", "spool"} {
		if err := os.Mkdir(filepath.Join(px.Dir, d), 0o755); err != nil {
			t.Fatalf("peers: %v", err)
		}
	}
	px.makeQueue(t)
	// Every Postfix program waits, 300 ms at a time, until main.cf is
	// more than a second old (it might still be being edited): backdating
	// the files saves 1.5 s per start and per sendmail or postqueue run.
	old := time.Now().Add(-time.Minute)
	for name, text := range map[string]string{"main.cf": px.mainCF(), "master.cf": px.masterCF()} {
		path := filepath.Join(px.etc, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatalf("peers: %v", err)
		}
		if err := os.Chtimes(path, old, old); err != nil {
			t.Fatalf("peers: %v", err)
		}
	}
}

// queueLayout is postfix-files' list of directories below the queue
// directory, with owner, group and mode.
var queueLayout = []struct {
	name, owner, group string
	mode               os.FileMode
}{
	{"active", "postfix", "", 0o700}, {"bounce", "postfix", "", 0o700}, {"corrupt", "postfix", "", 0o700},
	{"defer", "postfix", "", 0o700}, {"deferred", "postfix", "", 0o700}, {"flush", "postfix", "", 0o700},
	{"hold", "postfix", "", 0o700}, {"incoming", "postfix", "", 0o700}, {"private", "postfix", "", 0o700},
	{"saved", "postfix", "", 0o700}, {"trace", "postfix", "", 0o700},
	{"maildrop", "postfix", "postdrop", 0o730}, {"public", "postfix", "postdrop", 0o710},
	{"pid", "root", "", 0o755},
}

// makeQueue creates the queue and data directories as `postfix check`
// would, and asks for a quick start: postfix-script's checks (which would
// create them) take about 1.5 s of every start. A start failure still runs
// `postfix check` for its diagnosis.
func (px *Postfix) makeQueue(t testing.TB) {
	t.Helper()
	spool := filepath.Join(px.Dir, "spool")
	mk := func(path, owner, group string, mode os.FileMode) {
		if err := os.Mkdir(path, mode); err != nil {
			t.Fatalf("peers: %v", err)
		}
		chownTo(t, path, owner, group)
		if err := os.Chmod(path, mode); err != nil { // Mkdir's mode is filtered by the umask
			t.Fatalf("peers: %v", err)
		}
	}
	for _, d := range queueLayout {
		mk(filepath.Join(spool, d.name), d.owner, d.group, d.mode)
	}
	mk(filepath.Join(px.Dir, "data"), "postfix", "", 0o700) // data_directory belongs to mail_owner
	if err := os.WriteFile(filepath.Join(spool, "quick-start"), nil, 0o644); err != nil {
		t.Fatalf("peers: %v", err)
	}
}

// mainCF renders main.cf. Timers are shortened so that a deferred message
// is retried within seconds, and smtpd answers errors without its usual
// one-second pause.
func (px *Postfix) mainCF() string {
	c := px.Config
	listenIP, _, _ := net.SplitHostPort(c.Listen)
	p := &params{}
	p.set("compatibility_level", "3.6")
	p.set("queue_directory", filepath.Join(px.Dir, "spool"))
	p.set("data_directory", filepath.Join(px.Dir, "data"))
	p.set("mail_owner", "postfix")
	p.set("setgid_group", "postdrop")
	p.set("myhostname", cmp.Or(c.Hostname, "postfix.test"))
	p.set("mydestination", "")
	p.set("inet_interfaces", "loopback-only")
	p.set("inet_protocols", "ipv4")
	p.set("mynetworks", strings.Join(orDefault(c.MyNetworks, "127.0.0.0/8"), ", "))
	p.set("maillog_file", px.LogPath)
	p.set("maillog_file_prefixes", px.Dir)
	p.set("alias_maps", "")
	p.set("alias_database", "")
	p.set("smtputf8_enable", "no")
	p.set("biff", "no")
	p.set("append_dot_mydomain", "no")
	p.set("smtp_dns_support_level", "disabled") // next hops are IP literals: no DNS at all
	p.set("smtpd_peername_lookup", "no")        // no reverse lookups of 127.0.0.x
	p.set("smtpd_error_sleep_time", "0")
	p.set("smtpd_hard_error_limit", "1000")
	p.set("queue_run_delay", "1s")
	p.set("minimal_backoff_time", "1s")
	p.set("maximal_backoff_time", "2s")
	p.set("smtp_connect_timeout", "5s")
	p.set("smtp_tls_loglevel", "1")
	p.set("smtpd_tls_loglevel", "1")
	p.set("smtp_bind_address", cmp.Or(c.BindAddress, listenIP))
	px.destinationParams(p)
	px.clientParams(p)
	for _, k := range slices.Sorted(maps.Keys(c.Main)) {
		p.set(k, c.Main[k])
	}
	return p.String()
}

// destinationParams sets what makes the instance accept mail.
func (px *Postfix) destinationParams(p *params) {
	c := px.Config
	p.set("relay_domains", strings.Join(c.RelayDomains, ", "))
	if c.DeliverTo != "" {
		var routes []string
		for _, d := range c.RelayDomains {
			routes = append(routes, fmt.Sprintf("%s=smtp:[%s]:%s", d, hostOf(c.DeliverTo), portOf(c.DeliverTo)))
		}
		p.set("transport_maps", "inline:{"+strings.Join(routes, ", ")+"}")
	}
	if len(c.KnownRecipients) > 0 {
		var keys []string
		for _, r := range c.KnownRecipients {
			keys = append(keys, r+"=ok")
		}
		p.set("relay_recipient_maps", "inline:{"+strings.Join(keys, ", ")+"}")
	}
	if c.Postgrey != nil {
		p.set("smtpd_recipient_restrictions", "reject_unauth_destination, check_policy_service inet:"+c.Postgrey.Addr)
	}
	if c.ServerCert != nil {
		p.set("smtpd_tls_cert_file", c.ServerCert.CertFile)
		p.set("smtpd_tls_key_file", c.ServerCert.KeyFile)
		p.set("smtpd_tls_security_level", "may")
	}
}

// clientParams sets how the instance sends mail on.
func (px *Postfix) clientParams(p *params) {
	c := px.Config
	if c.RelayHost != "" {
		p.set("relayhost", c.RelayHost)
	}
	if c.TLSLevel != "" {
		p.set("smtp_tls_security_level", c.TLSLevel)
	}
	if c.SASLUser != "" {
		p.set("smtp_sasl_auth_enable", "yes")
		p.set("smtp_sasl_password_maps", fmt.Sprintf("inline:{ {%s = %s:%s} }", c.RelayHost, c.SASLUser, c.SASLPassword))
		p.set("smtp_sasl_security_options", "noanonymous")
		p.set("smtp_sasl_tls_security_options", "noanonymous")
	}
}

// masterCF lists the listener first, then the internal services (none
// chrooted: the chroot would need a copy of /etc in the spool) and postlogd
// for maillog_file.
func (px *Postfix) masterCF() string {
	return px.Listen + " inet n - n - - smtpd\n" + `pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
tlsmgr    unix  -       -       n       1000?   1       tlsmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
proxywrite unix -       -       n       -       1       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
local     unix  -       n       n       -       -       local
virtual   unix  -       n       n       -       -       virtual
lmtp      unix  -       -       n       -       -       lmtp
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
`
}

// ready is one readiness probe: master still running, listener greeting.
func (px *Postfix) ready() error {
	if done, err := px.p.exited(); done {
		return fmt.Errorf("postfix start-fg exited (%v): %w", err, errStopPolling)
	}
	return Greets(px.Listen, false)
}

// diagnose collects what explains a failed start.
func (px *Postfix) diagnose() string {
	var b strings.Builder
	section := func(title, text string) {
		fmt.Fprintf(&b, "--- %s:\n%s", title, text)
		if !strings.HasSuffix(text, "\n") {
			b.WriteByte('\n')
		}
	}
	section("postfix -c "+px.etc+" check", px.check())
	section("start-fg output", readFile(filepath.Join(px.Dir, "start.log")))
	section("maillog", tail(px.Log(), 60))
	section("main.cf", readFile(filepath.Join(px.etc, "main.cf")))
	return b.String()
}

// check runs `postfix check`. Postfix prints its complaints only to a
// terminal (or its log), so it runs under script(1) when available.
func (px *Postfix) check() string {
	bin, _ := lookPath("postfix")
	args := []string{bin, "-c", px.etc, "check"}
	var cmd *exec.Cmd
	if script, err := lookPath("script"); err == nil {
		cmd = exec.Command(script, "-qec", strings.Join(args, " "), "/dev/null")
	} else {
		cmd = exec.Command(args[0], args[1:]...)
	}
	out, err := runBounded(cmd, 15*time.Second)
	return fmt.Sprintf("%s(exit: %v)\n", out, err)
}

// Log returns the instance's maillog so far.
func (px *Postfix) Log() string { return readFile(px.LogPath) }

// WaitLog returns the maillog once it contains every one of want, or as it
// is after timeout. Postfix writes its log through postlogd, a little
// after the SMTP reply that the line describes, so a test that has its
// reply must still wait for the line (a loaded CI machine showed it).
func (px *Postfix) WaitLog(timeout time.Duration, want ...string) string {
	end := time.Now().Add(timeout)
	for {
		log := px.Log()
		missing := false
		for _, w := range want {
			missing = missing || !strings.Contains(log, w)
		}
		if !missing || time.Now().After(end) {
			return log
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Sendmail injects a message through the instance's sendmail (-C DIR/etc),
// as a local program would: it goes through pickup and the queue, then on to
// RelayHost or the transport map.
func (px *Postfix) Sendmail(t testing.TB, from string, to []string, msg []byte) {
	t.Helper()
	args := append([]string{"-C", px.etc, "-f", from, "-i", "--"}, to...)
	cmd := exec.Command(mustLookPath(t, "sendmail"), args...)
	cmd.Stdin = bytes.NewReader(msg)
	if out, err := runBounded(cmd, 30*time.Second); err != nil {
		t.Fatalf("peers: sendmail %v: %v\n%s", args, err, out)
	}
}

// Queue returns `postqueue -p`: what is waiting, and why.
func (px *Postfix) Queue(t testing.TB) string {
	t.Helper()
	out, err := runBounded(exec.Command(mustLookPath(t, "postqueue"), "-c", px.etc, "-p"), 15*time.Second)
	if err != nil {
		t.Fatalf("peers: postqueue -p: %v\n%s", err, out)
	}
	return out
}

// Flush asks Postfix to retry every deferred message now (postqueue -f).
func (px *Postfix) Flush(t testing.TB) {
	t.Helper()
	out, err := runBounded(exec.Command(mustLookPath(t, "postqueue"), "-c", px.etc, "-f"), 15*time.Second)
	if err != nil {
		t.Fatalf("peers: postqueue -f: %v\n%s", err, out)
	}
}

// queueDirs are the queues a message passes through or waits in.
var queueDirs = []string{"maildrop", "incoming", "active", "deferred", "hold"}

// QueueEmpty reports whether no message is queued (counting queue files,
// so it works whether or not the instance is running).
func (px *Postfix) QueueEmpty() bool {
	n := 0
	for _, q := range queueDirs {
		_ = filepath.WalkDir(filepath.Join(px.Dir, "spool", q), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				n++
			}
			return nil
		})
	}
	return n == 0
}

// WaitQueueEmpty waits until the queue is empty (everything delivered or
// bounced), and fails the test with the queue and log after timeout.
func (px *Postfix) WaitQueueEmpty(t testing.TB, timeout time.Duration) {
	t.Helper()
	err := poll(timeout, func() error {
		if px.QueueEmpty() {
			return nil
		}
		return fmt.Errorf("queue not empty")
	})
	if err != nil {
		t.Fatalf("peers: postfix %s: %v\n%s\nmaillog:\n%s", px.Listen, err, px.Queue(t), tail(px.Log(), 40))
	}
}

// Stop stops the instance (postfix stop, then abort, then SIGKILL) and
// waits until none of its processes is left. Later calls do nothing.
func (px *Postfix) Stop() {
	_ = px.stop()
}

func (px *Postfix) stop() error {
	if px.stopped {
		return nil
	}
	px.stopped = true
	bin, _ := lookPath("postfix")
	for _, verb := range []string{"stop", "abort"} {
		if done, _ := px.p.exited(); done {
			break
		}
		_, _ = runBounded(exec.Command(bin, "-c", px.etc, verb), 10*time.Second)
		px.p.wait(5 * time.Second)
	}
	px.p.kill()
	// Daemons that outlive the master would keep writing into the
	// directory that t.TempDir's cleanup is about to remove.
	spool := filepath.Join(px.Dir, "spool")
	err := poll(10*time.Second, func() error {
		left := ProcessesIn(spool)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(left) > 0 {
			return fmt.Errorf("processes %v still in %s", left, spool)
		}
		return nil
	})
	return err
}

// ProcessesIn lists live processes whose working directory is dir or below
// (every Postfix daemon chdirs to its queue directory). Zombies have no
// working directory and are not listed.
func ProcessesIn(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// runBounded runs cmd with a time limit and returns its combined output.
func runBounded(cmd *exec.Cmd, limit time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	c.Dir, c.Env, c.Stdin = cmd.Dir, cmd.Env, cmd.Stdin
	out, err := c.CombinedOutput()
	return string(out), err
}

// params is an ordered main.cf: a later set of the same name replaces the
// value in place (Postfix itself would warn about a duplicate).
type params struct {
	names  []string
	values map[string]string
}

func (p *params) set(name, value string) {
	if p.values == nil {
		p.values = map[string]string{}
	}
	if _, ok := p.values[name]; !ok {
		p.names = append(p.names, name)
	}
	p.values[name] = value
}

func (p *params) String() string {
	var b strings.Builder
	b.WriteString("# written by greyrelay's integration/peers\n")
	for _, n := range p.names {
		fmt.Fprintf(&b, "%s = %s\n", n, p.values[n])
	}
	return b.String()
}

func hostOf(addr string) string { h, _, _ := net.SplitHostPort(addr); return h }
func portOf(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

func orDefault(v []string, def ...string) []string {
	if len(v) == 0 {
		return def
	}
	return v
}
