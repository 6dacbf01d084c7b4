package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// Loopback addresses: every party is its own "host". The load generator
// does not bind a source address: binding before connect would make the
// kernel reserve an ephemeral port per address, and -reuse=false opens
// thousands of connections.
const (
	ipPostfix   = "127.0.0.20"
	ipGreyrelay = "127.0.0.30"
	ipSink      = "127.0.0.40"
	ipSlowSink  = "127.0.0.41" // the deferring or black-holed destination
)

// Destination domains of the benchmark's mail.
const (
	domainHealthy = "dest.test"
	domainSlow    = "slow.test"
)

// sut is a system under test: an MTA relaying from a load generator to a
// sink.
type sut interface {
	Name() string
	SMTPAddr() string
	QueueDir() string          // where its queue lives (for the disk device)
	Pids() []int               // its processes now
	QueueEmpty() (bool, error) // nothing left to deliver
	Stop() error
}

// grouped is a system whose processes all live in one cgroup: its CPU
// time and system calls are counted there.
type grouped interface {
	group() *cgroup // nil when it is counted by /proc instead
}

// --- greyrelay ---

// greyrelay is one `greyrelay serve` process in its own directory.
type greyrelay struct {
	bin, dir, cfgPath, logPath string
	smtp, admin                string
	cmd                        *exec.Cmd
	done                       chan struct{}
	exitErr                    error
	cg                         *cgroup // nil: counted by its pid in /proc
}

// grOptions is what a benchmark varies in the relay's config.
type grOptions struct {
	Routes map[string]string // domain → sink address
	Extra  map[string]any    // further top-level sections merged over the bench defaults (e.g. "retry")
	// ProxyListener, if set, adds a listener there that expects a PROXY
	// header from 127.0.0.1 (HAProxy in front of several nodes).
	ProxyListener string
}

// grConfig renders the relay's YAML: loopback listener and admin server,
// the queue in dir, routes to the sinks, and no DNS (a loopback resolver
// that is never asked, because every domain has a route).
func grConfig(dir, smtpAddr, adminAddr string, o grOptions, sets []string) ([]byte, error) {
	delivery := map[string]any{
		"allow_private_destinations": true,
		"resolver":                   "127.0.0.1:53",
		"routes":                     o.Routes,
	}
	c := map[string]any{
		"hostname":         "greyrelay.bench.test",
		"listeners":        []any{map[string]any{"address": smtpAddr, "mode": "smtp"}},
		"trusted_networks": []string{"127.0.0.0/8"},
		"queue":            map[string]any{"path": filepath.Join(dir, "queue", "queue.db")},
		"admin":            map[string]any{"address": adminAddr},
		"log":              map[string]any{"format": "json", "level": "info"},
		"delivery":         delivery,
	}
	if o.ProxyListener != "" {
		c["listeners"] = append(c["listeners"].([]any), map[string]any{"address": o.ProxyListener, "mode": "smtp", "proxy_protocol": true})
		c["proxy_protocol"] = map[string]any{"trusted": []string{"127.0.0.1/32"}}
	}
	for k, v := range o.Extra {
		if m, ok := v.(map[string]any); ok {
			if base, ok := c[k].(map[string]any); ok {
				for kk, vv := range m {
					base[kk] = vv
				}
				continue
			}
		}
		c[k] = v
	}
	for _, kv := range sets {
		if err := setPath(c, kv); err != nil {
			return nil, err
		}
	}
	return yaml.Marshal(c)
}

// setPath applies one "a.b.c=value" override; the value is parsed as YAML
// so that numbers, booleans and lists keep their type.
func setPath(c map[string]any, kv string) error {
	path, raw, _ := strings.Cut(kv, "=")
	var v any
	if err := yaml.Unmarshal([]byte(raw), &v); err != nil {
		return fmt.Errorf("-set %s: %w", kv, err)
	}
	keys := strings.Split(path, ".")
	m := c
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
	return nil
}

// startGreyrelay writes the config into a fresh directory and starts the
// relay. It returns once the listener greets and /readyz answers 200.
func startGreyrelay(e *env, bin string, o grOptions) (*greyrelay, error) {
	dir, err := e.dir("greyrelay")
	if err != nil {
		return nil, err
	}
	g := &greyrelay{bin: bin, dir: dir, cfgPath: filepath.Join(dir, "greyrelay.yaml"), logPath: filepath.Join(dir, "relay.log")}
	g.cg, _ = e.group(filepath.Base(dir)) // without cgroup2, /proc counts the one process as well
	if g.smtp, err = freeAddr(ipGreyrelay); err != nil {
		return nil, err
	}
	if g.admin, err = freeAddr(ipGreyrelay); err != nil {
		return nil, err
	}
	cfg, err := grConfig(dir, g.smtp, g.admin, o, e.sets)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(g.cfgPath, cfg, 0o600); err != nil {
		return nil, err
	}
	e.defer_(func() { _ = g.Stop() })
	if _, err := g.start(60 * time.Second); err != nil {
		return nil, err
	}
	return g, nil
}

