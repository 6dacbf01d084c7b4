package integration

// This file holds the crash-safety test and the helpers that every
// robustness test (crash, diskfull, hostile, limits, openrelay,
// smarthost, smuggling) shares. The helpers are prefixed "rb" so that they
// never collide with the other integration files of this package.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	bolt "go.etcd.io/bbolt"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestRobustCrashSafety: a SIGKILL never loses an accepted message. 20
// concurrent clients inject 2,000 messages while the relay is killed with
// SIGKILL twelve times and restarted each time. The kills rotate over four
// moments: in the middle of a message body (the client is held there until
// the relay is dead), right after a client sent the final dot (the
// ambiguous window, and often the bbolt commit), while the sink is receiving
// a delivery (the relay dies before it reads the sink's 250: a duplicate is
// expected) and at a random point.
//
// Invariants: every message that got a 250 reaches every recipient at least
// once with the body it was sent with; a message that did not get a 250
// reaches the sink only if the client saw the connection die after its
// final dot, and then intact; the database passes bbolt's consistency check
// after every kill and the relay restarts and reports ready every time;
// nothing is quarantined. Duplicates are counted and logged.
//
// Message sizes are 0.5 KB to 200 KB (not up to 10 MB) and recipients 1-3
// over two domains (not 1-50 over five), to keep the run within the suite's time budget on two cores.
func TestRobustCrashSafety(t *testing.T) {
	t.Parallel()
	const (
		clients   = 20
		perClient = 100 // 2,000 messages
		kills     = 12
	)
	relayIP, sinkIP, clientIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	ks := &rbKillSwitch{}
	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{Data: ks.onData})
	cfg := rbRelay{IP: relayIP, Routes: map[string]string{"dest.test": sink.Addr, "dest2.test": sink.Addr},
		Limits: map[string]string{"max_connections_per_ip": "200"}}
	r := peers.StartRelay(t, cfg.YAML(t))
	dbPath := filepath.Join(r.Dir, "queue.db")
	ks.setPID(r.Cmd.Process.Pid)

	led := newRBLedger()
	hooks := &rbCrashHooks{midData: make(chan chan struct{}), afterDot: make(chan chan struct{})}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	deadline := time.Now().Add(150 * time.Second)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &rbCrashClient{id: c, addr: r.SMTPAddr, localIP: clientIP, led: led, hooks: hooks,
				stop: stop, deadline: deadline, rng: rand.New(rand.NewPCG(uint64(c), 7))}
			cl.run(perClient)
		}()
	}
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()
	defer func() {
		close(stop)
		<-clientsDone
	}()

	rng := rand.New(rand.NewPCG(42, 42))
	modes := []string{"mid-data", "after-dot", "delivery", "random"}
	for k := range kills {
		// Let some work happen between kills: a random number of new
		// acknowledgements (or the end of the injection).
		target := led.acks.Load() + int64(20+rng.IntN(100))
		rbWaitUntil(t, 60*time.Second, fmt.Sprintf("kill %d: %d acknowledgements", k+1, target), func() bool {
			select {
			case <-clientsDone:
				return true
			default:
			}
			return led.acks.Load() >= target
		})
		mode := modes[k%len(modes)]
		how := rbKillOnce(mode, r, ks, hooks, clientsDone)
		r.Kill() // reaps the process (already dead in every mode)
		rbCheckBolt(t, dbPath)
		r.Restart(t) // fails the test unless every listener greets and /readyz is 200
		ks.setPID(r.Cmd.Process.Pid)
		t.Logf("kill %2d: %-9s %s; acknowledged so far %d", k+1, mode, how, led.acks.Load())
	}
	select {
	case <-clientsDone:
	case <-time.After(time.Until(deadline) + 5*time.Second):
		t.Fatalf("clients did not finish in time")
	}
	for _, e := range led.errors() {
		t.Error(e)
	}

	// Everything acknowledged must arrive; then the queue must be empty.
	acked := led.acked()
	if len(acked) != clients*perClient {
		t.Errorf("%d messages acknowledged, want %d", len(acked), clients*perClient)
	}
	var idx rbSinkIndex
	rbWaitUntil(t, 90*time.Second, "every acknowledged message at every recipient", func() bool {
		idx = rbIndexSink(sink.Messages())
		return len(idx.missing(acked)) == 0
	})
	rbWaitUntil(t, 30*time.Second, "an empty queue", func() bool { return rbStats(t, r).Messages == 0 })
	idx = rbIndexSink(sink.Messages())
	rbCheckCrashLedger(t, led, idx, kills)
	if err := r.Stop(); err != nil {
		t.Errorf("final shutdown: %v", err)
	}
	rbCheckBolt(t, dbPath)
	if log := r.Log(); strings.Contains(log, "quarantined") {
		t.Errorf("the relay quarantined records after crashes:\n%s", rbGrep(log, "quarantined"))
	}
}

