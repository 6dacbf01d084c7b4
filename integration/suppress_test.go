package integration

// The suppression list against a real Postfix destination that answers
// 550 5.1.1 for unknown users (relay_recipient_maps) and 554 5.7.1 for a
// policy refusal: the first suppresses the address, with the default
// configuration, so the next message to it is refused at RCPT; the second
// does not. docs/suppression.md's commands list and remove the entry.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

func TestSuppressionWithPostfix(t *testing.T) {
	peers.Require(t, "postfix", "swaks")
	t.Parallel()
	n := newMailNet(t)
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	n.postfix("dest.test", peers.PostfixConfig{DeliverTo: final.Addr, KnownRecipients: []string{"known@dest.test", "policy@dest.test"},
		Main: map[string]string{"smtpd_recipient_restrictions": "check_recipient_access inline:{ {policy@dest.test=554 5.7.1 Blocked by policy} }, reject_unauth_destination"}})
	r := n.relay("events.file=events.jsonl")
	send := func(to ...string) (string, int) {
		m := peers.SwaksMessage{Server: r.SMTPAddr, From: "app@src.test", To: to, Data: message("app@src.test", to[0], "suppression")}
		return m.Send(t)
	}
	for _, to := range []string{"unknown@dest.test", "policy@dest.test"} {
		id := r.send(peers.SwaksMessage{From: "app@src.test", To: []string{to}, Data: message("app@src.test", to, "first")})
		r.waitAttempts(id, "failed", 30*time.Second)
	}
	r.waitQueueEmpty(20 * time.Second)

	// The unknown user is refused at RCPT, quoting Postfix's reply; the
	// policy refusal did not suppress policy@.
	out, code := send("Unknown@dest.test")
	if code == 0 || !strings.Contains(out, "550 5.1.1 <Unknown@dest.test>: Recipient address suppressed since "+time.Now().UTC().Format(time.DateOnly)+": 550 5.1.1") ||
		!strings.Contains(out, "User unknown in relay recipient table") {
		t.Errorf("to the suppressed address: swaks exit %d\n%s", code, out)
	}
	if out, code := send("policy@dest.test"); code != 0 {
		t.Errorf("a policy refusal suppressed the address: swaks exit %d\n%s", code, out)
	}
	if out, code := send("known@dest.test", "unknown@dest.test"); code != 0 || !strings.Contains(out, "550 5.1.1") {
		// swaks goes on with the accepted recipient; its exit is 0.
		t.Errorf("known and suppressed together: swaks exit %d\n%s", code, out)
	}
	final.WaitFor(t, 1, 30*time.Second)

	// The docs' commands: list shows it, remove takes it off, add puts one on.
	block := recipeBlocks(t, "TestSuppressionWithPostfix")[0].Text
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(block, "@example.com", "@dest.test")), "\n")
	env := []string{"GREYRELAY_CONFIG=" + r.ConfigPath}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(peers.Binary(t), filepath.Join(dir, "bin", "greyrelay")); err != nil {
		t.Fatal(err)
	}
	if out := runRecipe(t, dir, "sh", lines[0], env); !strings.Contains(out, "unknown@dest.test") || !strings.Contains(out, "no-such-user") ||
		strings.Contains(out, "policy@dest.test") {
		t.Errorf("suppression list:\n%s", out)
	}
	runRecipe(t, dir, "sh", lines[1], env)
	if out, code := send("unknown@dest.test"); code != 0 {
		t.Errorf("after remove: swaks exit %d\n%s", code, out)
	}
	// Taken again, it bounces again and is suppressed again.
	r.waitQueueEmpty(20 * time.Second)
	if out, code := send("unknown@dest.test"); code == 0 || !strings.Contains(out, "suppressed since") {
		t.Errorf("after the second bounce: swaks exit %d\n%s", code, out)
	}
	runRecipe(t, dir, "sh", lines[2], env)
	if out, code := send("abuse-reporter@dest.test"); code == 0 || !strings.Contains(out, "suppressed since") {
		t.Errorf("after add: swaks exit %d\n%s", code, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "bounced-elsewhere.txt"), []byte("# from the old ESP\nold1@dest.test\n\nOld2@dest.test # hard bounce\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := runRecipe(t, dir, "sh", lines[3], env); !strings.Contains(out, "import: 2 addresses suppressed") {
		t.Errorf("import printed %q", out)
	}
	for _, to := range []string{"old1@dest.test", "old2@dest.test"} {
		if out, code := send(to); code == 0 || !strings.Contains(out, "suppressed since") {
			t.Errorf("%s after import: swaks exit %d\n%s", to, code, out)
		}
	}

	// The event file has a suppressed event for each of unknown@'s bounces
	// and each address the operator added.
	var suppressed []string
	f, err := os.Open(filepath.Join(r.Dir, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev struct{ Event, Rcpt string }
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event == "suppressed" {
			suppressed = append(suppressed, ev.Rcpt)
		}
	}
	// The operator's additions (add, import) are suppressed events too.
	if want := []string{"unknown@dest.test", "unknown@dest.test", "abuse-reporter@dest.test", "old1@dest.test", "old2@dest.test"}; !slices.Equal(suppressed, want) {
		t.Errorf("suppressed events for %q, want %q", suppressed, want)
	}
	// And a refused event for each recipient refused at RCPT for it.
	relaytest.Eventually(t, 20*time.Second, "refused events", func() error {
		var refused []string
		for _, ev := range suppressionEvents(t, filepath.Join(r.Dir, "events.jsonl")) {
			if ev.Event == "refused" {
				if ev.Reason != "suppressed" || !strings.Contains(ev.Reply.Text, "Recipient address suppressed since") || ev.Reply.Code != 550 || ev.QueueID != "" {
					return fmt.Errorf("refused event %+v", ev)
				}
				refused = append(refused, ev.Rcpt)
			}
		}
		want := []string{"Unknown@dest.test", "unknown@dest.test", "unknown@dest.test", "abuse-reporter@dest.test", "old1@dest.test", "old2@dest.test"}
		if !slices.Equal(refused, want) {
			return fmt.Errorf("refused events for %q, want %q", refused, want)
		}
		return nil
	})
}

// TestSuppressionAcceptAndBounce: with suppression.action bounce, a
// recipient that a real Postfix's 550 5.1.1 suppressed is accepted (250)
// next time and bounced at once, without a connection to the destination:
// the sender's MX gets an RFC 3464 DSN whose Diagnostic-Code names the
// suppression (date, reason, Postfix's reply); the other recipient of the
// same message is delivered, and the events say it was bounced.
func TestSuppressionAcceptAndBounce(t *testing.T) {
	peers.Require(t, "postfix", "swaks")
	t.Parallel()
	n := newMailNet(t)
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	n.postfix("dest.test", peers.PostfixConfig{DeliverTo: final.Addr, KnownRecipients: []string{"known@dest.test"}})
	senderMX := n.sink("src.test", peers.SinkOptions{})
	r := n.relay("suppression.action=bounce", "events.file=events.jsonl")

	id := r.send(peers.SwaksMessage{From: "", To: []string{"unknown@dest.test"}, Data: message("app@src.test", "unknown@dest.test", "first")})
	r.waitAttempts(id, "failed", 30*time.Second)
	r.waitSuppressed("unknown@dest.test", true, 10*time.Second)
	r.waitQueueEmpty(20 * time.Second)

	id = r.send(peers.SwaksMessage{From: "app@src.test", To: []string{"known@dest.test", "Unknown@dest.test"},
		Data: message("app@src.test", "known@dest.test", "second")})
	atts := r.waitAttempts(id, "failed", 20*time.Second)
	a := atts[len(atts)-1]
	for _, at := range atts { // the other recipient's attempt may come last
		if at.str("rcpt") == "Unknown@dest.test" {
			a = at
		}
	}
	if a.str("rcpt") != "Unknown@dest.test" || a.str("reason") != "suppressed" || a.str("mx_addr") != "" {
		t.Errorf("the suppressed recipient's attempt: %v, want a failure with reason suppressed and no MX", a)
	}
	dsn := senderMX.WaitFor(t, 1, 20*time.Second)[0]
	rep := parseDSN(t, dsn.Data)
	g := rep.recipient("Unknown@dest.test")
	if len(rep.Recipients) != 1 || g == nil {
		t.Fatalf("DSN names %v, want only Unknown@dest.test", rep.Recipients)
	}
	dc := oneSpace(g.Get("Diagnostic-Code"))
	if g.Get("Action") != "failed" || g.Get("Status") != "5.1.1" ||
		!strings.Contains(dc, "550 5.1.1 <Unknown@dest.test>: Recipient address suppressed since "+time.Now().UTC().Format(time.DateOnly)+" (reason: no-such-user): 550 5.1.1") ||
		!strings.Contains(dc, "User unknown in relay recipient table") {
		t.Errorf("DSN Action %q Status %q Diagnostic-Code %q, want failed 5.1.1 naming the suppression", g.Get("Action"), g.Get("Status"), dc)
	}
	if got := final.WaitFor(t, 1, 20*time.Second)[0]; !slices.Equal(got.Rcpts, []string{"known@dest.test"}) {
		t.Errorf("destination got %v, want known@dest.test alone", got.Rcpts)
	}
	r.waitQueueEmpty(10 * time.Second)

	relaytest.Eventually(t, 20*time.Second, "a bounced event for the suppressed recipient", func() error {
		var kinds []string
		for _, ev := range suppressionEvents(t, filepath.Join(r.Dir, "events.jsonl")) {
			if strings.EqualFold(ev.Rcpt, "Unknown@dest.test") {
				kinds = append(kinds, ev.Event+"/"+ev.Reason)
			}
		}
		if !slices.Contains(kinds, "bounced/suppressed") {
			return fmt.Errorf("events for the recipient: %v", kinds)
		}
		return nil
	})
}

// suppressionEvent is one line of an events file, as far as the
// suppression tests read it.
type suppressionEvent struct {
	Event, Rcpt, Reason string
	QueueID             string `json:"queue_id"`
	Reply               struct {
		Code int
		Text string
	}
}

func suppressionEvents(t *testing.T, path string) []suppressionEvent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []suppressionEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev suppressionEvent
		if json.Unmarshal(sc.Bytes(), &ev) == nil {
			out = append(out, ev)
		}
	}
	return out
}