// start runs the process and waits until it answers SMTP (the returned
// duration: exec to first 220) and then /readyz.
func (g *greyrelay) start(timeout time.Duration) (time.Duration, error) {
	logf, err := os.OpenFile(g.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command(g.bin, "serve", "-config", g.cfgPath)
	cmd.Dir, cmd.Stdout, cmd.Stderr = g.dir, logf, logf
	cmd.Env = peers.CleanEnv()
	release := func() {}
	if g.cg != nil {
		if cmd.SysProcAttr, release, err = g.cg.procAttr(); err != nil {
			return 0, err
		}
	}
	t0 := time.Now()
	err = cmd.Start()
	release()
	if err != nil {
		return 0, err
	}
	g.cmd, g.done, g.exitErr = cmd, make(chan struct{}), nil
	go func() { g.exitErr = cmd.Wait(); close(g.done) }()
	deadline := t0.Add(timeout)
	var greeted time.Duration
	for greeted == 0 {
		if err := g.exited(); err != nil {
			return 0, err
		}
		if peers.Greets(g.smtp, false) == nil {
			greeted = time.Since(t0)
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("greyrelay: no SMTP greeting within %v\n%s", timeout, tailFile(g.logPath, 30))
		}
		time.Sleep(5 * time.Millisecond)
	}
	for {
		if code, _, err := g.get("/readyz"); err == nil && code == http.StatusOK {
			return greeted, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("greyrelay: /readyz not 200 within %v\n%s", timeout, tailFile(g.logPath, 30))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (g *greyrelay) exited() error {
	select {
	case <-g.done:
		return fmt.Errorf("greyrelay exited: %v\n%s", g.exitErr, tailFile(g.logPath, 30))
	default:
		return nil
	}
}

func (g *greyrelay) Name() string     { return "greyrelay" }
func (g *greyrelay) SMTPAddr() string { return g.smtp }
func (g *greyrelay) QueueDir() string { return filepath.Join(g.dir, "queue") }
func (g *greyrelay) Pids() []int {
	if g.cmd == nil || g.exited() != nil {
		return nil
	}
	if g.cg != nil {
		return g.cg.procs()
	}
	return []int{g.cmd.Process.Pid}
}

func (g *greyrelay) group() *cgroup { return g.cg }

// relayStats is the part of GET /api/stats the benchmark reads.
type relayStats struct {
	ByStatus   map[string]int `json:"by_status"`
	Messages   int            `json:"messages"`
	Recipients int            `json:"recipients"`
	DBBytes    int64          `json:"db_bytes"`
}

func (g *greyrelay) stats() (relayStats, error) {
	var st relayStats
	code, body, err := g.get("/api/stats")
	if err != nil {
		return st, err
	}
	if code != http.StatusOK {
		return st, fmt.Errorf("/api/stats: %d %s", code, body)
	}
	return st, json.Unmarshal(body, &st)
}

// QueueEmpty: no message left (a message is deleted with its last final
// recipient).
func (g *greyrelay) QueueEmpty() (bool, error) {
	st, err := g.stats()
	return err == nil && st.Messages == 0, err
}

var httpClient = &http.Client{Timeout: 60 * time.Second}

func (g *greyrelay) get(path string) (int, []byte, error) {
	resp, err := httpClient.Get("http://" + g.admin + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Stop sends SIGTERM and waits up to 30 s, then SIGKILL.
func (g *greyrelay) Stop() error {
	if g.cmd == nil || g.exited() != nil {
		return nil
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
		return nil
	case <-time.After(30 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
		return errors.New("greyrelay: killed after 30 s")
	}
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// --- Postfix ---

// postfix is a private Postfix instance from integration/peers, relaying
// dest.test to the sink, with Postfix's defaults otherwise (fsync on,
// default_process_limit 100, in_flow_delay 1s, connection cache on demand).
type postfix struct {
	px *peers.Postfix
	cg *cgroup // nil: its processes are found by working directory
}

// startPostfix starts an instance relaying each route's domain to its sink.
// messageLimit raises message_size_limit (default 10240000) for the 10 MB
// runs.
func startPostfix(e *env, routes map[string]string, messageLimit int) (*postfix, error) {
	listen, err := freeAddr(ipPostfix)
	if err != nil {
		return nil, err
	}
	var transports []string
	var domains []string
	for d, addr := range routes {
		h, p, _ := net.SplitHostPort(addr)
		transports = append(transports, fmt.Sprintf("%s=smtp:[%s]:%s", d, h, p))
		domains = append(domains, d)
	}
	main := map[string]string{
		"transport_maps":        "inline:{" + strings.Join(transports, ", ") + "}",
		"default_process_limit": "100",
		"message_size_limit":    fmt.Sprint(max(messageLimit, 10240000)),
		"mailbox_size_limit":    fmt.Sprint(max(messageLimit, 51200000)),
	}
	px := peers.StartPostfix(e.tb("postfix"), peers.PostfixConfig{Listen: listen, Hostname: "postfix.bench.test",
		RelayDomains: domains, BindAddress: ipPostfix, Main: main})
	p := &postfix{px: px}
	// Postfix daemonizes, so it cannot be started inside a cgroup: its
	// processes move in once running, and the master's later children
	// are born there.
	if cg, err := e.group(filepath.Base(px.Dir)); err == nil {
		p.cg = cg
		for _, pid := range peers.ProcessesIn(p.QueueDir()) {
			if err := cg.add(pid); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

func (p *postfix) Name() string     { return "postfix" }
func (p *postfix) SMTPAddr() string { return p.px.Listen }
func (p *postfix) QueueDir() string { return filepath.Join(p.px.Dir, "spool") }
func (p *postfix) Pids() []int {
	if p.cg != nil {
		return p.cg.procs()
	}
	return peers.ProcessesIn(p.QueueDir())
}
func (p *postfix) group() *cgroup            { return p.cg }
func (p *postfix) QueueEmpty() (bool, error) { return p.px.QueueEmpty(), nil }
func (p *postfix) Stop() error               { p.px.Stop(); return nil }