// rbCheckCrashLedger compares what the clients were told with what the sink
// received, and reports duplicates.
func rbCheckCrashLedger(t *testing.T, led *rbLedger, idx rbSinkIndex, kills int) {
	t.Helper()
	dups, ambiguousDelivered := 0, 0
	for id, copies := range idx.byID {
		s := led.get(id)
		switch {
		case s == nil:
			t.Errorf("the sink received %s, which no client sent", id)
			continue
		case !s.acked && !s.dotSent:
			t.Errorf("the sink received %s, whose client never sent the final dot (reply %q)", id, s.reply)
		case !s.acked:
			ambiguousDelivered++
		}
		for rcpt, hashes := range copies {
			if !slices.Contains(s.rcpts, rcpt) {
				t.Errorf("%s delivered to %s, not one of its recipients %v", id, rcpt, s.rcpts)
			}
			for _, h := range hashes {
				if h != s.hash {
					t.Errorf("%s for %s arrived altered (hash %s, sent %s)", id, rcpt, h[:12], s.hash[:12])
				}
			}
			dups += len(hashes) - 1
		}
	}
	ambiguous := 0
	for _, s := range led.all() {
		if s.dotSent && !s.acked {
			ambiguous++
		}
	}
	t.Logf("crash summary: %d kills, %d acknowledged, %d ambiguous (connection lost after the final dot), "+
		"%d of them delivered, %d duplicate deliveries (%.1f per 1000 acknowledged)",
		kills, len(led.acked()), ambiguous, ambiguousDelivered, dups, float64(dups)*1000/float64(max(len(led.acked()), 1)))
}

// rbKillOnce kills the relay at the moment mode asks for and says how it
// went (a mode whose moment did not come within 5 s falls back to an
// immediate kill).
func rbKillOnce(mode string, r *peers.Relay, ks *rbKillSwitch, hooks *rbCrashHooks, clientsDone <-chan struct{}) string {
	pid := r.Cmd.Process.Pid
	var held chan chan struct{}
	select {
	case <-clientsDone:
		if mode == "mid-data" || mode == "after-dot" {
			mode = "random" // no client left to hold
		}
	default:
	}
	switch mode {
	case "mid-data":
		held = hooks.midData
	case "after-dot":
		held = hooks.afterDot
	case "delivery":
		fired := ks.arm()
		select {
		case <-fired:
			return "during a delivery (inside the sink's DATA)"
		case <-time.After(5 * time.Second):
			if ks.disarm() {
				return "during a delivery (inside the sink's DATA)"
			}
			rbKillPID(pid)
			return "no delivery in progress: killed at once"
		}
	default:
		rbKillPID(pid)
		return "at once"
	}
	select {
	case release := <-held:
		rbKillPID(pid)
		close(release)
		return "while a client was held at that point"
	case <-time.After(5 * time.Second):
		rbKillPID(pid)
		return "no client reached that point: killed at once"
	}
}

// rbKillSwitch kills the relay from inside the sink's DATA handler when
// armed: the sink has the whole message, the relay never reads the 250.
type rbKillSwitch struct {
	mu    sync.Mutex
	pid   int
	armed bool
	fired chan struct{}
}

func (k *rbKillSwitch) setPID(pid int) {
	k.mu.Lock()
	k.pid = pid
	k.mu.Unlock()
}

