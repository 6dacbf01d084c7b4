package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestRobustDiskFull: a full disk gets 4xx, never 250 or 5xx. The queue lives on a
// 4 MiB tmpfs and limits.max_message_bytes is 256 KiB, so the relay's
// free-space threshold (1.5 × max_message_bytes) is 384 KiB, besides the
// reserve it leaves to delivery (queue.reserve_percent, 5% by default).
//
//  1. Three messages are accepted while there is room; the destination
//     defers them, so they stay queued (and are retried, writing to the
//     queue, throughout).
//  2. A filler file leaves less free space than the threshold:
//     submissions get 452 4.3.1, never 250, never 5xx.
//  3. The filler takes the very last byte: still 452 4.3.1, the relay
//     (its delivery workers recording deferrals on a full disk) survives,
//     and `GET /api/queue`, `/api/stats` and `greyrelay queue list` answer,
//     each accounting for the 3 recipients accepted: in the database or
//     counted as accepted and not in it yet (the journal holds them).
//  4. The filler shrinks to leave a little more than the threshold: four
//     clients submit 240 KB at once (each passes the free-space check,
//     together they do not fit: the group commit can hit ENOSPC), then
//     messages of 200 KB follow one by one until refused. Every answer is
//     250 or 4xx, never 5xx, and the reads of step 3 account for every
//     recipient accepted.
//  5. The filler is removed: acceptance resumes without a restart, `greyrelay
//     queue list` works, every record is intact, and when the destination
//     starts accepting, every message that got a 250 is delivered intact.
func TestRobustDiskFull(t *testing.T) {
	t.Parallel()
	relayIP, sinkIP, clientIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	mnt := rbMountTmpfs(t, "4m")

	var open atomic.Bool
	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{Rcpt: func(string, int) *smtp.SMTPError {
		if open.Load() {
			return nil
		}
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "not yet"}
	}})
	const maxBytes = 256 << 10
	threshold := uint64(maxBytes)*3/2 + rbSize(t, mnt)*5/100
	cfg := rbRelay{IP: relayIP, QueuePath: filepath.Join(mnt, "q", "queue.db"),
		Limits: map[string]string{"max_message_bytes": fmt.Sprint(maxBytes)},
		Routes: map[string]string{"dest.test": sink.Addr}}
	r := peers.StartRelay(t, cfg.YAML(t))
	pid := r.Cmd.Process.Pid
	rng := rand.New(rand.NewPCG(4, 4))
	led := newRBLedger()
	var seq atomic.Int64
	send := func(tag string, size int, rng *rand.Rand, beforeDot func()) (rbReply, error) {
		id := fmt.Sprintf("%s.%d@diskfull.test", tag, seq.Add(1))
		data := rbMessage(id, "disk full "+tag, size, rng)
		led.add(&rbSent{id: id, rcpts: []string{"user@dest.test"}, hash: rbHash(data)})
		c, err := rbDialSMTP(r.SMTPAddr, clientIP, false, "client.test")
		if err != nil {
			return rbReply{}, err
		}
		defer c.Close()
		rep, err := c.Send(rbTx{From: "app@src.test", Rcpts: []string{"user@dest.test"}, Data: data, BeforeDot: beforeDot})
		if err == nil && rep.Code == 250 {
			led.ack(id, rep.String())
		}
		return rep, err
	}
	submit := func(tag string, size int) rbReply {
		t.Helper()
		rep, err := send(tag, size, rng, nil)
		if err != nil {
			t.Fatalf("%s: connection failed: %v", tag, err)
		}
		if rep.Code/100 == 5 {
			t.Errorf("%s: %v: a full disk must never give a permanent refusal", tag, rep)
		}
		return rep
	}
	want4531 := func(tag string, rep rbReply) {
		t.Helper()
		if rep.Code != 452 || !strings.HasPrefix(rep.Text(), "4.3.1") {
			t.Errorf("%s: %v, want 452 4.3.1", tag, rep)
		}
	}

	// 1. Room: accepted and queued (the sink defers them).
	for range 3 {
		if rep := submit("before", 8<<10); rep.Code != 250 {
			t.Fatalf("with room: %v", rep)
		}
	}
	// The disk fills at once, whether or not the database has stored
	// them yet (the writer lets commits gather for queue.commit_delay):
	// the messages are safe in the journal either way, and the operator's
	// reads answer from what the database holds (step 3).
	filler := filepath.Join(mnt, "filler")

	// 2. Below the threshold.
	rbFill(t, filler, mnt, threshold/3)
	for i := range 3 {
		want4531(fmt.Sprintf("below threshold #%d", i), submit("below", 8<<10))
	}

	// 3. Completely full.
	rbFill(t, filler, mnt, 0)
	for i := range 2 {
		want4531(fmt.Sprintf("full #%d", i), submit("full", 8<<10))
	}
	rbFullDiskReads(t, r, 3)
	if !r.Running() {
		t.Fatalf("the relay died on a full disk:\n%s", r.Log())
	}

	// 4a. Just above the threshold, four clients at once: each passes the
	// free-space check, and together they do not fit, so the group
	// commit may hit ENOSPC. Every answer must be 250 or 4xx.
	rbShrink(t, filler, mnt, threshold+64<<10)
	replies := make(chan string, 4)
	atDot := make(chan struct{}, 4)
	allAtDot := make(chan struct{})
	go func() { // the final dots leave together (or after 5 s, if a client was refused earlier)
		for range 4 {
			select {
			case <-atDot:
			case <-time.After(5 * time.Second):
			}
		}
		close(allAtDot)
	}()
	for i := range 4 {
		go func() {
			rep, err := send("burst", 240<<10, rand.New(rand.NewPCG(uint64(i), 9)), func() { atDot <- struct{}{}; <-allAtDot })
			switch {
			case err != nil:
				replies <- fmt.Sprintf("burst #%d: connection failed: %v", i, err)
			case rep.Code != 250 && rep.Code/100 != 4:
				replies <- fmt.Sprintf("burst #%d: %v, want 250 or 4xx", i, rep)
			default:
				replies <- ""
				t.Logf("burst #%d: %v", i, rep)
			}
		}()
	}
	for range 4 {
		if e := <-replies; e != "" {
			t.Error(e)
		}
	}

	// 4b. A little more room: big messages one by one until refused.
	rbShrink(t, filler, mnt, threshold+320<<10)
	var refused bool
	for i := 0; i < 12 && !refused; i++ {
		rep := submit("edge", 200<<10)
		if rep.Code != 250 {
			refused = true
			if rep.Code/100 != 4 {
				t.Errorf("edge #%d: %v, want 250 or 4xx", i, rep)
			}
			t.Logf("edge: refused after %d more messages with %v", i, rep)
		}
	}
	if !refused {
		t.Errorf("12 messages of 200 KB were accepted on a nearly full 4 MiB filesystem")
	}
	// The disk is as full as the relay lets it become: the reads answer,
	// and account for every recipient accepted, in the database or not
	// yet (a burst's commit may have found no room).
	rbFullDiskReads(t, r, len(led.acked()))

	// 5. Space again: acceptance resumes without a restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var rep rbReply
	rbWaitUntil(t, 10*time.Second, "acceptance after the filler was removed", func() bool {
		rep = submit("after", 8<<10)
		return rep.Code == 250
	})
	if r.Cmd.Process.Pid != pid || !r.Running() {
		t.Fatalf("the relay was restarted or died")
	}
	acked := led.acked()
	rows, total := rbQueue(t, r, "")
	if total != len(acked) {
		t.Errorf("the queue lists %d recipients, want the %d acknowledged messages", total, len(acked))
	}
	for _, row := range rows {
		if row.Status != "queued" && row.Status != "deferred" && row.Status != "active" {
			t.Errorf("queue record %s: status %q", row.ID, row.Status)
		}
	}
	list := exec.Command(peers.Binary(t), "queue", "list", "-config", r.ConfigPath)
	list.Env = peers.CleanEnv() // CI's GREYRELAY_REQUIRE_* would be unknown keys
	out, err := list.CombinedOutput()
	if err != nil || strings.Count(string(out), "user@dest.test") != len(acked) {
		t.Errorf("greyrelay queue list: %v, %d rows, want %d:\n%s", err, strings.Count(string(out), "user@dest.test"), len(acked), out)
	}

	open.Store(true)
	var idx rbSinkIndex
	rbWaitUntil(t, 30*time.Second, "delivery of every acknowledged message", func() bool {
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
	for id := range idx.byID {
		if s := led.get(id); s == nil || !s.acked {
			t.Errorf("%s was delivered but never acknowledged", id)
		}
	}
	rbWaitUntil(t, 20*time.Second, "an empty queue", func() bool { return rbStats(t, r).Messages == 0 })
	if log := r.Log(); strings.Contains(log, "quarantined") || strings.Contains(log, "panic") {
		t.Errorf("damaged records or a panic after the disk filled up:\n%s", rbGrep(log, "quarantined")+rbGrep(log, "panic"))
	}
}

// rbFullDiskReads checks that the operator's reads answer on a full
// disk: each lists or counts what the database holds and counts what it
// lacks, which together account for every accepted recipient. The count
// of what it lacks is taken before the read, so a commit in between (it
// can reuse free pages) makes it count a recipient twice, never miss one:
// the database holds at most the accepted ones, and with the count at
// least all of them.
func rbFullDiskReads(t *testing.T, r *peers.Relay, accepted int) {
	t.Helper()
	var answer struct {
		Total      int `json:"total"`      // /api/queue
		Recipients int `json:"recipients"` // /api/stats
		Unsettled  int `json:"unsettled_recipients"`
	}
	for _, path := range []string{"/api/queue", "/api/stats"} {
		code, body := r.Get(t, path)
		if code != http.StatusOK {
			t.Errorf("GET %s on a full disk: %d %s", path, code, body)
			continue
		}
		answer.Total, answer.Recipients, answer.Unsettled = 0, 0, 0
		if err := json.Unmarshal([]byte(body), &answer); err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, body)
		}
		if held := answer.Total + answer.Recipients; held > accepted || held+answer.Unsettled < accepted {
			t.Errorf("GET %s on a full disk: %d recipients held, %d not yet; want %d accepted in all:\n%s",
				path, held, answer.Unsettled, accepted, body)
		}
		t.Logf("GET %s on a full disk: %d not in the database yet", path, answer.Unsettled)
	}
	list := exec.Command(peers.Binary(t), "queue", "list", "-config", r.ConfigPath)
	list.Env = peers.CleanEnv()
	var stdout, stderr bytes.Buffer
	list.Stdout, list.Stderr = &stdout, &stderr
	if err := list.Run(); err != nil {
		t.Errorf("greyrelay queue list on a full disk: %v\n%s%s", err, stdout.String(), stderr.String())
		return
	}
	unsettled := 0
	for _, line := range strings.Split(stderr.String(), "\n") { // after the line naming the configuration
		if note, ok := strings.CutPrefix(line, "note: "); ok {
			if _, err := fmt.Sscanf(note, "%d recipients accepted and journaled are not in this list yet", &unsettled); err != nil {
				t.Errorf("greyrelay queue list: unexpected note %q", stderr.String())
			}
		}
	}
	t.Logf("greyrelay queue list on a full disk: %d not in the list yet", unsettled)
	if held := strings.Count(stdout.String(), "user@dest.test"); held > accepted || held+unsettled < accepted {
		t.Errorf("greyrelay queue list on a full disk: %d recipients listed, %d not yet; want %d accepted in all:\n%s%s",
			held, unsettled, accepted, stdout.String(), stderr.String())
	}
}

