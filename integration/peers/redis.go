package peers

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	bin     string   // "redis-server" or "redis-sentinel"
	args    []string // the command line after bin; nil: a plain server
}

// StartRedis starts redis-server on addr ("" picks a free port on
// 127.0.0.1) without persistence, and waits until it answers PING.
func StartRedis(t testing.TB, addr string) *Redis {
	t.Helper()
	return startRedis(t, addr, "redis-server", nil)
}

// StartRedisWith is StartRedis with extra arguments for redis-server
// (relative paths are in the server's own directory), e.g. those of a
// Redis Cluster node.
func StartRedisWith(t testing.TB, addr string, args ...string) *Redis {
	t.Helper()
	return startRedis(t, addr, "redis-server", func(string) []string { return args })
}

// StartRedisReplica starts a redis-server replicating master.
func StartRedisReplica(t testing.TB, master *Redis) *Redis {
	t.Helper()
	host, port, _ := net.SplitHostPort(master.Addr)
	return startRedis(t, "", "redis-server", func(string) []string { return []string{"--replicaof", host, port} })
}

// StartSentinel starts a redis-sentinel that monitors master under name
// with quorum 1 (one sentinel decides) and short timeouts, and waits until
// it answers PING.
func StartSentinel(t testing.TB, name string, master *Redis) *Redis {
	t.Helper()
	Require(t, "redis-sentinel")
	host, port, _ := net.SplitHostPort(master.Addr)
	return startRedis(t, "", "redis-sentinel", func(dir string) []string {
		// Sentinel rewrites its configuration file: it lives in the
		// sentinel's own directory.
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 1\n"+
			"sentinel down-after-milliseconds %[1]s 2000\nsentinel failover-timeout %[1]s 10000\n"+
			"sentinel parallel-syncs %[1]s 1\n", name, host, port)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return []string{conf}
	})
}

// startRedis starts bin on addr ("" picks a free port); args, if set,
// gives the arguments before the common ones from the server's directory.
func startRedis(t testing.TB, addr, bin string, args func(dir string) []string) *Redis {
	t.Helper()
	Require(t, bin)
	if addr == "" {
		addr = FreeAddr(t, "127.0.0.1")
	}
	dir := t.TempDir()
	r := &Redis{Addr: addr, Dir: dir, LogPath: filepath.Join(dir, "redis.log"), t: t, bin: bin}
	if args != nil {
		r.args = args(dir)
	}
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
	argv := append(slices.Clone(r.args), "--port", port, "--bind", host, "--dir", r.Dir, "--daemonize", "no")
	if r.bin == "redis-server" {
		argv = append(argv, "--save", "", "--appendonly", "no")
	}
	cmd := exec.Command(mustLookPath(r.t, r.bin), argv...)
	cmd.Dir, cmd.Env = r.Dir, CleanEnv()
	p, err := startProc(cmd, r.LogPath)
	if err != nil {
		r.t.Fatalf("peers: %v", err)
	}
	r.proc = p
	err = poll(20*time.Second, func() error {
		if done, err := p.exited(); done {
			return fmt.Errorf("%s exited (%v): %w", r.bin, err, errStopPolling)
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

// Info returns INFO section's text ("replication", "commandstats").
func (r *Redis) Info(section string) (string, error) {
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "INFO %s\r\n", section); err != nil {
		return "", err
	}
	br := bufio.NewReader(c)
	head, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil {
		return "", fmt.Errorf("peers: INFO reply %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return "", err
	}
	return string(body), nil
}

// CommandStats returns how many times each command ran (INFO
// commandstats: "get" → calls), commands run by scripts included.
func (r *Redis) CommandStats() (map[string]int64, error) {
	body, err := r.Info("commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for line := range strings.Lines(body) {
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
