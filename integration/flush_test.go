package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestFlushAfterNextHopReturns: the only MX of a domain is down, so the
// first message's attempt is refused and the address goes on the
// dead-host list for retry.initial_interval (10 minutes here); a second
// message is postponed without an attempt. The list survives a restart.
// Then the MX comes up and `greyrelay queue retry -all`, like Postfix's
// `postqueue -f`, forgets the list: both messages are delivered at once,
// not ten minutes later. `greyrelay destinations forget` then drops what
// was learned about the domain.
func TestFlushAfterNextHopReturns(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	mxAddr := n.mxAddr("down.test") // nothing listens yet
	r := n.relay("retry.initial_interval=10m", "retry.max_interval=1h")

	first := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"x@down.test"},
		Data: message("a@src.test", "x@down.test", "first")})
	if atts := r.waitAttempts(first, "deferred", 15*time.Second); atts[0].str("reason") != "connect" {
		t.Fatalf("first attempt %v, want deferred for a refused connection", outcomes(atts))
	}
	second := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"y@down.test"},
		Data: message("a@src.test", "y@down.test", "second")})
	relaytest.Eventually(t, 15*time.Second, "the second message postponed without an attempt", func() error {
		rows := r.rowsOf(second)
		if len(rows) != 1 || rows[0].Reason != "connect" || rows[0].Attempts != 0 {
			return fmt.Errorf("rows %+v", rows)
		}
		return nil
	})

	if atts := r.attempts(second); len(atts) != 0 {
		t.Errorf("the postponed message has attempt lines %v", outcomes(atts))
	}

	r.Restart(t) // the dead-host list is stored: it would hold both for ten minutes
	sink := peers.StartSink(t, mxAddr, peers.SinkOptions{Domain: "mx.down.test"})
	res := r.cli("queue", "retry", "-all")
	if res.Code != 0 || !strings.Contains(res.Stdout, "retry: 2 recipient(s) changed") {
		t.Fatalf("queue retry -all: %s", res)
	}
	sink.WaitFor(t, 2, 20*time.Second)
	r.waitQueueEmpty(10 * time.Second)
	if atts := r.attempts(second); len(atts) != 1 || atts[0].str("outcome") != "delivered" || atts[0].num("attempt") != 1 {
		t.Errorf("second message: attempts %v, want delivered at its first attempt", outcomes(atts))
	}
	if atts := r.attempts(first); len(atts) != 2 || atts[1].str("outcome") != "delivered" {
		t.Errorf("first message: attempts %v, want the refused one and a delivery", outcomes(atts))
	}

	if _, ok := r.destination("down.test"); !ok {
		t.Fatal("nothing learned about down.test before forget")
	}
	res = r.cli("destinations", "forget", "down.test")
	if res.Code != 0 || !strings.Contains(res.Stdout, "forget: 1 destination(s) changed") {
		t.Errorf("destinations forget down.test: %s", res)
	}
	if code := r.api("/api/destinations/down.test", nil); code != http.StatusNotFound {
		t.Errorf("GET /api/destinations/down.test after forget: HTTP %d, want 404", code)
	}
	res = r.cli("destinations", "forget", "-all", "-json")
	var fr struct {
		Action       string `json:"action"`
		Destinations int    `json:"destinations"`
	}
	if res.Code != 0 || json.Unmarshal([]byte(res.Stdout), &fr) != nil || fr.Action != "forget" {
		t.Errorf("destinations forget -all -json: %s", res)
	}
}
