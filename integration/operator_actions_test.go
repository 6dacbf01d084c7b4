package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestOperatorActionsExplainThemselves: the operator's hold, release,
// bounce and delete each explain themselves in `queue show`, on the
// status page, in the events and in the DSN, whatever the recipient's
// last reply was. Three messages wait on a full mailbox (452 4.2.2, whose
// explanation promises retries until the message expires); the operator
// holds the first and bounces it, holds and releases the second (its
// mailbox has room by then), and deletes the third.
func TestOperatorActionsExplainThemselves(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	var room atomic.Bool
	n.sink("full.test", peers.SinkOptions{Rcpt: func(to string, _ int) *smtp.SMTPError {
		if room.Load() && strings.HasPrefix(to, "released@") {
			return nil
		}
		return &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 2, 2}, Message: "Mailbox full"}
	}})
	src := n.sink("src.test", peers.SinkOptions{}) // takes the bounce
	eventsFile := filepath.Join(t.TempDir(), "events.jsonl")
	r := n.relay("events.file="+eventsFile, "retry.initial_interval=1m", "retry.max_interval=1m")

	send := func(to string) string {
		return r.send(peers.SwaksMessage{From: "a@src.test", To: []string{to}, Data: message("a@src.test", to, "operator "+to)})
	}
	bounced, released, deleted := send("bounced@full.test"), send("released@full.test"), send("deleted@full.test")
	for _, id := range []string{bounced, released, deleted} {
		r.waitAttempts(id, "deferred", 15*time.Second)
	}
	const retrying = "keeps retrying until the message expires" // the mailbox-full explanation's class 4 note
	must := func(args ...string) cliResult {
		t.Helper()
		res := r.cli("queue", args...)
		if res.Code != 0 {
			t.Fatalf("greyrelay queue %v: %s", args, res)
		}
		return res
	}
	showSays := func(id string, want ...string) {
		t.Helper()
		res := must("show", id)
		for _, w := range want {
			if !strings.Contains(res.Stdout, w) {
				t.Errorf("queue show %s lacks %q:\n%s", id, w, res.Stdout)
			}
		}
		if strings.Contains(res.Stdout, retrying) {
			t.Errorf("queue show %s explains the last reply, not the operator's action:\n%s", id, res.Stdout)
		}
	}

	must("hold", bounced)
	showSays(bounced, "put this recipient on hold")
	must("bounce", bounced)
	showSays(bounced, "returned this message to its sender")

	must("hold", released)
	showSays(released, "put this recipient on hold")
	room.Store(true)
	must("release", released)
	r.waitAttempts(released, "delivered", 15*time.Second)

	must("delete", deleted)

	// The DSN says who returned the message.
	var dsn []byte
	relaytest.Eventually(t, 15*time.Second, "the operator's bounce", func() error {
		for _, m := range src.Messages() {
			if bytes.Contains(m.Data, []byte("bounced@full.test")) {
				dsn = m.Data
				return nil
			}
		}
		return fmt.Errorf("no DSN at src.test")
	})

	if !bytes.Contains(dsn, []byte("operator returned this message")) {
		t.Errorf("the DSN does not say the operator returned the message:\n%s", dsn)
	}

	// The status page: the bounce is explained as the operator's; nothing
	// else is left waiting, so no text may promise retries.
	code, page := r.Get(t, "/")
	if code != 200 || !strings.Contains(page, "returned this message to its sender") || strings.Contains(page, retrying) {
		t.Errorf("status page: %d, without the operator's explanation or with the mailbox-full one:\n%s", code, page)
	}

	// The events: held, bounced, held, released, deleted, each explained.
	want := []struct{ id, kind, says string }{
		{bounced, "held", "put this recipient on hold"},
		{bounced, "bounced", "returned this message to its sender"},
		{released, "held", "put this recipient on hold"},
		{released, "released", "released this recipient from hold"},
		{deleted, "deleted", "deleted this recipient"},
	}
	relaytest.Eventually(t, 15*time.Second, "the operator's events", func() error {
		evs := readEvents(t, eventsFile)
	next:
		for _, w := range want {
			for _, e := range evs {
				if e.QueueID == w.id && e.Event == w.kind {
					if !strings.Contains(e.Explanation, w.says) || strings.Contains(e.Explanation, retrying) {
						t.Fatalf("%s event of %s explained as %q, want the operator's action (%q)", w.kind, w.id, e.Explanation, w.says)
					}
					continue next
				}
			}
			return fmt.Errorf("no %s event for %s in %d events", w.kind, w.id, len(evs))
		}
		return nil
	})

}

// opEvent is the part of an event line TestOperatorActionsExplainThemselves reads.
type opEvent struct {
	Event       string `json:"event"`
	QueueID     string `json:"queue_id"`
	Explanation string `json:"explanation"`
}

func readEvents(t *testing.T, path string) []opEvent {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []opEvent
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e opEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err == nil {
			out = append(out, e)
		}
	}
	return out
}