// rbMountTmpfs mounts a tmpfs of the given size on a fresh directory and
// unmounts it when the test ends (after the relay, whose cleanup was
// registered later, has stopped). A failed mount skips the test unless
// peers are required.
func rbMountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		if os.Getenv(peers.RequireEnv) != "" {
			t.Fatalf("mount tmpfs: %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs (%v %s); set %s=1 to fail instead", err, out, peers.RequireEnv)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
			_ = exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir
}

// rbFree returns the bytes available on the filesystem holding dir.
func rbFree(t *testing.T, dir string) uint64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bavail * uint64(st.Bsize)
}

// rbFill appends to the filler file until at most leave bytes are free (0:
// until the filesystem refuses another byte).
func rbFill(t *testing.T, filler, dir string, leave uint64) {
	t.Helper()
	f, err := os.OpenFile(filler, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for rbFree(t, dir) > leave {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			t.Fatal(err)
		}
	}
	if leave == 0 {
		// Whatever is left below a page, byte by byte.
		for {
			if _, err := f.Write([]byte{0}); err != nil {
				break
			}
		}
	}
	t.Logf("filler: %d bytes free", rbFree(t, dir))
}

// rbShrink truncates the filler until at least want bytes are free.
func rbShrink(t *testing.T, filler, dir string, want uint64) {
	t.Helper()
	fi, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()
	for free := rbFree(t, dir); free < want && size > 0; free = rbFree(t, dir) {
		size = max(0, size-int64(want-free))
		if err := os.Truncate(filler, size); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("filler shrunk: %d bytes free", rbFree(t, dir))
}

// TestRobustDiskFullWhileSpooling: a 1.2 MB message, which the relay
// writes to a spool file while it reads it (bodies from 256 KiB on), meets
// a disk that fills up in the middle of its DATA. The answer is 452 4.3.1,
// never 250 or 5xx, and no spool file is left behind. Once there is room
// again, the same message is accepted, delivered intact, and its file is
// removed.
func TestRobustDiskFullWhileSpooling(t *testing.T) {
	t.Parallel()
	relayIP, sinkIP, clientIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	mnt := rbMountTmpfs(t, "16m")
	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{})
	queuePath := filepath.Join(mnt, "q", "queue.db")
	cfg := rbRelay{IP: relayIP, QueuePath: queuePath,
		Limits: map[string]string{"max_message_bytes": fmt.Sprint(2 << 20)},
		Routes: map[string]string{"dest.test": sink.Addr}}
	r := peers.StartRelay(t, cfg.YAML(t))
	const id = "spool.1@diskfull.test"
	data := rbMessage(id, "spooled while the disk fills", 1200<<10, rand.New(rand.NewPCG(5, 5)))
	filler := filepath.Join(mnt, "filler")
	send := func(midBody func()) rbReply {
		t.Helper()
		c, err := rbDialSMTP(r.SMTPAddr, clientIP, false, "client.test")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rep, err := c.Send(rbTx{From: "app@src.test", Rcpts: []string{"user@dest.test"}, Data: data, MidBody: midBody})
		if err != nil {
			t.Fatalf("submission failed: %v", err)
		}
		return rep
	}

	if rep := send(func() { rbFill(t, filler, mnt, 0) }); rep.Code != 452 || !strings.HasPrefix(rep.Text(), "4.3.1") {
		t.Errorf("disk full in the middle of a spooled body: %v, want 452 4.3.1", rep)
	}
	if names := dirNames(t, queuePath+".bodies"); len(names) != 0 {
		t.Errorf("spool files left after the refusal: %v", names)
	}
	if !strings.Contains(r.Log(), "spooling the body failed") {
		t.Errorf("the refusal did not come from the spool file's write error:\n%s", rbGrep(r.Log(), "error"))
	}
	if !r.Running() {
		t.Fatalf("the relay died:\n%s", r.Log())
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if rep := send(nil); rep.Code != 250 {
		t.Fatalf("with room again: %v", rep)
	}
	var idx rbSinkIndex
	rbWaitUntil(t, 30*time.Second, "delivery", func() bool {
		idx = rbIndexSink(sink.Messages())
		return len(idx.byID[id]["user@dest.test"]) > 0
	})
	if got := idx.byID[id]["user@dest.test"]; len(got) != 1 || got[0] != rbHash(data) {
		t.Errorf("delivered %d times, hashes %v; want once, intact", len(got), got)
	}
	rbWaitUntil(t, 20*time.Second, "an empty queue", func() bool { return rbStats(t, r).Messages == 0 })
	if names := dirNames(t, queuePath+".bodies"); len(names) != 0 {
		t.Errorf("spool files left after delivery: %v", names)
	}
}