func (k *rbKillSwitch) arm() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.armed, k.fired = true, make(chan struct{})
	return k.fired
}

// disarm reports whether the switch fired after all.
func (k *rbKillSwitch) disarm() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.armed {
		return true
	}
	k.armed = false
	return false
}

func (k *rbKillSwitch) onData([]string, int) *smtp.SMTPError {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.armed {
		k.armed = false
		rbKillPID(k.pid)
		close(k.fired)
	}
	return nil
}

// rbKillPID sends SIGKILL and waits (up to 5 s) until the process is dead:
// gone or a zombie waiting to be reaped.
func rbKillPID(pid int) {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	end := time.Now().Add(5 * time.Second)
	for time.Now().Before(end) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// rbCheckBolt opens the queue database (the relay must be stopped) and runs
// bbolt's consistency check on it.
func rbCheckBolt(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("queue database does not open after the kill: %v", err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		var errs []error
		for e := range tx.Check() {
			errs = append(errs, e)
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Fatalf("bbolt check failed: %v", err)
	}
}

// rbCrashHooks let the killer hold a client at a chosen point: a client
// that finds the killer waiting hands it a channel and waits until the
// killer closes it (after the kill).
type rbCrashHooks struct {
	midData  chan chan struct{}
	afterDot chan chan struct{}
}

func rbOffer(ch chan chan struct{}) {
	release := make(chan struct{})
	select {
	case ch <- release:
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
	default:
	}
}

// rbCrashClient is one application submitting its share of messages over
// one reused connection, redialling after any error and retrying a message
// that was not acknowledged under a new Message-ID.
type rbCrashClient struct {
	id       int
	addr     string
	localIP  string
	led      *rbLedger
	hooks    *rbCrashHooks
	stop     chan struct{}
	deadline time.Time
	rng      *rand.Rand
	conn     *rbConn
}

func (c *rbCrashClient) run(n int) {
	defer func() {
		if c.conn != nil {
			c.conn.Close()
		}
	}()
	for i := range n {
		for try := 0; ; try++ {
			select {
			case <-c.stop:
				return
			default:
			}
			if time.Now().After(c.deadline) {
				c.led.fail(fmt.Sprintf("client %d: message %d not acknowledged before the deadline (%d tries)", c.id, i, try))
				return
			}
			if c.attempt(i, try) {
				break
			}
		}
	}
}

// attempt submits message i once and reports whether it was acknowledged.
func (c *rbCrashClient) attempt(i, try int) bool {
	if c.conn == nil {
		conn, err := rbDialSMTP(c.addr, c.localIP, false, "crash-client.test")
		if err != nil {
			time.Sleep(time.Duration(10+c.rng.IntN(40)) * time.Millisecond) // the relay is down: back off a little
			return false
		}
		c.conn = conn
	}
	id := fmt.Sprintf("c%02d.m%03d.t%d@crash.test", c.id, i, try)
	rcpts := c.recipients(i)
	data := rbMessage(id, "crash "+id, rbCrashSize(c.rng), c.rng)
	s := &rbSent{id: id, rcpts: rcpts, hash: rbHash(data)}
	c.led.add(s)
	tx := rbTx{From: fmt.Sprintf("app%02d@src.test", c.id), Rcpts: rcpts, Data: data}
	if len(data) > 64<<10 {
		tx.MidBody = func() { rbOffer(c.hooks.midData) }
	}
	tx.AfterDot = func() {
		c.led.dotSent(id)
		if c.rng.IntN(4) == 0 {
			rbOffer(c.hooks.afterDot)
		}
	}
	rep, err := c.conn.Send(tx)
	switch {
	case err != nil:
		c.conn.Close()
		c.conn = nil
		return false
	case rep.Code == 250:
		c.led.ack(id, rep.String())
		return true
	case rep.Code/100 == 5:
		c.led.fail(fmt.Sprintf("client %d: %s refused permanently: %s", c.id, id, rep))
		c.led.reply(id, rep.String())
		c.conn.Close()
		c.conn = nil
		return false
	default:
		c.led.reply(id, rep.String())
		c.conn.Close()
		c.conn = nil
		return false
	}
}

func (c *rbCrashClient) recipients(i int) []string {
	n := 1 + c.rng.IntN(3)
	var rs []string
	for j := range n {
		dom := "dest.test"
		if c.rng.IntN(2) == 0 {
			dom = "dest2.test"
		}
		rs = append(rs, fmt.Sprintf("u%02d.%03d.%d@%s", c.id, i, j, dom))
	}
	return rs
}

// rbCrashSize: mostly small messages, some of tens of kilobytes and a few
// of up to 200 KB, whose DATA phase is long enough to be hit by a kill.
func rbCrashSize(rng *rand.Rand) int {
	switch p := rng.IntN(100); {
	case p < 80:
		return 512 + rng.IntN(3584)
	case p < 95:
		return 16<<10 + rng.IntN(48<<10)
	default:
		return 100<<10 + rng.IntN(100<<10)
	}
}

// rbLedger is what the clients know: every message they tried, and what
// they were told.
type rbLedger struct {
	mu   sync.Mutex
	sent map[string]*rbSent
	errs []string
	acks atomic.Int64
}

type rbSent struct {
	id      string
	rcpts   []string
	hash    string // of the message as sent (before dot-stuffing)
	dotSent bool   // the final dot went out
	acked   bool   // 250 after the final dot
	reply   string // the last reply, if any
}

func newRBLedger() *rbLedger { return &rbLedger{sent: map[string]*rbSent{}} }

func (l *rbLedger) add(s *rbSent) {
	l.mu.Lock()
	l.sent[s.id] = s
	l.mu.Unlock()
}

func (l *rbLedger) dotSent(id string) {
	l.mu.Lock()
	l.sent[id].dotSent = true
	l.mu.Unlock()
}

func (l *rbLedger) ack(id, reply string) {
	l.mu.Lock()
	l.sent[id].acked, l.sent[id].reply = true, reply
	l.mu.Unlock()
	l.acks.Add(1)
}

func (l *rbLedger) reply(id, reply string) {
	l.mu.Lock()
	l.sent[id].reply = reply
	l.mu.Unlock()
}

func (l *rbLedger) fail(msg string) {
	l.mu.Lock()
	l.errs = append(l.errs, msg)
	l.mu.Unlock()
}

func (l *rbLedger) errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

func (l *rbLedger) get(id string) *rbSent {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.sent[id]; ok {
		c := *s
		return &c
	}
	return nil
}

func (l *rbLedger) all() []rbSent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]rbSent, 0, len(l.sent))
	for _, s := range l.sent {
		out = append(out, *s)
	}
	return out
}

