package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestRobustCrashFreshAttempt kills the relay with SIGKILL inside the
// next hop's DATA of a fresh attempt: the first attempt of a message
// begun from the journal's copy, whose start is stored only with its
// outcome (no Begin commit before it is sent). The sink refuses that
// DATA, so the only copy that can reach it is a later attempt's.
//
// The kill comes once the relay's database holds the message (the admin
// API's stats wait for the journal's inserts), so that it is the
// database's record, not the journal's replay, that must bring the
// message back.
//
// Invariants: during the attempt the recipients are Queued in the
// database (not Active as after a Begin); after the restart the message reaches every recipient
// intact (an acknowledged message is never lost; the kill may even come
// before the client reads its 250, since the attempt starts once the
// journal's fdatasync returned); and the restarted relay
// counts its delivery as attempt 1, which shows that the killed attempt
// was a fresh one (a Begun attempt would be recovered and counted: the
// delivery would be attempt 2) and that a fresh attempt leaves its
// recipients Queued until its outcome commits.
func TestRobustCrashFreshAttempt(t *testing.T) {
	t.Parallel()
	relayIP, sinkIP, clientIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	var pid atomic.Int64
	var killed atomic.Bool
	var admin atomic.Value // the relay's admin address
	var seen rbStatsJSON   // the queue while the attempt was in the sink's DATA
	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{Data: func(_ []string, attempt int) *smtp.SMTPError {
		if attempt == 1 {
			seen = rbWaitQueued(admin.Load().(string), 2)
			rbKillPID(int(pid.Load())) // the sink holds the whole message; the relay never reads a reply
			killed.Store(true)
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "not this time"}
		}
		return nil
	}})
	cfg := rbRelay{IP: relayIP, Routes: map[string]string{"dest.test": sink.Addr}}
	r := peers.StartRelay(t, cfg.YAML(t))
	pid.Store(int64(r.Cmd.Process.Pid))
	admin.Store(r.AdminAddr)

	rcpts := []string{"a@dest.test", "b@dest.test"}
	data := rbMessage("fresh-crash@src.test", "fresh attempt killed", 8<<10, rand.New(rand.NewPCG(7, 7)))
	c, err := rbDialSMTP(r.SMTPAddr, clientIP, false, "client.test")
	if err != nil {
		t.Fatal(err)
	}
	reply, err := c.Send(rbTx{From: "sender@src.test", Rcpts: rcpts, Data: data})
	// The attempt starts once the journal holds the message, and may reach
	// the sink (and the kill) before the 250 reaches the client: then the
	// connection dies after the final dot. Durable either way.
	if (err != nil && !killed.Load()) || (err == nil && reply.Code != 250) {
		t.Fatalf("final dot: %v %v", reply, err)
	}
	c.Close()
	rbWaitUntil(t, 30*time.Second, "the kill inside the sink's DATA", killed.Load)
	rbWaitUntil(t, 10*time.Second, "the relay to die", func() bool { return !r.Running() })
	if seen.Messages != 1 || seen.ByStatus["queued"] != len(rcpts) {
		t.Errorf("during the attempt the database held %+v; want the message with its %d recipients Queued", seen, len(rcpts))
	}
	if got := len(sink.Messages()); got != 0 {
		t.Fatalf("the sink took %d messages before the restart; want none (it refused the first DATA)", got)
	}
	before := len(r.Log())

	r.Restart(t)
	msgs := sink.WaitFor(t, 1, 30*time.Second)
	got := msgs[0]
	if rbHash(rbStripReceived(got.Data)) != rbHash(data) {
		t.Fatalf("the body changed on the way")
	}
	if strings.Join(got.Rcpts, ",") != strings.Join(rcpts, ",") {
		t.Fatalf("delivered to %v, want %v", got.Rcpts, rcpts)
	}
	// The sink has the message before the relay reads its 250 and logs.
	rbWaitUntil(t, 30*time.Second, "the deliveries in the log", func() bool {
		return strings.Count(r.Log()[before:], `"outcome": "delivered"`) >= len(rcpts)
	})
	after := r.Log()[before:]
	if strings.Contains(after, "recovered interrupted delivery attempts") {
		t.Errorf("the restart recovered a Begun attempt: the killed attempt was not a fresh one\n%s", after)
	}
	for _, rc := range rcpts {
		line := rbGrep(after, `"rcpt": "`+rc+`"`)
		if !strings.Contains(line, `"outcome": "delivered"`) || !strings.Contains(line, `"attempt": 1,`) {
			t.Errorf("recipient %s: want its delivery logged as attempt 1 after the restart, got %q", rc, line)
		}
	}
	if t.Failed() {
		t.Log(fmt.Sprint("relay log after the restart:\n", after))
	}
}

// rbWaitQueued polls the relay's stats until n recipients are Queued, for
// at most 5 s, and returns the last stats read. It runs inside the sink's
// DATA handler, so it reports instead of failing the test.
func rbWaitQueued(admin string, n int) rbStatsJSON {
	var st rbStatsJSON
	c := &http.Client{Timeout: 2 * time.Second}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		resp, err := c.Get("http://" + admin + "/api/stats")
		if err != nil {
			continue
		}
		st = rbStatsJSON{}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err == nil && st.ByStatus["queued"] >= n {
			break
		}
	}
	return st
}
