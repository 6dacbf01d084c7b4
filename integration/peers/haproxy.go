package peers

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// HAProxy is a running HAProxy in TCP mode: one frontend that balances
// round robin over backends, sending each a PROXY protocol v2 header
// (send-proxy-v2) with the client's address, and health-checking them.
type HAProxy struct {
	Addr       string // the frontend's host:port
	ConfigPath string
	LogPath    string
	proc       *proc
}

// HAProxyConfig describes the balancer to start.
type HAProxyConfig struct {
	Listen   string   // frontend host:port; "" picks a free port on 127.0.0.1
	Backends []string // host:port of each node
	// Source is the address HAProxy connects to the backends from: the
	// address the nodes' proxy_protocol.trusted must hold. Default 127.0.0.1.
	Source string
	// ClientAddr, when set, is the client address HAProxy puts in its
	// PROXY headers instead of the real one (tcp-request connection
	// set-src): how a test on loopback shows the relay a client from
	// elsewhere.
	ClientAddr string
}

// StartHAProxy writes the configuration, starts `haproxy -db` in the
// foreground and waits until the frontend accepts connections.
func StartHAProxy(t testing.TB, c HAProxyConfig) *HAProxy {
	t.Helper()
	Require(t, "haproxy")
	dir := t.TempDir()
	if c.Listen == "" {
		c.Listen = FreeAddr(t, "127.0.0.1")
	}
	if c.Source == "" {
		c.Source = "127.0.0.1"
	}
	h := &HAProxy{Addr: c.Listen, ConfigPath: filepath.Join(dir, "haproxy.cfg"), LogPath: filepath.Join(dir, "haproxy.log")}
	if err := os.WriteFile(h.ConfigPath, []byte(haproxyConfig(c)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(mustLookPath(t, "haproxy"), "-f", h.ConfigPath, "-db")
	cmd.Dir, cmd.Env = dir, CleanEnv()
	p, err := startProc(cmd, h.LogPath)
	if err != nil {
		t.Fatalf("peers: %v", err)
	}
	h.proc = p
	t.Cleanup(func() {
		_ = p.stop(5 * time.Second)
		if t.Failed() {
			t.Logf("peers: haproxy log:\n%s", tail(readFile(h.LogPath), 40))
		}
	})
	err = poll(20*time.Second, func() error {
		if done, err := p.exited(); done {
			return fmt.Errorf("haproxy exited (%v): %w", err, errStopPolling)
		}
		conn, err := net.DialTimeout("tcp", h.Addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("peers: haproxy not ready: %v\n%s", err, readFile(h.LogPath))
	}
	return h
}

// haproxyConfig is the TCP balancer: the timeouts leave SMTP sessions
// alone; `check` makes HAProxy probe each node with a LOCAL header.
func haproxyConfig(c HAProxyConfig) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
    maxconn 2000
defaults
    mode tcp
    timeout connect 5s
    timeout client 5m
    timeout server 5m
frontend smtp_in
    bind %s
`, c.Listen)
	if c.ClientAddr != "" {
		fmt.Fprintf(&b, "    tcp-request connection set-src ipv4(%s)\n", c.ClientAddr)
	}
	fmt.Fprintf(&b, `    default_backend relays
backend relays
    balance roundrobin
    source %s
`, c.Source)
	for i, addr := range c.Backends {
		fmt.Fprintf(&b, "    server node%d %s send-proxy-v2 check inter 1s\n", i+1, addr)
	}
	return b.String()
}

// Stop ends HAProxy.
func (h *HAProxy) Stop() error { return h.proc.stop(5 * time.Second) }
