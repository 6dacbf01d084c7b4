package integration

// Sender ownership with the real binary and swaks as the submitter: the
// users are made by docs/security.md's `greyrelay user add NAME [SENDER...]`
// commands, run as written, and a user may not send as an address listed
// for another user.

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// runReadmeUserAdd runs docs/security.md's `greyrelay user add` lines in dir with
// sh, the binary first in PATH and /etc/greyrelay/ standing for dir; each
// NAME-password file holds NAME-pw. It returns the users file.
func runReadmeUserAdd(t *testing.T, dir string) string {
	t.Helper()
	block := recipeBlocks(t, "TestSenderOwnedByAnotherUser")[0].Text
	if !strings.HasPrefix(block, "greyrelay user add ") {
		t.Fatalf("docs/security.md's block for this test is not the `greyrelay user add` example:\n%s", block)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(peers.Binary(t), filepath.Join(bin, "greyrelay")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"app", "alice", "bob"} {
		if err := os.WriteFile(filepath.Join(dir, name+"-password"), []byte(name+"-pw\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	script := strings.ReplaceAll(block, "/etc/greyrelay/", dir+"/")
	cmd := exec.Command("sh", "-e", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docs/security.md's user add commands: %v\n%s\n%s", err, script, out)
	}
	return filepath.Join(dir, "users")
}

func TestSenderOwnedByAnotherUser(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	users := runReadmeUserAdd(t, t.TempDir())
	r := n.relay("users_file="+users, "trusted_networks=[]")

	send := func(user, from string) (string, int) {
		m := peers.SwaksMessage{Server: r.SMTPAddr, From: from, To: []string{"x@dest.test"},
			Data: message(from, "x@dest.test", user+" as "+from),
			Args: []string{"--auth", "PLAIN", "--auth-user", user, "--auth-password", user + "-pw"}}
		return m.Send(t)
	}
	cases := []struct {
		user, from string
		code       int    // swaks exit status: 0 sent, 23 refused at MAIL
		reply      string // in swaks's output
	}{
		{"bob", "alice@example.com", 23, "553 5.7.1 <alice@example.com>: Sender address rejected: not owned by user bob"},
		{"bob", "ALICE@Example.COM", 23, "553 5.7.1 <ALICE@example.com>: Sender address rejected: not owned by user bob"},
		{"bob", "noreply@app.example.com", 23, "553 5.7.1 <noreply@app.example.com>: Sender address rejected: not owned by user bob"},
		{"app", "alice@example.com", 23, "553 5.7.1"},
		{"bob", "bob@example.com", 0, "250 2.0.0 OK queued as"},
		{"alice", "Alice@example.com", 0, "250 2.0.0 OK queued as"},
		{"app", "noreply@app.example.com", 0, "250 2.0.0 OK queued as"},
	}
	var sent []string
	for _, c := range cases {
		out, code := send(c.user, c.from)
		if code != c.code || !strings.Contains(out, c.reply) {
			t.Errorf("%s as %s: want swaks exit %d with %q, got %d:\n%s", c.user, c.from, c.code, c.reply, code, out)
		}
		if c.code == 0 {
			sent = append(sent, c.from)
		}
	}
	// Refused messages were never queued: once the queue is empty the sink
	// holds exactly the accepted ones.
	sink.WaitFor(t, len(sent), 20*time.Second)
	r.waitQueueEmpty(20 * time.Second)
	var got []string
	for _, m := range sink.Messages() {
		got = append(got, m.From)
	}
	slices.Sort(got)
	slices.Sort(sent)
	if !slices.Equal(got, sent) {
		t.Errorf("delivered from %q, want exactly %q", got, sent)
	}
}
