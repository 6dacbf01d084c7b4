package integration

// Operations: the queue commands against a populated queue,
// destinations and health, Prometheus metrics after a scripted delivery,
// JSON log lines with their fields, no secrets in the log, and a SIGTERM
// under load that loses no acknowledged message.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	dto "github.com/prometheus/client_model/go"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestOpsQueueCommands populates the queue with messages for a destination
// that always defers (retries a minute apart, so nothing moves by itself)
// and drives every queue command through the binary.
func TestOpsQueueCommands(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	n.sink("slow.test", peers.SinkOptions{Rcpt: func(string, int) *smtp.SMTPError {
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Temporary local problem, please try later"}
	}})
	senderMX := n.sink("src.test", peers.SinkOptions{})
	r := n.relay("retry.initial_interval=1m", "retry.max_interval=10m")

	ids := make([]string, 4)
	for i := range ids {
		rc := fmt.Sprintf("x%d@slow.test", i+1)
		ids[i] = r.send(peers.SwaksMessage{From: "a@src.test", To: []string{rc}, Data: message("a@src.test", rc, "ops "+rc)})
	}
	waitAttemptCount := func(id string, want int, status string) {
		t.Helper()
		relaytest.Eventually(t, 15*time.Second, fmt.Sprintf("%s at %d attempts, %s", id, want, status), func() error {
			rows := r.rowsOf(id)
			if len(rows) != 1 || rows[0].Attempts < want || rows[0].Status != status {
				return fmt.Errorf("rows %+v", rows)
			}
			return nil
		})

	}
	for _, id := range ids {
		waitAttemptCount(id, 1, "deferred")
	}

	t.Run("list", func(t *testing.T) {
		res := r.cli("queue", "list")
		if res.Code != 0 || !strings.Contains(res.Stdout, "QUEUE ID") || strings.Count(res.Stdout, "deferred") != 4 {
			t.Errorf("queue list: want a table with 4 deferred recipients, got %s", res)
		}
		for _, id := range ids {
			if !strings.Contains(res.Stdout, id+"/0") {
				t.Errorf("queue list does not show %s/0:\n%s", id, res.Stdout)
			}
		}
		res = r.cli("queue", "list", "-json")
		var l apiList
		if res.Code != 0 || json.Unmarshal([]byte(res.Stdout), &l) != nil || l.Total != 4 || len(l.Rows) != 4 {
			t.Fatalf("queue list -json: want 4 rows, got %s", res)
		}
		for _, row := range l.Rows {
			if row.Status != "deferred" || row.Attempts != 1 || row.SourceIP != r.IP || row.LastReply == nil || row.LastReply.Code != 451 || row.NextAttempt == nil {
				t.Errorf("queue list -json row %+v: want deferred after 1 attempt from %s, last reply 451, a next attempt", row, r.IP)
			}
		}
	})

	t.Run("show", func(t *testing.T) {
		res := r.cli("queue", "show", ids[0])
		if res.Code != 0 || !strings.Contains(res.Stdout, ids[0]) || !strings.Contains(res.Stdout, "x1@slow.test") || !strings.Contains(res.Stdout, "451 4.3.0") {
			t.Errorf("queue show: want the id, recipient and last reply, got %s", res)
		}
		res = r.cli("queue", "show", "-json", ids[0])
		var m apiMessage
		if res.Code != 0 || json.Unmarshal([]byte(res.Stdout), &m) != nil || len(m.Recipients) != 1 {
			t.Fatalf("queue show -json: %s", res)
		}
		if h := m.Recipients[0].History; len(h) != 1 || h[0].SourceIP != r.IP || h[0].Outcome != "deferred" {
			t.Errorf("queue show -json history %+v: want one deferred attempt from %s", h, r.IP)
		}
	})

	t.Run("retry", func(t *testing.T) {
		res := r.cli("queue", "retry", ids[0])
		if res.Code != 0 || !strings.Contains(res.Stdout, "retry: 1 recipient") {
			t.Errorf("queue retry: %s", res)
		}
		waitAttemptCount(ids[0], 2, "deferred")
	})

	t.Run("hold and release", func(t *testing.T) {
		if res := r.cli("queue", "hold", ids[1]); res.Code != 0 || !strings.Contains(res.Stdout, "hold: 1 recipient") {
			t.Errorf("queue hold: %s", res)
		}
		res := r.cli("queue", "list", "-status", "held")
		if res.Code != 0 || !strings.Contains(res.Stdout, ids[1]) || strings.Count(res.Stdout, "held") != 1 {
			t.Errorf("queue list -status held: want only %s, got %s", ids[1], res)
		}
		if res := r.cli("queue", "release", ids[1]); res.Code != 0 || !strings.Contains(res.Stdout, "release: 1 recipient") {
			t.Errorf("queue release: %s", res)
		}
		waitAttemptCount(ids[1], 2, "deferred")
	})

	t.Run("delete", func(t *testing.T) {
		if res := r.cli("queue", "delete", ids[2]); res.Code != 0 || !strings.Contains(res.Stdout, "delete: 1 recipient") {
			t.Errorf("queue delete: %s", res)
		}
		if res := r.cli("queue", "show", ids[2]); res.Code == 0 || !strings.Contains(res.Stderr, "404") {
			t.Errorf("queue show of a deleted message: want an error with HTTP 404, got %s", res)
		}
	})

	t.Run("bounce", func(t *testing.T) {
		if res := r.cli("queue", "bounce", ids[3]); res.Code != 0 || !strings.Contains(res.Stdout, "bounce: 1 recipient") {
			t.Errorf("queue bounce: %s", res)
		}
		dsn := senderMX.WaitFor(t, 1, 15*time.Second)[0]
		rep := parseDSN(t, dsn.Data)
		g := rep.recipient("x4@slow.test")
		if dsn.From != "" || len(rep.Recipients) != 1 || g == nil || g.Get("Action") != "failed" || !strings.HasPrefix(g.Get("Status"), "5.") {
			t.Errorf("bounce DSN: from <%s>, recipients %v; want from <>, only x4@slow.test, failed 5.x.x", dsn.From, rep.Recipients)
		}
		relaytest.Eventually(t, 5*time.Second, "the bounced message to leave the queue", func() error {
			if rows := r.rowsOf(ids[3]); len(rows) > 0 {
				return fmt.Errorf("still there: %+v", rows)
			}
			return nil
		})

	})

	t.Run("retry by domain", func(t *testing.T) {
		res := r.cli("queue", "retry", "-domain", "slow.test")
		if res.Code != 0 || !strings.Contains(res.Stdout, "retry: 2 recipient") {
			t.Errorf("queue retry -domain slow.test: want 2 recipients (the bounced and deleted ones are gone), got %s", res)
		}
		if res := r.cli("queue", "retry"); res.Code == 0 {
			t.Errorf("queue retry without a selector must fail, got %s", res)
		}
	})

	t.Run("destinations", func(t *testing.T) {
		res := r.cli("destinations")
		if res.Code != 0 || !strings.Contains(res.Stdout, "DOMAIN") || !strings.Contains(res.Stdout, "slow.test") {
			t.Errorf("destinations: want a table with slow.test, got %s", res)
		}
		res = r.cli("destinations", "-json")
		var d apiDestinations
		if res.Code != 0 || json.Unmarshal([]byte(res.Stdout), &d) != nil ||
			!slices.ContainsFunc(d.Destinations, func(x apiDestination) bool { return x.Domain == "slow.test" }) {
			t.Errorf("destinations -json: want slow.test, got %s", res)
		}
	})

	t.Run("health", func(t *testing.T) {
		if res := r.cli("health"); res.Code != 0 || strings.TrimSpace(res.Stdout) != "ok" {
			t.Errorf("health of a running relay: want exit 0 and \"ok\", got %s", res)
		}
		if err := r.Stop(); err != nil {
			t.Fatalf("relay stop: %v", err)
		}
		res := r.cli("health")
		if res.Code == 0 || !strings.Contains(res.Stderr, "not healthy") || !strings.Contains(res.Stderr, "not reachable") {
			t.Errorf("health of a stopped relay: want a non-zero exit saying it is not healthy and not reachable, got %s", res)
		}
	})
}