// TestSuppressionImportsReload: a file of suppression.imports is applied
// at start, again when it changes (no signal) and on SIGHUP; an address
// taken out of it is mailed again, and sessions are not dropped.
func TestSuppressionImportsReload(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	list := filepath.Join(t.TempDir(), "suppressed.txt")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(list+".new", []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(list+".new", list); err != nil {
			t.Fatal(err)
		}
	}
	write("# from the old ESP\nold@dest.test\n")
	// docs/suppression.md's example, with this test's file.
	var doc struct {
		Suppression struct {
			Action  string   `yaml:"action"`
			Imports []string `yaml:"imports"`
		} `yaml:"suppression"`
	}
	if err := yaml.Unmarshal([]byte(recipeBlocks(t, "TestSuppressionImportsReload")[0].Text), &doc); err != nil || len(doc.Suppression.Imports) != 1 {
		t.Fatalf("docs/suppression.md's imports example: %v %+v", err, doc)
	}
	r := n.relay("suppression.action="+doc.Suppression.Action, fmt.Sprintf("suppression.imports=[%q]", list))
	refused := func(addr string) bool {
		out, code := r.swaksTo(addr)
		return code != 0 && strings.Contains(out, "550 5.1.1") && strings.Contains(out, "suppressed since")
	}
	applied := func(cause string) int { return strings.Count(r.Log(), cause+": suppression import applied") }
	if !refused("Old@dest.test") {
		t.Fatal("an address of the import file is not refused after the start")
	}
	// A session open across the reloads keeps working.
	held, err := smtp.Dial(r.SMTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := held.Hello("client.test"); err != nil {
		t.Fatal(err)
	}

	before := applied("file changed")
	write("new@dest.test\n")
	relaytest.Eventually(t, 20*time.Second, "the changed file applied", func() error {
		if applied("file changed") <= before {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if !refused("new@dest.test") {
		t.Error("an address added to the file is not refused")
	}
	if refused("old@dest.test") {
		t.Error("an address taken out of the file is still refused")
	}

	// SIGHUP applies it at once, changed or not.
	before = applied("SIGHUP")
	if err := r.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	relaytest.Eventually(t, 20*time.Second, "SIGHUP applied the file", func() error {
		if applied("SIGHUP") <= before {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if err := held.SendMail("a@src.test", []string{"held@dest.test"}, strings.NewReader("Subject: held\r\n\r\nstill here\r\n")); err != nil {
		t.Errorf("the session open across the reloads: %v", err)
	}
	if !refused("new@dest.test") {
		t.Error("after SIGHUP the file's address is not refused")
	}
	sink.WaitFor(t, 2, 30*time.Second)
}
