package integration

// Delivery: MX routing through DNS, the pinned source address,
// the message passed on unchanged, one transaction per destination domain.

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestDeliveryThroughPostfix relays a message from swaks through greyrelay
// to a real Postfix found by MX lookup (dest.test → mx.dest.test →
// 127.0.0.1xx), which passes it on to a sink. The sink must get the bytes
// swaks sent, apart from the trace fields added on the way, and Postfix
// must have seen the connection come from the pinned source address.
func TestDeliveryThroughPostfix(t *testing.T) {
	peers.Require(t, "postfix", "swaks")
	t.Parallel()
	n := newMailNet(t)
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	px := n.postfix("dest.test", peers.PostfixConfig{DeliverTo: final.Addr})
	r := n.relay()

	msg := message("a@src.test", "b@dest.test", "through postfix")
	id := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"b@dest.test"}, Data: msg})
	got := final.WaitFor(t, 1, 30*time.Second)[0]

	if got.From != "a@src.test" || !slices.Equal(got.Rcpts, []string{"b@dest.test"}) {
		t.Errorf("envelope at the destination: MAIL <%s> RCPT %v, want <a@src.test> [b@dest.test]", got.From, got.Rcpts)
	}
	if stripped := withoutTrace(got.Data); !bytes.Equal(stripped, onWire(msg)) {
		t.Errorf("message changed on the way (trace fields removed):\n--- sent\n%q\n--- arrived\n%q", onWire(msg), stripped)
	}
	received := strings.Count(string(got.Data), "\r\nReceived: ")
	if !bytes.HasPrefix(got.Data, []byte("Received: ")) || received < 1 {
		t.Errorf("want a Received field from Postfix and one from greyrelay, message starts:\n%s", head(got.Data))
	}
	if !strings.Contains(string(got.Data), "by relay.test (greyrelay)") || !strings.Contains(string(got.Data), "["+r.IP+"]") {
		t.Errorf("no greyrelay Received field, or Postfix's does not show the source address %s:\n%s", r.IP, head(got.Data))
	}

	log := px.WaitLog(10*time.Second, "connect from unknown["+r.IP+"]", "client=unknown["+r.IP+"]")
	if !strings.Contains(log, "connect from unknown["+r.IP+"]") || !strings.Contains(log, "client=unknown["+r.IP+"]") {
		t.Errorf("Postfix did not see the pinned source address %s:\n%s", r.IP, log)
	}
	atts := r.waitAttempts(id, "delivered", 10*time.Second)
	if len(atts) != 1 {
		t.Fatalf("want one delivery attempt, got %v", outcomes(atts))
	}
	a := atts[0]
	if a.str("source_ip") != r.IP || a.str("mx") != "mx.dest.test" || a.num("code") != 250 {
		t.Errorf("attempt log line: source_ip %q mx %q code %v, want %s mx.dest.test 250: %v", a.str("source_ip"), a.str("mx"), a.num("code"), r.IP, a)
	}
}

// TestDeliveryOneTransactionPerDomain sends one message to four recipients
// at three domains, each with its own MX host: each host must see exactly
// one transaction, naming only its own domain's recipients, coming from the
// pinned source address.
func TestDeliveryOneTransactionPerDomain(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	want := map[string][]string{
		"one.test":   {"a1@one.test", "a2@one.test"},
		"two.test":   {"b@two.test"},
		"three.test": {"c@three.test"},
	}
	sinks := map[string]*peers.Sink{}
	var all []string
	for dom, rcpts := range want {
		sinks[dom] = n.sink(dom, peers.SinkOptions{})
		all = append(all, rcpts...)
	}
	slices.Sort(all)
	r := n.relay()
	msg := message("a@src.test", "a1@one.test", "three domains")
	id := r.send(peers.SwaksMessage{From: "a@src.test", To: all, Data: msg})

	for dom, s := range sinks {
		got := s.WaitFor(t, 1, 20*time.Second)[0]
		rcpts := slices.Clone(got.Rcpts)
		slices.Sort(rcpts)
		if !slices.Equal(rcpts, want[dom]) {
			t.Errorf("%s's MX got recipients %v, want %v", dom, rcpts, want[dom])
		}
		if got.ClientIP != r.IP {
			t.Errorf("%s's MX saw the relay come from %s, want the pinned %s", dom, got.ClientIP, r.IP)
		}
		if !bytes.Equal(withoutTrace(got.Data), onWire(msg)) {
			t.Errorf("%s's MX got a changed message:\n%q", dom, got.Data)
		}
	}
	r.waitQueueEmpty(10 * time.Second)
	for dom, s := range sinks {
		if txs := s.Transactions(); len(txs) != 1 {
			t.Errorf("%s's MX saw %d transactions, want exactly 1", dom, len(txs))
		}
	}
	var delivered []string
	for _, a := range r.attempts(id) {
		if a.str("outcome") == "delivered" {
			delivered = append(delivered, a.str("rcpt"))
		}
	}
	slices.Sort(delivered)
	if !slices.Equal(delivered, all) {
		t.Errorf("delivered attempt lines for %v, want one for each of %v", delivered, all)
	}
}

// head returns the header section of a message, for failure output.
func head(msg []byte) string {
	h, _, _ := bytes.Cut(msg, []byte("\r\n\r\n"))
	return string(h)
}

// TestDeliveryLargeMessageSpooled sends a 3 MiB message, larger than the
// queue keeps in its database: its body goes to a file in the spool
// directory next to the queue, survives a SIGKILL and a restart, reaches
// the MX byte for byte once it listens, and the file is removed when the
// message is done.
func TestDeliveryLargeMessageSpooled(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	mx := n.mxAddr("big.test") // nothing listens yet: connection refused, deferred
	r := n.relay()
	line := strings.Repeat("spooled body line ", 4) + "\r\n"
	msg := append(message("a@src.test", "x@big.test", "large"), "\r\n"...)
	msg = append(msg, strings.Repeat(line, 3<<20/len(line))+"tail"...)
	r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"x@big.test"}, Data: msg})

	spool := filepath.Join(r.Dir, "queue.db.bodies")
	if files := dirNames(t, spool); len(files) != 1 {
		t.Fatalf("spool %s holds %v after the 250, want one body file", spool, files)
	}
	r.Kill()
	r.Restart(t)
	sink := peers.StartSink(t, mx, peers.SinkOptions{Domain: "mx.big.test"})
	got := sink.WaitFor(t, 1, 30*time.Second)[0]
	if !bytes.Equal(withoutTrace(got.Data), onWire(msg)) {
		t.Errorf("the MX got %d octets, not the %d sent (head %q)", len(got.Data), len(onWire(msg)), head(got.Data))
	}
	r.waitQueueEmpty(10 * time.Second)
	// The file is removed after the commit that deletes the message, so
	// that a crash in between leaves an orphan for the next start rather
	// than a queued message without its body. The admin API can show the
	// queue empty before the file goes: on a loaded machine the queue's
	// writer may wait for the CPU between the two.
	relaytest.Eventually(t, 10*time.Second, "the spool file removed after delivery", func() error {
		if files := dirNames(t, spool); len(files) != 0 {
			return fmt.Errorf("spool still holds %v", files)
		}
		return nil
	})

}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
