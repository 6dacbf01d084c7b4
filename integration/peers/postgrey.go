package peers

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Postgrey is a running postgrey policy server with a fresh database.
type Postgrey struct {
	Addr    string        // host:port of the policy service (check_policy_service inet:Addr)
	Delay   time.Duration // greylisting delay, whole seconds
	Dir     string        // the database directory, owned by the postgrey user
	LogPath string        // postgrey's stdout and stderr: every decision is logged there

	p *proc
}

// StartPostgrey runs postgrey on addr ("" means 127.0.0.1 on a free port)
// with the given delay (rounded up to whole seconds), in the foreground,
// with a database in a fresh t.TempDir() (so it remembers nothing) and the
// settings a test needs to predict it: triplets keyed on the full client IP
// (--lookup-by-host), no automatic whitelisting of clients, empty
// whitelists. It waits until postgrey answers a policy request, and stops
// it in t.Cleanup.
func StartPostgrey(t testing.TB, addr string, delay time.Duration) *Postgrey {
	t.Helper()
	Require(t, "postgrey")
	if addr == "" {
		addr = FreeAddr(t, "127.0.0.1")
	}
	secs := int(math.Ceil(delay.Seconds()))
	dir := t.TempDir()
	db := filepath.Join(dir, "db")
	if err := os.Mkdir(db, 0o700); err != nil {
		t.Fatalf("peers: %v", err)
	}
	chownTo(t, db, "postgrey", "")
	traversable(t, dir)
	g := &Postgrey{Addr: addr, Delay: time.Duration(secs) * time.Second, Dir: db, LogPath: filepath.Join(dir, "postgrey.log")}
	cmd := exec.Command(mustLookPath(t, "postgrey"),
		"--inet="+addr, "--delay="+strconv.Itoa(secs), "--dbdir="+db, "--pidfile="+filepath.Join(db, "postgrey.pid"),
		"--lookup-by-host", "--auto-whitelist-clients=0", "--max-age=1",
		"--whitelist-clients=/dev/null", "--whitelist-recipients=/dev/null")
	cmd.Dir = dir
	p, err := startProc(cmd, g.LogPath)
	if err != nil {
		t.Fatalf("peers: %v", err)
	}
	g.p = p
	t.Cleanup(func() {
		if err := p.stop(stopGrace); err != nil {
			t.Logf("peers: postgrey stop: %v", err)
		}
		if t.Failed() {
			t.Logf("peers: postgrey log:\n%s", tail(g.Log(), 50))
		}
	})
	if err := poll(readyTimeout, g.ready); err != nil {
		t.Fatalf("peers: postgrey not ready: %v\n%s", err, g.Log())
	}
	return g
}

// ready asks postgrey about a throw-away triplet: an answer means it has
// bound its port, dropped privileges and opened its database.
func (g *Postgrey) ready() error {
	if done, err := g.p.exited(); done {
		return fmt.Errorf("postgrey exited (%v): %w", err, errStopPolling)
	}
	action, err := g.Query("127.255.255.254", "ready@peers.invalid", "ready@peers.invalid")
	if err != nil {
		return err
	}
	if !strings.HasPrefix(action, "action=") {
		return fmt.Errorf("postgrey answered %q", action)
	}
	return nil
}

// Query sends one Postfix policy request (RCPT stage) and returns the
// answer line ("action=DEFER_IF_PERMIT Greylisted, ..." or
// "action=PREPEND X-Greylist: ..." or "action=DUNNO").
func (g *Postgrey) Query(clientIP, sender, recipient string) (string, error) {
	conn, err := net.DialTimeout("tcp", g.Addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	req := fmt.Sprintf("request=smtpd_access_policy\nprotocol_state=RCPT\nprotocol_name=ESMTP\n"+
		"client_address=%s\nclient_name=unknown\nhelo_name=client.test\nsender=%s\nrecipient=%s\n\n",
		clientIP, sender, recipient)
	if _, err := io.WriteString(conn, req); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

// Log returns postgrey's output so far.
func (g *Postgrey) Log() string { return readFile(g.LogPath) }

// chownTo gives path to the named user and (if not empty) group.
func chownTo(t testing.TB, path, userName, groupName string) {
	t.Helper()
	u, err := user.Lookup(userName)
	if err != nil {
		t.Fatalf("peers: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid := -1
	if groupName != "" {
		g, err := user.LookupGroup(groupName)
		if err != nil {
			t.Fatalf("peers: %v", err)
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatalf("peers: %v", err)
	}
}
