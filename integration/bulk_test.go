package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestBulkActionsSelectWhatTheOperatorMeans runs the queue actions as an
// operator would (`greyrelay queue ACTION -config FILE ...`) on mail that
// waits at a full mailbox: every spelling of the domain selects it, the
// filters combine, a dry run counts and changes nothing, a typo in a
// filter value is refused with the valid values, and a hold of a domain
// whose mail has all gone out says why it changed nothing and what stops
// new mail (a suspension).
func TestBulkActionsSelectWhatTheOperatorMeans(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	full := func(string, int) *smtp.SMTPError {
		return &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 2, 2}, Message: "Mailbox full"}
	}
	n.sink("full.test", peers.SinkOptions{Rcpt: full})
	n.sink("ok.test", peers.SinkOptions{})
	n.sink("src.test", peers.SinkOptions{})
	n.sink("tagged.test", peers.SinkOptions{Rcpt: full})
	r := n.relay("retry.initial_interval=1h", "retry.max_interval=1h")
	send := func(from, to string) string {
		return r.send(peers.SwaksMessage{From: from, To: []string{to}, Data: message(from, to, "bulk "+to)})
	}
	must := func(args ...string) string {
		t.Helper()
		res := r.cli("queue", args...)
		if res.Code != 0 {
			t.Fatalf("greyrelay queue %v: %s", args, res)
		}
		return res.Stdout
	}
	says := func(out, want string) {
		t.Helper()
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// What the report saw: the domain's mail had gone out, so hold found
	// nothing, and it never stops new mail. Say so, and what does.
	okID := send("a@src.test", "u@ok.test")
	r.waitAttempts(okID, "delivered", 15*time.Second)
	settled := func(what string, args []string, want string) { // the outcomes logged are stored
		t.Helper()
		relaytest.Eventually(t, 15*time.Second, what, func() error {
			if out := must(args...); !strings.Contains(out, want) {
				return fmt.Errorf("%v: %s", args, out)
			}
			return nil
		})
	}
	settled("the delivery stored", []string{"show", okID}, "delivered")
	out := must("hold", "-domain", "ok.test")
	says(out, "hold: 0 recipient(s) changed")
	says(out, "greyrelay destinations suspend ok.test")

	ids := []string{send("a@src.test", "one@full.test"), send("b@src.test", "two@FULL.TEST"), send("a@src.test", "three@full.test")}
	for _, id := range ids {
		r.waitAttempts(id, "deferred", 15*time.Second)
	}
	settled("the deferrals stored", []string{"list", "-status", "deferred", "-domain", "full.test"}, "recipients 1-3 of 3")

	// Filter values are checked against the valid ones, before anything
	// is asked of the relay.
	for _, bad := range [][]string{{"hold", "-reason", "greylist"}, {"delete", "-status", "defered"}, {"list", "-reason", "mailboxfull"}} {
		res := r.cli("queue", bad...)
		if res.Code == 0 || !strings.Contains(res.Stderr+res.Stdout, "want one of") {
			t.Errorf("greyrelay queue %v: want a refusal listing the valid values: %s", bad, res)
		}
	}
	if res := r.cli("queue", "hold"); res.Code == 0 || !strings.Contains(res.Stderr+res.Stdout, "give an ID, a selection") {
		t.Errorf("queue hold without a selection: %s", res)
	}

	// A dry run counts what would change and changes nothing; every
	// spelling of the domain selects the same recipients.
	for _, spelling := range []string{"full.test", "FULL.Test", "full.test."} {
		says(must("hold", "-dry-run", "-domain", spelling), "hold (dry run): 3 recipient(s) would change")
	}
	says(must("list", "-status", "held"), "no recipients match")

	// The application's tag selects its messages, whatever their domain.
	tagged := append([]byte("X-Greyrelay-Tag: campaign-7\r\n"), message("a@src.test", "t@tagged.test", "tagged")...)
	r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"t@tagged.test"}, Data: tagged})
	says(must("hold", "-dry-run", "-tag", "campaign-7"), "hold (dry run): 1 recipient(s) would change")

	// Filters combine: the deferred mailbox-full recipients of b@src.test.
	says(must("hold", "-reason", "mailbox-full", "-sender", "b@src.test", "-status", "deferred"), "hold: 1 recipient(s) changed")
	says(must("hold", "-domain", "Full.Test", "-older-than", "2d"), "hold: 0 recipient(s) changed") // none is two days old
	says(must("hold", "-domain", "full.test"), "hold: 2 recipient(s) changed")
	says(must("list", "-status", "held"), "recipients 1-3 of 3")
	says(must("release", "-domain", "full.test"), "release: 3 recipient(s) changed") // due now: a second attempt each
	settled("the second attempts stored", []string{"delete", "-status", "deferred", "-sender", "a@src.test", "-domain", "full.test", "-dry-run"},
		"delete (dry run): 2 recipient(s) would change")
	attemptsAre := func(want int) func() error {
		return func() error {
			var l apiList
			if err := json.Unmarshal([]byte(must("list", "-domain", "full.test", "-status", "deferred", "-json")), &l); err != nil {
				return err
			}
			if len(l.Rows) != 3 {
				return fmt.Errorf("%d deferred recipients", len(l.Rows))
			}
			for _, row := range l.Rows {
				if row.Attempts != want {
					return fmt.Errorf("%s: %d attempts, want %d", row.Key, row.Attempts, want)
				}
			}
			return nil
		}
	}
	relaytest.Eventually(t, 15*time.Second, "two attempts each", attemptsAre(2))

	// Requeue routes again at once (the retry interval is an hour) and
	// keeps the attempts: the next one is the third.
	says(must("requeue", "-domain", "full.test"), "requeue: 3 recipient(s) changed")
	relaytest.Eventually(t, 20*time.Second, "a third attempt of every requeued recipient", attemptsAre(3))

	// docs/operations.md's block, as written.
	out = runOperatorRecipe(t, r, recipeBlocks(t, "TestBulkActionsSelectWhatTheOperatorMeans")[0].Text, "full.test")
	says(out, "hold (dry run): 3 recipient(s) would change")
	says(out, "requeue: 3 recipient(s) changed")
}
