package peers

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Redis is a private redis-server in the foreground (a child of the test,
// so the test can kill it and start it again on the same address).
type Redis struct {
	Addr    string // host:port
	Dir     string
	LogPath string
	t       testing.TB
	proc    *proc
}

// StartRedis starts redis-server on addr ("" picks a free port on
// 127.0.0.1) without persistence, and waits until it answers PING.
func StartRedis(t testing.TB, addr string) *Redis {
	t.Helper()
	Require(t, "redis-server")
	if addr == "" {
		addr = FreeAddr(t, Loopback(1))
	}
	dir := t.TempDir()
	r := &Redis{Addr: addr, Dir: dir, LogPath: filepath.Join(dir, "redis.log"), t: t}
	t.Cleanup(func() {
		if r.proc != nil {
			r.proc.kill()
		}
		if t.Failed() {
			t.Logf("peers: redis log:\n%s", tail(readFile(r.LogPath), 30))
		}
	})
	r.Start()
	return r
}

// Start runs redis-server (again, after Kill) and waits until it answers.
func (r *Redis) Start() {
	r.t.Helper()
	host, port, _ := net.SplitHostPort(r.Addr)
	cmd := exec.Command(mustLookPath(r.t, "redis-server"), "--port", port, "--bind", host,
		"--save", "", "--appendonly", "no", "--dir", r.Dir, "--daemonize", "no")
	cmd.Dir, cmd.Env = r.Dir, CleanEnv()
	p, err := startProc(cmd, r.LogPath)
	if err != nil {
		r.t.Fatalf("peers: %v", err)
	}
	r.proc = p
	err = poll(20*time.Second, func() error {
		if done, err := p.exited(); done {
			return fmt.Errorf("redis-server exited (%v): %w", err, errStopPolling)
		}
		reply, err := r.Command("PING")
		if err == nil && reply != "+PONG" {
			err = fmt.Errorf("PING: %q", reply)
		}
		return err
	})
	if err != nil {
		r.t.Fatalf("peers: redis not ready: %v\n%s", err, readFile(r.LogPath))
	}
}

// Kill ends redis-server with SIGKILL.
func (r *Redis) Kill() { r.proc.kill() }

// Command sends one inline command and returns the first line of the
// reply (e.g. "+PONG", ":3", "$5").
func (r *Redis) Command(cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\r\n", cmd); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

// CommandStats returns how many times each command ran (INFO
// commandstats: "get" → calls), commands run by scripts included.
func (r *Redis) CommandStats() (map[string]int64, error) {
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprint(c, "INFO commandstats\r\n"); err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	head, err := br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil {
		return nil, fmt.Errorf("peers: INFO reply %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for line := range strings.Lines(string(body)) {
		// cmdstat_get:calls=12,usec=30,...
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		if v, err := strconv.ParseInt(calls, 10, 64); err == nil {
			out[name] = v
		}
	}
	return out, nil
}
