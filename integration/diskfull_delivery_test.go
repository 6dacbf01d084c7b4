package integration

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestDiskFullDeliveryGoesOn: a full queue disk degrades intake, never
// delivery. The queue has a 64 MiB tmpfs of its own (a dedicated queue
// volume) and the default limits; the next hop defers everything while
// eight clients send messages of 100-300 KB until the relay refuses them
// all.
//
//   - Intake stops with 452 4.3.1 before the disk is full: the relay keeps
//     a reserve, so the filesystem never reaches 0 bytes free.
//   - The operator's actions answer with a clear status (200 or 507,
//     never a bare 500) while the disk is as full as intake lets it get.
//   - While it waits for the next hop the relay is calm: under 5% of a
//     core, and under 100 log lines a minute.
//   - When the next hop comes back, every acknowledged message is
//     delivered within 60 s, without anyone freeing space.
func TestDiskFullDeliveryGoesOn(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a filesystem")
	}
	t.Parallel() // its tmpfs is its own; it measures the relay's CPU time, not the machine's
	relayIP, sinkIP := relaytest.Loopback(t), relaytest.Loopback(t)
	mnt := rbMountTmpfs(t, "64m")

	var open atomic.Bool
	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{Rcpt: func(string, int) *smtp.SMTPError {
		if open.Load() {
			return nil
		}
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "not yet"}
	}})
	cfg := rbRelay{IP: relayIP, QueuePath: filepath.Join(mnt, "q", "queue.db"),
		Limits: map[string]string{"max_message_bytes": fmt.Sprint(512 << 10)},
		// Retries every 10 s: the relay's own work while it waits stays
		// small, and the next hop's return is seen within 10 s.
		Retry:  map[string]string{"initial_interval": "10s", "max_interval": "10s"},
		Routes: map[string]string{"dest.test": sink.Addr}}
	r := peers.StartRelay(t, cfg.YAML(t))
	pid := r.Cmd.Process.Pid

	// The lowest free space seen while the clients send.
	var lowest atomic.Uint64
	lowest.Store(rbFree(t, mnt))
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var free uint64
			if f, err := freeOf(mnt); err == nil {
				free = f
			}
			if free < lowest.Load() {
				lowest.Store(free)
			}
		}
	}()

	led := newRBLedger()
	var seq atomic.Int64
	var wg sync.WaitGroup
	var fives atomic.Int64
	deadline := time.Now().Add(90 * time.Second)
	var clientIPs []string
	for range 8 {
		clientIPs = append(clientIPs, relaytest.Loopback(t))
	}
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 33))
			refusals := 0
			for refusals < 5 && time.Now().Before(deadline) {
				id := fmt.Sprintf("full.%d@diskfull.test", seq.Add(1))
				data := rbMessage(id, "full disk", 100<<10+rng.IntN(200<<10), rng)
				led.add(&rbSent{id: id, rcpts: []string{"user@dest.test"}, hash: rbHash(data)})
				conn, err := rbDialSMTP(r.SMTPAddr, clientIPs[c], false, "client.test")
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				rep, err := conn.Send(rbTx{From: "app@src.test", Rcpts: []string{"user@dest.test"}, Data: data})
				conn.Close()
				switch {
				case err != nil:
					t.Errorf("client %d: connection failed: %v", c, err)
					return
				case rep.Code == 250:
					led.ack(id, rep.String())
					refusals = 0
				case rep.Code/100 == 5:
					fives.Add(1)
					t.Errorf("client %d: %v: a full disk must never give a permanent refusal", c, rep)
					return
				default:
					refusals++
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	close(stopWatch)
	<-watched
	acked := led.acked()
	t.Logf("%d messages acknowledged; lowest free space %d bytes", len(acked), lowest.Load())
	if len(acked) < 20 {
		t.Fatalf("only %d messages acknowledged on a 64 MiB disk", len(acked))
	}
	// queue.reserve_percent is 5 by default; what a delivery's commit or
	// a client's spool file in flight takes from it meanwhile is small.
	if reserve := rbSize(t, mnt) * 5 / 100; lowest.Load() < reserve/2 {
		t.Errorf("the filesystem went down to %d bytes free: intake did not keep the reserve of %d", lowest.Load(), reserve)
	}

	// The operator's actions answer 200 or 507, never a bare 500.
	for _, path := range []string{"/api/queue/retry?all=1", "/api/queue/" + rbFirstID(t, r) + "/retry"} {
		code, body := rbPostAdmin(t, r, path)
		if code != http.StatusOK && code != http.StatusInsufficientStorage {
			t.Errorf("POST %s on a full disk: %d %s, want 200 or 507", path, code, body)
		}
	}

	// Waiting for the next hop: calm.
	linesBefore := rbProblemLines(r.Log())
	cpuBefore := rbCPUTicks(t, pid)
	start := time.Now()
	time.Sleep(10 * time.Second)
	ticks := rbCPUTicks(t, pid) - cpuBefore
	elapsed := time.Since(start)
	lines := rbProblemLines(r.Log()) - linesBefore
	cpu := float64(ticks) / 100 / elapsed.Seconds() // USER_HZ is 100 on Linux
	t.Logf("while waiting: %.1f%% of a core, %d log lines in %v", 100*cpu, lines, elapsed.Round(time.Millisecond))
	if cpu > 0.05 {
		t.Errorf("the relay used %.1f%% of a core while waiting on a full disk, want under 5%%", 100*cpu)
	}
	if perMin := float64(lines) / elapsed.Minutes(); perMin >= 100 {
		t.Errorf("%d log lines in %v (%.0f a minute), want under 100 a minute:\n%s", lines, elapsed, perMin,
			rbTail(r.Log(), 20))
	}

	// The next hop returns: everything is delivered, nobody frees space.
	open.Store(true)
	var idx rbSinkIndex
	rbWaitUntil(t, 60*time.Second, "delivery of every acknowledged message", func() bool {
		idx = rbIndexSink(sink.Messages())
		return len(idx.missing(acked)) == 0
	})
	for _, s := range acked {
		for _, h := range idx.byID[s.id]["user@dest.test"] {
			if h != s.hash {
				t.Errorf("%s arrived altered", s.id)
			}
		}
	}
	if !r.Running() || r.Cmd.Process.Pid != pid {
		t.Fatalf("the relay died or was restarted")
	}
}

// rbSize is the size of the filesystem holding dir.
func rbSize(t *testing.T, dir string) uint64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * uint64(st.Bsize)
}

// freeOf is rbFree without a test (for a watching goroutine).
func freeOf(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// rbCPUTicks is the user and system CPU time of pid, in clock ticks
// (/proc/PID/stat fields 14 and 15).
func rbCPUTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // field 3 onwards
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	return utime + stime
}

// rbFirstID is the queue ID of the first recipient GET /api/queue lists.
func rbFirstID(t *testing.T, r *peers.Relay) string {
	t.Helper()
	rows, _ := rbQueue(t, r, "")
	if len(rows) == 0 {
		t.Fatal("the queue lists nothing")
	}
	return rows[0].ID
}

// rbPostAdmin POSTs to the admin API and returns the status and body.
func rbPostAdmin(t *testing.T, r *peers.Relay, path string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+r.AdminAddr+path, "application/json", nil)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// rbProblemLines counts the lines of a relay's log other than its info
// lines (the deferrals it logs at info level, one per attempt, are its
// work): warnings, errors and the lines of their stack traces.
func rbProblemLines(log string) int {
	n := 0
	for _, l := range strings.Split(log, "\n") {
		if l != "" && !strings.Contains(l, "\tINFO\t") {
			n++
		}
	}
	return n
}

// rbTail is the last n lines of log.
func rbTail(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