// TestOpsMetricsAndLogs runs a scripted delivery (one message delivered,
// one greylisted, one refused with 550 5.1.1 and so bounced) and checks
// the Prometheus metrics and the JSON log lines it leaves.
func TestOpsMetricsAndLogs(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	okMX := n.sink("ok.test", peers.SinkOptions{})
	n.sink("grey.test", peers.SinkOptions{Rcpt: peers.Greylist(1000)})
	n.sink("bad.test", peers.SinkOptions{Rcpt: func(rcpt string, _ int) *smtp.SMTPError {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "<" + rcpt + ">: Recipient address rejected: User unknown"}
	}})
	senderMX := n.sink("src.test", peers.SinkOptions{})
	r := n.relay("retry.greylist_first_retry=1m")

	idOK := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"ok@ok.test"}, Data: message("a@src.test", "ok@ok.test", "metrics ok")})
	idGrey := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"g@grey.test"}, Data: message("a@src.test", "g@grey.test", "metrics grey")})
	idBad := r.send(peers.SwaksMessage{From: "a@src.test", To: []string{"b@bad.test"}, Data: message("a@src.test", "b@bad.test", "metrics bad")})
	okMX.WaitFor(t, 1, 10*time.Second)
	senderMX.WaitFor(t, 1, 10*time.Second)

	type sample struct {
		name   string
		labels map[string]string
		want   float64
	}
	want := []sample{
		{"greyrelay_accepted_messages_total", nil, 3},
		{"greyrelay_delivery_attempts_total", nil, 4},
		{"greyrelay_delivery_attempts_total", map[string]string{"outcome": "delivered", "reason": "none"}, 2}, // the message and the DSN
		{"greyrelay_delivery_attempts_total", map[string]string{"outcome": "deferred", "reason": "greylisted"}, 1},
		{"greyrelay_delivery_attempts_total", map[string]string{"outcome": "failed", "reason": "no-such-user"}, 1},
		{"greyrelay_queue_recipients", nil, 1},
		{"greyrelay_queue_recipients", map[string]string{"status": "deferred"}, 1},
		{"greyrelay_queue_recipients_by_reason", map[string]string{"reason": "greylisted"}, 1},
		{"greyrelay_queue_messages", nil, 1},
		{"greyrelay_dsn_total", map[string]string{"action": "failed"}, 1},
	}
	relaytest.Eventually(t, 10*time.Second, "the metrics of the scripted delivery", func() error {
		mfs := r.metrics()
		var wrong []string
		for _, s := range want {
			if got := metricValue(mfs, s.name, s.labels); got != s.want {
				wrong = append(wrong, fmt.Sprintf("%s%v = %v, want %v", s.name, s.labels, got, s.want))
			}
		}
		for _, status := range []string{"queued", "deferred", "active", "held", "delivered", "relayed", "failed"} {
			if mfs["greyrelay_queue_recipients"] != nil && !hasLabel(mfs["greyrelay_queue_recipients"].GetMetric(), "status", status) {
				wrong = append(wrong, "greyrelay_queue_recipients has no status="+status+" sample")
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%s", strings.Join(wrong, "; "))
		}
		return nil
	})

	entries := r.logEntries() // also fails on any line that is not JSON
	accepted := map[string]logEntry{}
	for _, e := range entries {
		if e.str("msg") == "accepted" {
			accepted[e.str("queue_id")] = e
		}
	}
	for _, id := range []string{idOK, idGrey, idBad} {
		e, ok := accepted[id]
		if !ok {
			t.Errorf("no \"accepted\" log line for %s", id)
			continue
		}
		if missing := missingFields(e, "queue_id", "client", "from", "rcpts", "size", "tls", "time", "level"); len(missing) > 0 {
			t.Errorf("accepted line lacks %v: %v", missing, e)
		}
		if e.str("from") != "a@src.test" || e.num("rcpts") != 1 || e.num("size") <= 0 || e["tls"] != false || !strings.HasPrefix(e.str("client"), "127.0.0.1:") {
			t.Errorf("accepted line values: %v", e)
		}
	}
	for _, id := range []string{idOK, idGrey, idBad} {
		atts := r.attempts(id)
		if len(atts) != 1 {
			t.Errorf("%s: want one attempt line, got %v", id, outcomes(atts))
			continue
		}
		a := atts[0]
		if missing := missingFields(a, "queue_id", "rcpt", "domain", "mx", "source_ip", "attempt", "outcome", "reason", "code", "reply"); len(missing) > 0 {
			t.Errorf("attempt line lacks %v: %v", missing, a)
		}
		if a.str("source_ip") != r.IP || a.num("attempt") != 1 {
			t.Errorf("attempt line: source_ip %q attempt %v, want %s and 1", a.str("source_ip"), a.num("attempt"), r.IP)
		}
		_, hasNext := a["next_attempt"]
		if deferred := a.str("outcome") == "deferred"; hasNext != deferred {
			t.Errorf("attempt line with outcome %s: next_attempt present %v, want %v", a.str("outcome"), hasNext, deferred)
		}
		if hasNext && !a.time("next_attempt").After(a.time("time")) {
			t.Errorf("next_attempt %q is not after the line's time %q", a.str("next_attempt"), a.str("time"))
		}
	}
	if a := r.attempts(idGrey)[0]; a.str("reason") != "greylisted" || a.num("code") != 450 || !strings.Contains(a.str("reply"), "Greylisted") {
		t.Errorf("greylisted attempt line: %v", a)
	}
}