func (l *rbLedger) acked() []rbSent {
	var out []rbSent
	for _, s := range l.all() {
		if s.acked {
			out = append(out, s)
		}
	}
	return out
}

// rbSinkIndex maps Message-ID → recipient → hashes of every copy received
// (Received header fields removed).
type rbSinkIndex struct {
	byID map[string]map[string][]string
}

func rbIndexSink(msgs []peers.Received) rbSinkIndex {
	idx := rbSinkIndex{byID: map[string]map[string][]string{}}
	for _, m := range msgs {
		id := rbMessageID(m.Data)
		h := rbHash(rbStripReceived(m.Data))
		if idx.byID[id] == nil {
			idx.byID[id] = map[string][]string{}
		}
		for _, rc := range m.Rcpts {
			idx.byID[id][rc] = append(idx.byID[id][rc], h)
		}
	}
	return idx
}

// missing lists "id rcpt" pairs of ss not yet received.
func (x rbSinkIndex) missing(ss []rbSent) []string {
	var out []string
	for _, s := range ss {
		for _, rc := range s.rcpts {
			if len(x.byID[s.id][rc]) == 0 {
				out = append(out, s.id+" "+rc)
			}
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Relay configuration.

// rbRelay renders a relay configuration for one test. Every address is on
// IP (listeners on free ports, the admin server, the pinned source
// address). Delivery and retry timings are short; MX lookups never happen
// (every domain is routed, or all mail goes to Smarthost).
type rbRelay struct {
	IP        string
	Hostname  string       // default relay.test
	Listeners []rbListener // default: one smtp listener
	Trusted   []string     // default [127.0.0.0/8]
	UsersFile string
	BareCR    string            // default normalize
	QueuePath string            // default queue.db in the relay's directory
	Limits    map[string]string // limits.* overrides
	Delivery  map[string]string // delivery.* scalar overrides
	Retry     map[string]string // retry.* overrides
	Smarthost string            // all mail to this host:port (TLS none), if set
	Routes    map[string]string // delivery.routes
	Admin     string            // filled in by YAML
}

// rbListener is one listener; Addr is filled in by YAML when empty.
type rbListener struct {
	Mode string
	Cert *peers.Cert
	Addr string
}

// YAML renders the configuration, choosing free ports for empty addresses.
func (c *rbRelay) YAML(t testing.TB) string {
	t.Helper()
	if len(c.Listeners) == 0 {
		c.Listeners = []rbListener{{Mode: "smtp"}}
	}
	if c.Admin == "" {
		c.Admin = peers.FreeAddr(t, c.IP)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "hostname: %s\nlisteners:\n", rbOr(c.Hostname, "relay.test"))
	for i := range c.Listeners {
		l := &c.Listeners[i]
		if l.Addr == "" {
			l.Addr = peers.FreeAddr(t, c.IP)
		}
		fmt.Fprintf(&b, "  - address: %q\n    mode: %s\n", l.Addr, l.Mode)
		if l.Cert != nil {
			fmt.Fprintf(&b, "    tls_cert: %q\n    tls_key: %q\n", l.Cert.CertFile, l.Cert.KeyFile)
		}
	}
	trusted := c.Trusted
	if trusted == nil {
		trusted = []string{"127.0.0.0/8"}
	}
	fmt.Fprintf(&b, "trusted_networks: [%s]\n", rbQuoteList(trusted))
	if c.UsersFile != "" {
		fmt.Fprintf(&b, "users_file: %q\n", c.UsersFile)
	}
	fmt.Fprintf(&b, "bare_cr: %s\nqueue:\n  path: %q\nadmin:\n  address: %q\nlog:\n  level: info\n",
		rbOr(c.BareCR, "normalize"), rbOr(c.QueuePath, "queue.db"), c.Admin)
	rbSection(&b, "limits", nil, c.Limits)
	rbSection(&b, "delivery", map[string]string{
		"source_ipv4": strconv.Quote(c.IP), "resolver": `"127.0.0.1:9"`, "allow_private_destinations": "true",
		"tls": "none", "connect_timeout": "2s", "greeting_timeout": "5s", "command_timeout": "5s", "data_timeout": "10s",
	}, c.Delivery)
	if c.Smarthost != "" {
		fmt.Fprintf(&b, "  smarthost:\n    address: %q\n    tls: none\n", c.Smarthost)
	}
	if len(c.Routes) > 0 {
		b.WriteString("  routes:\n")
		for _, d := range rbSortedKeys(c.Routes) {
			fmt.Fprintf(&b, "    %q: %q\n", d, c.Routes[d])
		}
	}
	rbSection(&b, "retry", map[string]string{
		"initial_interval": "1s", "max_interval": "2s", "greylist_first_retry": "1s", "greylist_second_retry": "1s",
		"hint_min": "1s", "hint_max": "2s",
	}, c.Retry)
	return b.String()
}

// rbSection writes "name:" and the merged scalar keys (overrides win).
func rbSection(b *strings.Builder, name string, defaults, overrides map[string]string) {
	m := map[string]string{}
	for k, v := range defaults {
		m[k] = v
	}
	for k, v := range overrides {
		m[k] = v
	}
	if len(m) == 0 && name != "delivery" {
		return
	}
	fmt.Fprintf(b, "%s:\n", name)
	for _, k := range rbSortedKeys(m) {
		fmt.Fprintf(b, "  %s: %s\n", k, m[k])
	}
}

func rbSortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func rbQuoteList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = strconv.Quote(x)
	}
	return strings.Join(q, ", ")
}

func rbOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// rbUsersFile runs `greyrelay user add NAME [-sender S]` with the password
// on stdin and writes its line to a users file.
func rbUsersFile(t testing.TB, name, password, senders string) string {
	t.Helper()
	args := []string{"user", "add", name}
	if senders != "" {
		args = append(args, "-sender", senders)
	}
	cmd := exec.Command(peers.Binary(t), args...)
	cmd.Stdin = strings.NewReader(password + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("greyrelay user add: %v", err)
	}
	path := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ---------------------------------------------------------------------------
// Admin API.

// rbRow is one row of GET /api/queue.
type rbRow struct {
	ID        string `json:"id"`
	Status    string `json:"status"`
	Reason    string `json:"reason"`
	Attempts  int    `json:"attempts"`
	Sender    string `json:"sender"`
	Recipient string `json:"recipient"`
	Domain    string `json:"domain"`
	LastReply *struct {
		Code     int    `json:"code"`
		Enhanced string `json:"enhanced"`
		Text     string `json:"text"`
	} `json:"last_reply"`
}

// rbQueue lists recipients matching query (e.g. "domain=x.test").
func rbQueue(t testing.TB, r *peers.Relay, query string) (rows []rbRow, total int) {
	t.Helper()
	code, body := r.Get(t, "/api/queue?limit=10000&"+query)
	if code != http.StatusOK {
		t.Fatalf("GET /api/queue?%s: %d %s", query, code, body)
	}
	var v struct {
		Total int     `json:"total"`
		Rows  []rbRow `json:"rows"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("GET /api/queue: %v\n%s", err, body)
	}
	return v.Rows, v.Total
}

// rbStatsJSON is GET /api/stats.
type rbStatsJSON struct {
	ByStatus   map[string]int `json:"by_status"`
	Messages   int            `json:"messages"`
	Recipients int            `json:"recipients"`
}

func rbStats(t testing.TB, r *peers.Relay) rbStatsJSON {
	t.Helper()
	code, body := r.Get(t, "/api/stats")
	if code != http.StatusOK {
		t.Fatalf("GET /api/stats: %d %s", code, body)
	}
	var s rbStatsJSON
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("GET /api/stats: %v\n%s", err, body)
	}
	return s
}

// rbShow is GET /api/queue/ID: per recipient, the attempt history.
type rbShow struct {
	Recipients []struct {
		Recipient string `json:"recipient"`
		Status    string `json:"status"`
		Reason    string `json:"reason"`
		History   []struct {
			Start   time.Time  `json:"start"`
			End     *time.Time `json:"end"`
			Stage   string     `json:"stage"`
			Outcome string     `json:"outcome"`
			Reason  string     `json:"reason"`
			Reply   *struct {
				Code int    `json:"code"`
				Text string `json:"text"`
			} `json:"reply"`
		} `json:"history"`
	} `json:"recipients"`
}

func rbShowMessage(t testing.TB, r *peers.Relay, id string) rbShow {
	t.Helper()
	code, body := r.Get(t, "/api/queue/"+id)
	if code != http.StatusOK {
		t.Fatalf("GET /api/queue/%s: %d %s", id, code, body)
	}
	var v rbShow
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("GET /api/queue/%s: %v\n%s", id, err, body)
	}
	return v
}

// ---------------------------------------------------------------------------
// A raw SMTP client: every byte on the wire is the test's choice.

// rbConn is a client connection with its reply reader.
type rbConn struct {
	net.Conn
	br      *bufio.Reader
	timeout time.Duration
}

// rbReply is one (possibly multi-line) reply.
type rbReply struct {
	Code  int
	Lines []string // text after "NNN-" / "NNN "
}

func (r rbReply) String() string {
	return fmt.Sprintf("%d %s", r.Code, strings.Join(r.Lines, " / "))
}

// Text is the reply's text, lines joined by a space.
func (r rbReply) Text() string { return strings.Join(r.Lines, " ") }

// rbDial connects from localIP ("" for any) to addr, with implicit TLS if
// asked. It reads nothing.
func rbDial(addr, localIP string, implicitTLS bool) (*rbConn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if localIP != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(localIP)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if implicitTLS {
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) // the certificate is not under test here
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	return &rbConn{Conn: c, br: bufio.NewReader(c), timeout: 30 * time.Second}, nil
}

// rbDialSMTP dials, expects the 220 greeting and says EHLO helo.
func rbDialSMTP(addr, localIP string, implicitTLS bool, helo string) (*rbConn, error) {
	c, err := rbDial(addr, localIP, implicitTLS)
	if err != nil {
		return nil, err
	}
	if r, err := c.Read(); err != nil || r.Code != 220 {
		c.Close()
		return nil, fmt.Errorf("greeting %v (want 220): %v", r, err)
	}
	if r, err := c.Cmd("EHLO " + helo); err != nil || r.Code != 250 {
		c.Close()
		return nil, fmt.Errorf("EHLO %v (want 250): %v", r, err)
	}
	return c, nil
}

// Read reads one reply with smtpvocab.Read: a malformed reply is an error.
func (c *rbConn) Read() (rbReply, error) {
	_ = c.SetReadDeadline(time.Now().Add(c.timeout))
	rep, lines, err := smtpvocab.Read(c.br)
	if err != nil {
		return rbReply{}, err
	}
	r := rbReply{Code: rep.Code}
	for _, l := range lines {
		r.Lines = append(r.Lines, strings.TrimSpace(l))
	}
	return r, nil
}

// WriteRaw sends b as it is.
func (c *rbConn) WriteRaw(b []byte) error {
	_ = c.SetWriteDeadline(time.Now().Add(c.timeout))
	_, err := c.Conn.Write(b)
	return err
}

// Cmd sends line + CRLF and reads the reply.
func (c *rbConn) Cmd(line string) (rbReply, error) {
	if err := c.WriteRaw([]byte(line + "\r\n")); err != nil {
		return rbReply{}, err
	}
	return c.Read()
}

// StartTLS runs STARTTLS and the handshake (certificate not checked).
func (c *rbConn) StartTLS() error {
	r, err := c.Cmd("STARTTLS")
	if err != nil {
		return err
	}
	if r.Code != 220 {
		return fmt.Errorf("STARTTLS: %v", r)
	}
	return c.handshake()
}

func (c *rbConn) handshake() error {
	tc := tls.Client(c.Conn, &tls.Config{InsecureSkipVerify: true})
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	_ = tc.SetDeadline(time.Time{})
	c.Conn, c.br = tc, bufio.NewReader(tc)
	return nil
}

// rbTx is one transaction for Send. Data is the message with CRLF line
// ends and no dot-stuffing; Send stuffs it.
type rbTx struct {
	From      string
	Rcpts     []string
	Data      []byte
	MidBody   func() // called after half of the body was written
	BeforeDot func() // called after the body, before the final dot
	AfterDot  func() // called right after the final dot was written
}

// Send runs MAIL, RCPT, DATA and the body. It returns the first refusal
// (MAIL, RCPT or DATA not accepted) or the reply to the final dot; err is
// set only when the connection failed.
func (c *rbConn) Send(tx rbTx) (rbReply, error) {
	r, err := c.Cmd("MAIL FROM:<" + tx.From + ">")
	if err != nil || r.Code != 250 {
		return r, err
	}
	for _, rc := range tx.Rcpts {
		if r, err = c.Cmd("RCPT TO:<" + rc + ">"); err != nil || r.Code != 250 {
			return r, err
		}
	}
	if r, err = c.Cmd("DATA"); err != nil || r.Code != 354 {
		return r, err
	}
	body := rbDotStuff(tx.Data)
	half := len(body) / 2
	if tx.MidBody == nil {
		half = len(body)
	}
	if err := c.WriteRaw(body[:half]); err != nil {
		return rbReply{}, err
	}
	if tx.MidBody != nil {
		tx.MidBody()
		if err := c.WriteRaw(body[half:]); err != nil {
			return rbReply{}, err
		}
	}
	if tx.BeforeDot != nil {
		tx.BeforeDot()
	}
	if err := c.WriteRaw([]byte(".\r\n")); err != nil {
		return rbReply{}, err
	}
	if tx.AfterDot != nil {
		tx.AfterDot()
	}
	return c.Read()
}

// rbDotStuff dot-stuffs CRLF text (RFC 5321 §4.5.2) and makes it end with
// CRLF; the final "." line is not included.
func rbDotStuff(data []byte) []byte {
	var b bytes.Buffer
	for len(data) > 0 {
		line := data
		if i := bytes.Index(data, []byte("\r\n")); i >= 0 {
			line, data = data[:i+2], data[i+2:]
		} else {
			data = nil
			line = append(slices.Clone(line), '\r', '\n')
		}
		if line[0] == '.' {
			b.WriteByte('.')
		}
		b.Write(line)
	}
	return b.Bytes()
}

// ---------------------------------------------------------------------------
// Messages.

// rbMessage builds a message of about size bytes with the given
// Message-ID: ASCII lines of at most 76 characters, some starting with a
// dot (to exercise dot-stuffing on both hops).
func rbMessage(id, subject string, size int, rng *rand.Rand) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "From: <sender@src.test>\r\nTo: <rcpt@dest.test>\r\nSubject: %s\r\nDate: Mon, 01 Jan 2024 00:00:00 +0000\r\nMessage-ID: <%s>\r\n\r\n", subject, id)
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,-"
	for b.Len() < size {
		n := 1 + rng.IntN(76)
		line := make([]byte, n)
		for i := range line {
			line[i] = alphabet[rng.IntN(len(alphabet))]
		}
		if rng.IntN(20) == 0 {
			line[0] = '.'
		}
		b.Write(line)
		b.WriteString("\r\n")
	}
	return b.Bytes()
}

func rbHash(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// rbMessageID returns the Message-ID (without brackets) from the header
// section of data, or "".
func rbMessageID(data []byte) string {
	for _, f := range rbHeaderFields(data) {
		name, value, _ := strings.Cut(f, ":")
		if strings.EqualFold(strings.TrimSpace(name), "Message-ID") {
			v := strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(value, "\r\n", ""), "\t", " "))
			return strings.Trim(v, "<>")
		}
	}
	return ""
}

// rbHeaderFields splits the header section into fields (folded lines kept
// with their field, CRLFs included).
func rbHeaderFields(data []byte) []string {
	end := bytes.Index(data, []byte("\r\n\r\n"))
	if end < 0 {
		end = len(data)
	} else {
		end += 2
	}
	var fields []string
	for _, line := range strings.SplitAfter(string(data[:end]), "\r\n") {
		if line == "" {
			continue
		}
		if (line[0] == ' ' || line[0] == '\t') && len(fields) > 0 {
			fields[len(fields)-1] += line
			continue
		}
		fields = append(fields, line)
	}
	return fields
}

// rbStripReceived removes every Received field from the header section and
// leaves everything else byte for byte.
func rbStripReceived(data []byte) []byte {
	end := bytes.Index(data, []byte("\r\n\r\n"))
	if end < 0 {
		return data
	}
	var b bytes.Buffer
	for _, f := range rbHeaderFields(data) {
		name, _, _ := strings.Cut(f, ":")
		if !strings.EqualFold(strings.TrimSpace(name), "Received") {
			b.WriteString(f)
		}
	}
	b.Write(data[end+2:])
	return b.Bytes()
}

// rbReceivedFields returns the Received fields of data.
func rbReceivedFields(data []byte) []string {
	var out []string
	for _, f := range rbHeaderFields(data) {
		name, _, _ := strings.Cut(f, ":")
		if strings.EqualFold(strings.TrimSpace(name), "Received") {
			out = append(out, f)
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Waiting and processes.

// rbWaitUntil polls cond (10 ms growing to 200 ms) until it holds, and
// fails the test after timeout.
func rbWaitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(timeout)
	interval := 10 * time.Millisecond
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval)
		interval = min(interval*3/2, 200*time.Millisecond)
	}
}

// rbRSS returns the resident set size of pid in bytes (VmRSS).
func rbRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// rbGrep returns the lines of s containing sub.
func rbGrep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
