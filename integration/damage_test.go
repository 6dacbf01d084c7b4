package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	bolt "go.etcd.io/bbolt"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestDamagedQueueSalvage damages a real relay's queue file the way a
// failing disk would (the element array of the recipients' branch page
// overwritten), then checks what an operator sees and does: serve exits
// with status 3 and a message naming the file and the remedy, docs/operations.md's
// salvage recipe run as written recovers every message, and the relay
// started again delivers every recipient, each message unaltered.
func TestDamagedQueueSalvage(t *testing.T) {
	t.Parallel()
	const msgs, rcpts = 30, 3
	relayIP, sinkIP, clientIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	var hold atomic.Bool // the sink defers everything until the salvage is done
	hold.Store(true)
	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{Data: func([]string, int) *smtp.SMTPError {
		if hold.Load() {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "not yet"}
		}
		return nil
	}})
	cfg := rbRelay{IP: relayIP, Routes: map[string]string{"dest.test": sink.Addr}}
	r := peers.StartRelay(t, cfg.YAML(t))
	dbPath := filepath.Join(r.Dir, "queue.db")

	sent := map[string]string{} // Message-ID → hash of the message as sent
	rng := rand.New(rand.NewPCG(16, 3))
	c, err := rbDialSMTP(r.SMTPAddr, clientIP, false, "client.test")
	if err != nil {
		t.Fatal(err)
	}
	for i := range msgs {
		id := fmt.Sprintf("damage-%d@src.test", i)
		data := rbMessage(id, "damage", 2000+rng.IntN(6000), rng)
		var to []string
		for j := range rcpts {
			to = append(to, fmt.Sprintf("r%d-%d@dest.test", i, j))
		}
		if rep, err := c.Send(rbTx{From: "sender@src.test", Rcpts: to, Data: data}); err != nil || rep.Code != 250 {
			t.Fatalf("message %d: %v %v", i, rep, err)
		}
		sent[id] = rbHash(data)
	}
	c.Cmd("QUIT")
	rbWaitUntil(t, 30*time.Second, "every message attempted once", func() bool {
		return len(sink.Transactions()) >= msgs
	})
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}

	smashRecipientsBranch(t, dbPath)
	out, code := runDamaged(t, r)
	if code != 3 || !strings.Contains(out, "is damaged") || !strings.Contains(out, "greyrelay queue salvage -config") ||
		!strings.Contains(out, dbPath) {
		t.Fatalf("serve on a damaged queue: exit %d, output:\n%s", code, out)
	}

	runSalvageRecipe(t, r, dbPath, func() {
		r.Restart(t)
		// Every recipient came back from an older copy of its record
		// (the branch page above the current ones was lost): each may
		// already have been delivered, and `queue show` says so.
		rows, _ := rbQueue(t, r, "")
		if len(rows) == 0 {
			t.Fatal("nothing queued after the salvage")
		}
		show := rbQueueShowCLI(t, r, rows[0].ID)
		if !strings.Contains(show, "from an older copy of its record") || !strings.Contains(show, "may already have been delivered") {
			t.Errorf("queue show %s after salvage does not say the recipient may be a duplicate:\n%s", rows[0].ID, show)
		}
		hold.Store(false)
	})
	// Every recipient, not every message: a message's recipients may go
	// out in more than one transaction (their retries need not coincide).
	rbWaitUntil(t, 60*time.Second, "every recipient delivered", func() bool {
		n := 0
		for _, m := range sink.Messages() {
			n += len(m.Rcpts)
		}
		return n >= msgs*rcpts
	})
	got := sink.Messages()
	delivered := map[string]int{}
	for _, m := range got {
		id := rbMessageID(m.Data)
		if rbHash(rbStripReceived(m.Data)) != sent[id] {
			t.Fatalf("message %s delivered altered", id)
		}
		delivered[id] += len(m.Rcpts)
	}
	for id := range sent {
		if delivered[id] < rcpts {
			t.Errorf("message %s: %d of %d recipients delivered", id, delivered[id], rcpts)
		}
	}
	if matches, _ := filepath.Glob(dbPath + ".damaged-*"); len(matches) != 1 {
		t.Fatalf("damaged file not kept: %v", matches)
	}
}

// rbQueueShowCLI is the output of `greyrelay queue show ID`.
func rbQueueShowCLI(t *testing.T, r *peers.Relay, id string) string {
	t.Helper()
	cmd := exec.Command(peers.Binary(t), "queue", "show", "-config", r.ConfigPath, id)
	cmd.Env = peers.CleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("greyrelay queue show %s: %v\n%s", id, err, out)
	}
	return string(out)
}

// smashRecipientsBranch overwrites the elements of the root page of the
// rcpts bucket, which must be a branch page.
func smashRecipientsBranch(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var root uint64
	var psize int
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("rcpts"))
		if b == nil {
			return errors.New("no rcpts bucket")
		}
		root, psize = uint64(b.Root()), db.Info().PageSize
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 16)
	if _, err := f.ReadAt(head, int64(root)*int64(psize)); err != nil {
		t.Fatal(err)
	}
	if flags := binary.LittleEndian.Uint16(head[8:]); flags != 0x01 { // bbolt's branch page flag
		t.Fatalf("rcpts root page %d has flags %#x, not a branch page", root, flags)
	}
	n := int(binary.LittleEndian.Uint16(head[10:]))
	junk := bytes.Repeat([]byte{0xA5, 0x5A, 0xFF, 0x13}, n*4)
	if _, err := f.WriteAt(junk, int64(root)*int64(psize)+16); err != nil {
		t.Fatal(err)
	}
}

// runDamaged runs serve on r's config and returns its output and exit
// status.
func runDamaged(t *testing.T, r *peers.Relay) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, peers.Binary(t), "serve", "-config", r.ConfigPath)
	cmd.Dir = r.Dir
	cmd.Env = peers.CleanEnv()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("serve on a damaged queue: %v\n%s", err, out)
	}
	return string(out), ee.ExitCode()
}

// runSalvageRecipe runs docs/operations.md's block under "A damaged queue file" as
// written, with the unit's paths pointing at the test relay's, and start
// standing for `systemctl start greyrelay`.
func runSalvageRecipe(t *testing.T, r *peers.Relay, dbPath string, start func()) {
	t.Helper()
	block := recipeBlocks(t, "TestDamagedQueueSalvage")[0].Text
	bin := t.TempDir()
	if err := os.Symlink(peers.Binary(t), filepath.Join(bin, "greyrelay")); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		if line == "systemctl start greyrelay" {
			start()
			continue
		}
		line = strings.ReplaceAll(line, "/var/lib/greyrelay/queue.db", dbPath)
		line = strings.ReplaceAll(line, "/etc/greyrelay/greyrelay.yaml", r.ConfigPath)
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = r.Dir
		cmd.Env = append(peers.CleanEnv(), "PATH="+bin+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		t.Logf("$ %s\n%s", line, out)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if !strings.Contains(string(out), "recovered ") {
			t.Fatalf("salvage printed no summary")
		}
	}
}