func hasLabel(ms []*dto.Metric, name, value string) bool {
	for _, m := range ms {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == name && lp.GetValue() == value {
				return true
			}
		}
	}
	return false
}

func missingFields(e logEntry, keys ...string) []string {
	var out []string
	for _, k := range keys {
		if _, ok := e[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// TestOpsNoSecretsInLogs authenticates with PLAIN and LOGIN, right and
// wrong, at debug log level, and looks for the passwords and their base64
// forms in everything the relay wrote.
func TestOpsNoSecretsInLogs(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	const good, wrong = "Tr0ub4dor&3-horse", "wrong-Pa55word-xyz"
	dir := t.TempDir()
	line := runGreyrelay(t, dir, good+"\n", nil, "user", "add", "alice")
	if line.Code != 0 {
		t.Fatalf("user add: %s", line)
	}
	users := filepath.Join(dir, "users")
	if err := os.WriteFile(users, []byte(line.Stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	r := n.relay("users_file="+users, "trusted_networks=[]", "log.level=debug")

	send := func(mech, pass string) (string, int) {
		return peers.SwaksMessage{Server: r.SMTPAddr, From: "alice@src.test", To: []string{"x@dest.test"},
			Data: message("alice@src.test", "x@dest.test", "auth "+mech),
			Args: []string{"--auth", mech, "--auth-user", "alice", "--auth-password", pass}}.Send(t)
	}
	for _, c := range []struct {
		mech, pass string
		code       int
	}{{"PLAIN", good, 0}, {"LOGIN", good, 0}, {"PLAIN", wrong, 28}, {"LOGIN", wrong, 28}} {
		if out, code := send(c.mech, c.pass); code != c.code {
			t.Fatalf("AUTH %s: swaks exit %d, want %d:\n%s", c.mech, code, c.code, out)
		}
	}
	sink.WaitFor(t, 2, 10*time.Second)
	if err := r.Stop(); err != nil { // flush everything to the log
		t.Fatal(err)
	}
	log := r.Log()
	b64 := base64.StdEncoding.EncodeToString
	for _, pass := range []string{good, wrong} {
		for _, secret := range []string{pass, b64([]byte(pass)), b64([]byte("\x00alice\x00" + pass)), b64([]byte("alice\x00alice\x00" + pass))} {
			if strings.Contains(log, secret) {
				t.Errorf("the relay's log contains the secret %q", secret)
			}
		}
	}
	if !strings.Contains(log, `"user":"alice"`) {
		t.Errorf("the accepted lines do not name the authenticated user:\n%s", log)
	}
}

// TestOpsSIGTERMUnderLoad sends SIGTERM while several SMTP clients are
// submitting. Every message a client got a 250 for must be delivered after
// the relay is started again: a 250 is never given for a message that was
// not committed.
func TestOpsSIGTERMUnderLoad(t *testing.T) {
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("load.test", peers.SinkOptions{})
	r := n.relay()

	var (
		mu    sync.Mutex
		acked = map[int]string{} // sequence number → queue id from the 250
		seq   atomic.Int64
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loadClient(r.SMTPAddr, &seq, stop, func(s int, id string) {
				mu.Lock()
				acked[s] = id
				mu.Unlock()
			})
		}()
	}
	countAcked := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	relaytest.Eventually(t, 20*time.Second, "40 messages accepted under load", func() error {
		if c := countAcked(); c < 40 {
			return fmt.Errorf("%d so far", c)
		}
		return nil
	})

	if err := r.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	relaytest.Eventually(t, 25*time.Second, "the relay to exit after SIGTERM", func() error {
		if r.Running() {
			return fmt.Errorf("still running")
		}
		return nil
	})

	close(stop)
	wg.Wait()
	if err := r.Stop(); err != nil { // already exited: this is its exit status
		t.Errorf("relay exit after SIGTERM under load: %v", err)
	}
	total := countAcked()

	r.Restart(t)
	var missing []int
	relaytest.Eventually(t, 30*time.Second, "every acknowledged message at the destination", func() error {
		seen := map[int]bool{}
		for _, m := range sink.Messages() {
			if s, ok := loadSeq(m.Data); ok {
				seen[s] = true
			}
		}
		mu.Lock()
		defer mu.Unlock()
		missing = missing[:0]
		for s := range acked {
			if !seen[s] {
				missing = append(missing, s)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d of %d acknowledged messages missing, e.g. seq %d (queue id %s)", len(missing), len(acked), missing[0], acked[missing[0]])
		}
		return nil
	})

	r.waitQueueEmpty(10 * time.Second)
	t.Logf("%d messages acknowledged under load, all delivered after the restart", total)
}

var loadSeqRE = regexp.MustCompile(`(?m)^X-Load-Seq: (\d+)\r$`)

func loadSeq(data []byte) (int, bool) {
	m := loadSeqRE.FindSubmatch(data)
	if m == nil {
		return 0, false
	}
	s, err := strconv.Atoi(string(m[1]))
	return s, err == nil
}

// loadClient submits messages over one connection after another until stop
// is closed or the relay refuses connections, reporting each 250 with its
// sequence number and queue id.
func loadClient(addr string, seq *atomic.Int64, stop <-chan struct{}, acked func(seq int, id string)) {
	queued := regexp.MustCompile(`queued as ([0-9a-f]{16})`)
	for {
		select {
		case <-stop:
			return
		default:
		}
		c, err := smtp.Dial(addr)
		if err != nil {
			return // the relay has stopped listening
		}
		c.CommandTimeout, c.SubmissionTimeout = 15*time.Second, 15*time.Second
		if c.Hello("load.client.test") != nil {
			c.Close()
			continue
		}
		for {
			s := int(seq.Add(1))
			id, err := loadOne(c, s, queued)
			if err != nil {
				break
			}
			acked(s, id)
		}
		c.Close()
	}
}

// loadOne sends one message on c and returns the queue id of its 250.
func loadOne(c *smtp.Client, s int, queued *regexp.Regexp) (string, error) {
	rcpt := fmt.Sprintf("r%d@load.test", s)
	if err := c.Mail("load@src.test", nil); err != nil {
		return "", err
	}
	if err := c.Rcpt(rcpt, nil); err != nil {
		return "", err
	}
	w, err := c.Data()
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "From: <load@src.test>\r\nTo: <%s>\r\nSubject: load %d\r\nX-Load-Seq: %d\r\n\r\n", rcpt, s, s)
	b.WriteString(strings.Repeat("load test body line\r\n", 200))
	if _, err := w.Write(b.Bytes()); err != nil {
		return "", err
	}
	resp, err := w.CloseWithResponse()
	if err != nil {
		return "", err
	}
	m := queued.FindStringSubmatch(resp.StatusText)
	if m == nil {
		return "", fmt.Errorf("250 without a queue id: %q", resp.StatusText)
	}
	return m[1], nil
}

// TestOpsAPIRefusesUnscopedAction checks that a bulk action without a
// domain or all=1 is refused (400) rather than applied to the whole queue.
func TestOpsAPIRefusesUnscopedAction(t *testing.T) {
	t.Parallel()
	n := newMailNet(t)
	r := n.relay()
	req, err := http.NewRequest(http.MethodPost, "http://"+r.AdminAddr+"/api/queue/delete", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("POST /api/queue/delete without domain or all: HTTP %d, want 400", resp.StatusCode)
	}
}
