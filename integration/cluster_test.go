package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// proxiedNodes starts n relays on distinct loopback addresses whose only
// listener expects a PROXY header from HAProxy (which connects from
// 127.0.0.1), and a real HAProxy balancing round robin over them with
// send-proxy-v2 and health checks.
func proxiedNodes(t *testing.T, net_ *mailNet, n int, overrides ...string) ([]*testRelay, *peers.HAProxy) {
	t.Helper()
	var nodes []*testRelay
	var backends []string
	for range n {
		ip := net_.host("")
		ov := append([]string{
			fmt.Sprintf(`listeners=[{address: "%s", mode: smtp, proxy_protocol: true}]`, peers.FreeAddr(t, ip)),
			"proxy_protocol.trusted=[127.0.0.1/32]",
		}, overrides...)
		r := peers.StartRelay(t, net_.relayYAML(ip, ov...))
		nodes = append(nodes, &testRelay{Relay: r, t: t, IP: ip})
		backends = append(backends, r.SMTPAddr)
	}
	return nodes, peers.StartHAProxy(t, peers.HAProxyConfig{Backends: backends})
}

// TestProxyProtocolBehindHAProxy puts three relays behind a real HAProxy
// (send-proxy-v2, round robin, health checks). Relay policy sees the real
// client: a trusted client relays through every node and its Received
// header names it, while a client outside trusted_networks is refused at
// RCPT although HAProxy itself (127.0.0.1) connects from a loopback
// address. A forged PROXY header sent straight to a node from an address
// that is no balancer gets no banner, and health checks are not logged as
// errors.
func TestProxyProtocolBehindHAProxy(t *testing.T) {
	peers.Require(t, "haproxy", "swaks")
	t.Parallel()
	mn := newMailNet(t)
	sink := mn.sink("dest.test", peers.SinkOptions{})
	friend, stranger := mn.host(""), mn.host("")
	nodes, lb := proxiedNodes(t, mn, 3, fmt.Sprintf("trusted_networks=[%s/32]", friend))

	// Round robin sends six sequential connections to each node twice,
	// unless a health check has just marked one down: up to 15 are sent
	// until every node has taken one (its "accepted" line is written
	// before its 250, so before swaks returns).
	took := func(node *testRelay) bool { return strings.Contains(node.Log(), `"client":"`+friend) }
	n := 0
	for n < 6 || (n < 15 && !(took(nodes[0]) && took(nodes[1]) && took(nodes[2]))) {
		nodes[0].send(peers.SwaksMessage{Server: lb.Addr, LocalIP: friend, From: "a@src.test",
			To: []string{fmt.Sprintf("b%d@dest.test", n)}})
		n++
	}
	msgs := sink.WaitFor(t, n, 60*time.Second)
	for _, m := range msgs {
		if !strings.Contains(string(m.Data), "["+friend+"]") {
			t.Errorf("Received does not name the client %s:\n%s", friend, m.Data)
		}
	}
	for _, node := range nodes {
		if !took(node) {
			t.Errorf("node %s took none of %d connections from %s: round robin did not reach it", node.IP, n, friend)
		}
	}

	out, code := peers.SwaksMessage{Server: lb.Addr, LocalIP: stranger, From: "a@src.test",
		To: []string{"c@dest.test"}}.Send(t)
	if code != 24 || !strings.Contains(out, "554 5.7.1") {
		t.Errorf("a client outside trusted_networks behind HAProxy: swaks exit %d, want 24 (554 5.7.1 at RCPT):\n%s", code, out)
	}

	// A forged header straight to a node, from an address that is no balancer.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(stranger)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", nodes[1].SMTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "PROXY TCP4 %s 127.0.0.1 40000 25\r\n", friend)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	var ne net.Error
	if len(b) > 0 || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("forged PROXY header from %s: got %q, %v; want the connection closed without a banner", stranger, b, err)
	}

	for _, node := range nodes {
		for _, line := range strings.Split(node.Log(), "\n") {
			if strings.Contains(line, `"level":"error"`) || strings.Contains(line, "no valid PROXY header") {
				t.Errorf("node %s logged: %s", node.IP, line)
			}
		}
	}
}

// clusterNode starts a relay sharing the Redis at redisAddr.
func (n *mailNet) clusterNode(redisAddr string, overrides ...string) *testRelay {
	n.t.Helper()
	ip := n.host("")
	ov := append([]string{fmt.Sprintf("cluster.redis.addresses=[%q]", redisAddr),
		"cluster.lease_ttl=3s", "cluster.node_name=node-" + ip}, overrides...)
	r := peers.StartRelay(n.t, n.relayYAML(ip, ov...))
	return &testRelay{Relay: r, t: n.t, IP: ip}
}

// TestClusterSharesGreylistDelay: node A learns how long a real postgrey
// (behind a real Postfix) greylists; node B, which never mailed the
// destination, waits that long before its first retry and passes after a
// single greylisting deferral. On its own B would retry after 3s and be
// greylisted again.
func TestClusterSharesGreylistDelay(t *testing.T) {
	peers.Require(t, "postfix", "postgrey", "swaks", "redis-server")
	t.Parallel()
	n := newMailNet(t)
	rds := peers.StartRedis(t, "")
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	grey := peers.StartPostgrey(t, "", 8*time.Second)
	n.postfix("dest.test", peers.PostfixConfig{DeliverTo: final.Addr, Postgrey: grey})
	quick := []string{"retry.greylist_first_retry=3s", "retry.greylist_second_retry=3s"}
	a := n.clusterNode(rds.Addr, quick...)
	b := n.clusterNode(rds.Addr, quick...)

	id1 := a.send(peers.SwaksMessage{From: "a@src.test", To: []string{"b1@dest.test"}, Data: message("a@src.test", "b1@dest.test", "learn")})
	final.WaitFor(t, 1, 40*time.Second)
	a.waitAttempts(id1, "delivered", 5*time.Second)
	// The attempt's log line comes before the queue's writer commits the
	// destination record the API reads: wait for the record, not a sleep.
	var learned, low time.Duration
	relaytest.Eventually(t, 10*time.Second, "node A's learned greylisting window", func() error {
		d, ok := a.destination("dest.test")
		learned = time.Duration(d.LearnedDelaySeconds * float64(time.Second))
		low = time.Duration(d.GreylistLowSeconds * float64(time.Second))
		if !ok || learned < grey.Delay || low <= 3*time.Second {
			return fmt.Errorf("node A learned the window %v..%v (known %v), want one around postgrey's %v above the 3s retries", low, learned, ok, grey.Delay)
		}
		return nil
	})

	id2 := b.send(peers.SwaksMessage{From: "a@src.test", To: []string{"b2@dest.test"}, Data: message("a@src.test", "b2@dest.test", "adopt")})
	final.WaitFor(t, 2, learned*2+20*time.Second)
	atts := b.waitAttempts(id2, "delivered", 5*time.Second)
	if len(atts) < 2 || len(atts) > 3 || atts[0].str("reason") != "greylisted" {
		t.Fatalf("node B: want a greylisting deferral, perhaps a refused probe, then delivery, got %v", outcomes(atts))
	}
	if gap := atts[1].time("time").Sub(atts[0].time("time")); gap < low {
		t.Errorf("node B retried %v after the greylisting, before A's learned lower bound %v (on its own it retries after 3s)", gap, low)
	}
	// Redis traffic is per connection or state change, not per message.
	if got := redisCommands(t, b); got == 0 || got > 20 {
		t.Errorf("node B made %v Redis calls for its work (load/publish/acquire/release), want a few", got)
	}
}

// redisCommands sums node r's Redis round trips other than the
// background loop's (ping, renew, heartbeat).
func redisCommands(t *testing.T, r *testRelay) float64 {
	t.Helper()
	var sum float64
	if f := r.metrics()["greyrelay_cluster_redis_commands_total"]; f != nil {
		for _, m := range f.GetMetric() {
			switch m.GetLabel()[0].GetValue() {
			case "load", "publish", "acquire", "release":
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// countingMX is a destination that records the most transactions (from
// MAIL to the end of DATA) it saw in progress at once, over all client
// connections, and every recipient it accepted. Each MAIL waits until
// gate is closed (nil: no wait), so that every connection the relays may
// open is open at once, and each DATA takes a while, so that transactions
// overlap. (peers.Sink runs its scripts under one lock: it cannot hold
// several transactions at once.)
type countingMX struct {
	gate  chan struct{}
	mu    sync.Mutex
	cur   int
	peak  int
	rcpts map[string]int
}

func startCountingMX(n *mailNet, domain string, gate chan struct{}) *countingMX {
	n.t.Helper()
	return startCountingMXAt(n, n.mxAddr(domain), "mx."+domain, gate)
}

// startCountingMXAt is startCountingMX on an address already published.
func startCountingMXAt(n *mailNet, addr, name string, gate chan struct{}) *countingMX {
	n.t.Helper()
	m := &countingMX{gate: gate, rcpts: map[string]int{}}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) {
		return &countingSession{m: m}, nil
	}))
	srv.Domain, srv.AllowInsecureAuth = name, true
	srv.ReadTimeout, srv.WriteTimeout = 30*time.Second, 30*time.Second
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		n.t.Fatal(err)
	}
	go srv.Serve(ln)
	n.t.Cleanup(func() { srv.Close() })
	return m
}

func (m *countingMX) peakTx() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak
}

func (m *countingMX) received() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.rcpts)
}

type countingSession struct {
	m     *countingMX
	inTx  bool
	rcpts []string
}

func (s *countingSession) Mail(string, *smtp.MailOptions) error {
	s.m.mu.Lock()
	s.m.cur++
	s.m.peak = max(s.m.peak, s.m.cur)
	s.m.mu.Unlock()
	s.inTx = true
	if s.m.gate != nil {
		<-s.m.gate
	}
	return nil
}

func (s *countingSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.rcpts = append(s.rcpts, to)
	return nil
}

func (s *countingSession) Data(r io.Reader) error {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond)
	s.m.mu.Lock()
	for _, rc := range s.rcpts {
		s.m.rcpts[rc]++
	}
	s.m.mu.Unlock()
	s.Reset()
	return nil
}

func (s *countingSession) Reset() {
	if s.inTx {
		s.m.mu.Lock()
		s.m.cur--
		s.m.mu.Unlock()
	}
	s.inTx, s.rcpts = false, nil
}

func (s *countingSession) Logout() error {
	s.Reset()
	return nil
}

// waitRcpts waits until want recipients arrived.
func (m *countingMX) waitRcpts(t *testing.T, want int, timeout time.Duration) map[string]int {
	t.Helper()
	relaytest.Eventually(t, timeout, fmt.Sprintf("%d recipients at the destination", want), func() error {
		if got := len(m.received()); got < want {
			return fmt.Errorf("%d arrived", got)
		}
		return nil
	})

	return m.received()
}

// waitDeliveredOnce waits up to timeout until every recipient in want has
// arrived at the destination (received reports what it accepted, by
// recipient), then until the queues of nodes are empty, and checks that
// each recipient arrived exactly once. It counts after the queues are
// empty, so a second copy that came after the first arrivals counts too.
func waitDeliveredOnce(t *testing.T, received func() map[string]int, timeout time.Duration, want []string, nodes ...*testRelay) {
	t.Helper()
	relaytest.Eventually(t, timeout, fmt.Sprintf("%d recipients at the destination", len(want)), func() error {
		got := received()
		var missing []string
		for _, r := range want {
			if got[r] == 0 {
				missing = append(missing, r)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d not arrived: %v", len(missing), missing)
		}
		return nil
	})

	for _, n := range nodes {
		n.waitQueueEmpty(30 * time.Second)
	}
	got := received()
	for _, r := range want {
		if got[r] != 1 {
			t.Errorf("%s delivered %d times, want once", r, got[r])
		}
	}
}

// TestClusterConnectionLimit: three nodes, each with its own queue of
// messages for one destination, share delivery.max_per_destination: 2.
// The destination never sees more than 2 transactions at once. With
// cluster.destination_limits: local the same nodes reach more than 2 (so
// the bound is the shared limit's doing, not a slow machine's).
func TestClusterConnectionLimit(t *testing.T) {
	peers.Require(t, "swaks", "redis-server")
	t.Parallel()
	for _, tc := range []struct {
		scope   string
		maxPeak int
	}{{"shared", 2}, {"local", 6}} {
		t.Run(tc.scope, func(t *testing.T) {
			n := newMailNet(t)
			rds := peers.StartRedis(t, "")
			gate := make(chan struct{})
			mx := startCountingMX(n, "busy.test", gate)
			var nodes []*testRelay
			for range 3 {
				// Timeouts longer than queueing can take on a busy machine: a
				// transaction the relay gave up on would stay blocked at the
				// gate, counted, while its retry opened another.
				nodes = append(nodes, n.clusterNode(rds.Addr, "delivery.max_per_destination=2",
					"delivery.max_messages_per_connection=1", "cluster.destination_limits="+tc.scope,
					"delivery.command_timeout=2m", "delivery.data_timeout=2m",
					"delivery.initial_per_destination=2")) // no slow start: the limits are what binds
			}
			// The first transactions wait at MAIL until everything is
			// queued: each node then has work for every connection it may
			// open.
			const per = 4
			for i, node := range nodes {
				for j := range per {
					node.send(peers.SwaksMessage{From: "a@src.test", To: []string{fmt.Sprintf("n%d-%d@busy.test", i, j)}})
				}
			}
			close(gate)
			mx.waitRcpts(t, 3*per, 90*time.Second)
			got := mx.peakTx()
			t.Logf("%s limits: at most %d transactions at once", tc.scope, got)
			if tc.scope == "shared" && got > tc.maxPeak {
				t.Errorf("the destination saw %d transactions at once, want at most the cluster-wide limit 2", got)
			}
			if tc.scope == "local" && got <= 2 {
				t.Errorf("with local limits the destination saw at most %d transactions at once, want more than 2 (three nodes, two each)", got)
			}
		})
	}
}

// TestClusterRedisKilledLosesNothing: Redis is killed while two nodes
// deliver, and started again. Every message arrives exactly once, the
// nodes report greyrelay_cluster_redis_up 0 with a warning meanwhile, and 1
// once Redis is back.
func TestClusterRedisKilledLosesNothing(t *testing.T) {
	peers.Require(t, "swaks", "redis-server")
	t.Parallel()
	n := newMailNet(t)
	rds := peers.StartRedis(t, "")
	mx := startCountingMX(n, "dest.test", nil)
	a := n.clusterNode(rds.Addr, "delivery.max_per_destination=2")
	b := n.clusterNode(rds.Addr, "delivery.max_per_destination=2")
	const per = 10
	var aIDs, bIDs, rcpts []string
	for i := range per {
		ra, rb := fmt.Sprintf("a%d@dest.test", i), fmt.Sprintf("b%d@dest.test", i)
		aIDs = append(aIDs, a.send(peers.SwaksMessage{From: "a@src.test", To: []string{ra}}))
		if i == per/2 {
			rds.Kill()
		}
		bIDs = append(bIDs, b.send(peers.SwaksMessage{From: "a@src.test", To: []string{rb}}))
		rcpts = append(rcpts, ra, rb)
	}
	// Queue IDs name their node (its tag in their low bits): the two
	// nodes never answer 250 with the same one.
	for _, id := range aIDs {
		if slices.Contains(bIDs, id) {
			t.Errorf("nodes A and B both queued a message as %s", id)
		}
	}
	relaytest.Eventually(t, 20*time.Second, "nodes see Redis down", func() error {
		for _, r := range []*testRelay{a, b} {
			if v := gauge(r, "greyrelay_cluster_redis_up"); v != 0 {
				return fmt.Errorf("node %s: greyrelay_cluster_redis_up %v", r.IP, v)
			}
		}
		return nil
	})

	waitDeliveredOnce(t, mx.received, 60*time.Second, rcpts, a, b)
	// A log line about a message names the node that holds it.
	for r, id := range map[*testRelay]string{a: aIDs[0], b: bIDs[0]} {
		named := false
		for line := range strings.Lines(r.Log()) {
			if strings.Contains(line, `"queue_id":"`+id+`"`) {
				named = true
				if !strings.Contains(line, `"node":"node-`+r.IP+`"`) {
					t.Errorf("node %s: a line about %s does not name the node: %s", r.IP, id, line)
				}
			}
		}
		if !named {
			t.Errorf("node %s logged nothing about %s", r.IP, id)
		}
	}
	for _, r := range []*testRelay{a, b} {
		if !strings.Contains(r.Log(), "Redis unreachable") {
			t.Errorf("node %s logged no warning about Redis", r.IP)
		}
		// go-redis's own complaints go through the relay's JSON log too.
		for _, line := range strings.Split(strings.TrimSpace(r.Log()), "\n") {
			if !strings.HasPrefix(line, "{") && !strings.HasPrefix(line, "--- peers:") {
				t.Errorf("node %s wrote a line outside its JSON log: %q", r.IP, line)
			}
		}
	}
	rds.Start()
	relaytest.Eventually(t, 20*time.Second, "nodes see Redis back", func() error {
		for _, r := range []*testRelay{a, b} {
			if v := gauge(r, "greyrelay_cluster_redis_up"); v != 1 {
				return fmt.Errorf("node %s: greyrelay_cluster_redis_up %v", r.IP, v)
			}
		}
		return nil
	})

	// Both nodes registered again: `greyrelay cluster status` lists them.
	relaytest.Eventually(t, 20*time.Second, "cluster status lists both nodes", func() error {
		res := runGreyrelay(t, a.Dir, "", nil, "cluster", "status", "-config", a.ConfigPath, "-json")
		var st struct {
			Nodes []struct {
				Name     string `json:"name"`
				AdminURL string `json:"admin_url"`
			} `json:"nodes"`
		}
		if err := json.Unmarshal([]byte(res.Stdout), &st); err != nil {
			return fmt.Errorf("%v: %s", err, res)
		}
		got := map[string]string{}
		for _, n := range st.Nodes {
			got[n.Name] = n.AdminURL
		}
		want := map[string]string{"node-" + a.IP: "http://" + a.AdminAddr, "node-" + b.IP: "http://" + b.AdminAddr}
		if !maps.Equal(got, want) {
			return fmt.Errorf("nodes %v, want %v", got, want)
		}
		return nil
	})

	// `queue show -cluster`, run on node B, asks every node: only A holds
	// a message with A's first ID (before IDs named their node, B held
	// one too, its own first message), and the answer names A.
	res := runGreyrelay(t, b.Dir, "", nil, "queue", "-config", b.ConfigPath, "show", "-cluster", "-json", aIDs[0])
	type shownOn struct {
		Node string `json:"node"`
		Show struct {
			ID         string `json:"id"`
			Node       string `json:"node"`
			Recipients []struct {
				Recipient string `json:"recipient"`
			} `json:"recipients"`
		} `json:"show"`
	}
	shown := map[string]string{}
	for line := range strings.Lines(strings.TrimSpace(res.Stdout)) {
		var s shownOn
		if err := json.Unmarshal([]byte(line), &s); err != nil || len(s.Show.Recipients) == 0 || s.Show.ID != aIDs[0] ||
			s.Show.Node != s.Node {
			t.Fatalf("queue show -cluster: %v: %s", err, res)
		}
		shown[s.Node] = s.Show.Recipients[0].Recipient
	}
	want := map[string]string{"node-" + a.IP: "a0@dest.test"}
	if res.Code != 0 || !maps.Equal(shown, want) {
		t.Errorf("queue show -cluster %s: %v (%s), want %v", aIDs[0], shown, res, want)
	}
	// Node A's status page shows both nodes' queues, asked from their
	// admin APIs.
	code, page := a.Get(t, "/")
	for _, node := range []*testRelay{a, b} {
		row := regexp.MustCompile(`<tr><td>node-` + regexp.QuoteMeta(node.IP) + `</td><td class="mono">http://` +
			regexp.QuoteMeta(node.AdminAddr) + `</td><td>[^<]*</td><td class="n">0</td>`)
		if code != 200 || !row.MatchString(page) {
			t.Errorf("status page (%d) has no cluster row with the queue of node-%s", code, node.IP)
		}
	}
}

// counter reads a counter without labels from r's metrics (-1 if absent).
func counter(r *testRelay, name string) float64 {
	if f := r.metrics()[name]; f != nil && len(f.GetMetric()) > 0 {
		return f.GetMetric()[0].GetCounter().GetValue()
	}
	return -1
}

// gauge reads a gauge without labels from r's metrics (-1 if absent).
func gauge(r *testRelay, name string) float64 {
	if f := r.metrics()[name]; f != nil && len(f.GetMetric()) > 0 {
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	return -1
}

// TestClusterMoveDeadNodeQueue: a node dies (SIGKILL) with mail queued for
// a destination that is down. Its queue files (queue.db, the journal and
// the body spool), copied as they are to another host's node, are
// delivered from there once the destination is back: every recipient
// exactly once.
func TestClusterMoveDeadNodeQueue(t *testing.T) {
	peers.Require(t, "swaks", "redis-server")
	t.Parallel()
	n := newMailNet(t)
	rds := peers.StartRedis(t, "")
	mxAddr := n.mxAddr("dest.test") // nothing listens yet: connections are refused
	a := n.clusterNode(rds.Addr, "cluster.node_name=node-a")
	const count = 5
	var ids, rcpts []string
	for i := range count {
		r := fmt.Sprintf("r%d@dest.test", i)
		ids = append(ids, a.send(peers.SwaksMessage{From: "a@src.test", To: []string{r}}))
		rcpts = append(rcpts, r)
	}
	// Every recipient held back for the unreachable MX before the kill:
	// deferred after an attempt, or postponed without one. Once the MX's
	// only address failed it is on the dead-host list, and a message due
	// meanwhile is moved to when the address may be dialed again; the
	// one dial then goes to the lowest queue ID due, so on a loaded
	// machine, where swaks takes seconds per message, the last message
	// may wait many rounds for an attempt of its own (waiting for an
	// attempt line per message failed that way).
	relaytest.Eventually(t, 20*time.Second, "every recipient held back for the unreachable MX", func() error {
		rows := a.rows()
		if len(rows) != count {
			return fmt.Errorf("%d recipients in the queue, want %d", len(rows), count)
		}
		for _, row := range rows {
			if row.Reason != "connect" {
				return fmt.Errorf("%s: %s, reason %q, want reason connect", row.Key, row.Status, row.Reason)
			}
		}
		return nil
	})

	a.Kill()

	b := n.clusterNode(rds.Addr, "cluster.node_name=node-a")
	b.Kill() // only its directory and configuration are wanted: the queue moves in
	for _, f := range []string{"queue.db", "queue.db.journal", "queue.db.bodies"} {
		if _, err := os.Stat(filepath.Join(a.Dir, f)); err != nil {
			continue
		}
		os.RemoveAll(filepath.Join(b.Dir, f))
		if out, err := exec.Command("cp", "-a", filepath.Join(a.Dir, f), filepath.Join(b.Dir, f)).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v\n%s", f, err, out)
		}
	}
	b.Restart(t)
	// The moved queue is visible through the cluster: `queue list -cluster`
	// asks every registered node's admin API.
	relaytest.Eventually(t, 20*time.Second, "queue list -cluster shows the moved queue", func() error {
		res := runGreyrelay(t, b.Dir, "", nil, "queue", "-config", b.ConfigPath, "list", "-cluster", "-json")
		var line struct {
			Node string `json:"node"`
			List struct {
				Total int `json:"total"`
			} `json:"list"`
		}
		if err := json.Unmarshal([]byte(res.Stdout), &line); err != nil || res.Code != 0 {
			return fmt.Errorf("%v: %s", err, res)
		}
		if line.Node != "node-a" || line.List.Total != count {
			return fmt.Errorf("node %q lists %d recipients, want node-a with %d", line.Node, line.List.Total, count)
		}
		return nil
	})

	mx := startCountingMXAt(n, mxAddr, "mx.dest.test", nil)
	waitDeliveredOnce(t, mx.received, 60*time.Second, rcpts, b)
	for _, id := range ids {
		if len(b.attempts(id)) == 0 {
			t.Errorf("message %s: no attempt logged by the node that took the queue over", id)
		}
	}
	// Taking over a dead node's name is no conflict: only a warning, at
	// the first heartbeat, that the entry another process wrote was replaced.
	if v := counter(b, "greyrelay_cluster_node_name_conflicts_total"); v != 0 || strings.Contains(b.Log(), "another running process uses this node name") {
		t.Errorf("the node that took the dead node's queue and name over reported a name conflict (%v counted)", v)
	}
	if !strings.Contains(b.Log(), "replaced a fresh registry entry") {
		t.Error("no warning that the node replaced the dead node's fresh registry entry")
	}
}

// TestClusterNodeNameConflict: two running nodes given one
// cluster.node_name are each told so: an error naming the other's admin
// URL and the remedy, greyrelay_cluster_node_name_conflicts_total, a
// CONFLICT line in `greyrelay cluster status` (which exits with status
// 2) and a line on the status page.
func TestClusterNodeNameConflict(t *testing.T) {
	peers.Require(t, "redis-server")
	t.Parallel()
	n := newMailNet(t)
	rds := peers.StartRedis(t, "")
	a := n.clusterNode(rds.Addr, "cluster.node_name=dup")
	b := n.clusterNode(rds.Addr, "cluster.node_name=dup")
	for _, pair := range [][2]*testRelay{{a, b}, {b, a}} {
		r, other := pair[0], pair[1]
		relaytest.Eventually(t, 20*time.Second, "node "+r.IP+" reports the conflict", func() error {
			if v := counter(r, "greyrelay_cluster_node_name_conflicts_total"); v < 1 {
				return fmt.Errorf("greyrelay_cluster_node_name_conflicts_total %v", v)
			}
			for line := range strings.Lines(r.Log()) {
				if strings.Contains(line, `"level":"error"`) && strings.Contains(line, "cluster.node_name") &&
					strings.Contains(line, `"other_admin_url":"http://`+other.AdminAddr+`"`) {
					return nil
				}
			}
			return errors.New("no error line naming the other node's admin URL")
		})

	}
	relaytest.Eventually(t, 20*time.Second, "cluster status prints the conflict", func() error {
		res := runGreyrelay(t, a.Dir, "", nil, "cluster", "status", "-config", a.ConfigPath)
		if res.Code != 2 || !strings.Contains(res.Stdout, "CONFLICT: node name dup is used by two running processes") {
			return fmt.Errorf("%s", res)
		}
		return nil
	})

	relaytest.Eventually(t, 20*time.Second, "the status page says the conflict", func() error {
		if code, page := b.Get(t, "/"); code != 200 || !strings.Contains(page, "Node name dup is used by two running processes") {
			return fmt.Errorf("status page (HTTP %d) does not say the conflict", code)
		}
		return nil
	})

}

// TestClusterSentinelFailover: the nodes reach Redis through a real
// redis-sentinel (cluster.redis.addresses names the sentinel,
// master_name the monitored master). SENTINEL FAILOVER in the middle of
// a run promotes the replica: every message arrives once, and afterwards
// the nodes share through the new master (their registry heartbeats
// reach it) with greyrelay_cluster_redis_up 1.
func TestClusterSentinelFailover(t *testing.T) {
	peers.Require(t, "swaks", "redis-server", "redis-sentinel")
	t.Parallel()
	n := newMailNet(t)
	master := peers.StartRedis(t, "")
	replica := peers.StartRedisReplica(t, master)
	sentinel := peers.StartSentinel(t, "greyrelay", master)
	relaytest.Eventually(t, 30*time.Second, "the sentinel knows the replica in sync", func() error {
		info, err := replica.Info("replication")
		if err != nil || !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("replica not in sync: %v %q", err, info)
		}
		if reply, err := sentinel.Command("SENTINEL REPLICAS greyrelay"); err != nil || reply != "*1" {
			return fmt.Errorf("SENTINEL REPLICAS: %q %v", reply, err)
		}
		return nil
	})

	mx := startCountingMX(n, "dest.test", nil)
	ov := []string{"cluster.redis.master_name=greyrelay", "delivery.max_per_destination=2"}
	a, b := n.clusterNode(sentinel.Addr, ov...), n.clusterNode(sentinel.Addr, ov...)
	const per = 10
	var rcpts []string
	for i := range per {
		ra, rb := fmt.Sprintf("a%d@dest.test", i), fmt.Sprintf("b%d@dest.test", i)
		a.send(peers.SwaksMessage{From: "a@src.test", To: []string{ra}})
		if i == per/2 {
			relaytest.Eventually(t, 20*time.Second, "SENTINEL FAILOVER accepted", func() error {
				if reply, err := sentinel.Command("SENTINEL FAILOVER greyrelay"); err != nil || reply != "+OK" {
					return fmt.Errorf("SENTINEL FAILOVER: %q %v", reply, err)
				}
				return nil
			})

		}
		b.send(peers.SwaksMessage{From: "a@src.test", To: []string{rb}})
		rcpts = append(rcpts, ra, rb)
	}
	relaytest.Eventually(t, 30*time.Second, "the replica promoted", func() error {
		info, err := replica.Info("replication")
		if err != nil || !strings.Contains(info, "role:master") {
			return fmt.Errorf("replica: %v %q", err, info)
		}
		return nil
	})

	waitDeliveredOnce(t, mx.received, 60*time.Second, rcpts, a, b)
	// The nodes write to the new master: its SET count (only heartbeats
	// and shared records write with SET) grows, and both nodes say Redis is up.
	sets := func() int64 {
		st, err := replica.CommandStats()
		if err != nil {
			t.Fatal(err)
		}
		return st["set"]
	}
	before := sets()
	relaytest.Eventually(t, 20*time.Second, "the nodes write to the new master", func() error {
		if after := sets(); after < before+2 {
			return fmt.Errorf("SET on the new master %d → %d", before, after)
		}
		for _, r := range []*testRelay{a, b} {
			if v := gauge(r, "greyrelay_cluster_redis_up"); v != 1 {
				return fmt.Errorf("node %s: greyrelay_cluster_redis_up %v", r.IP, v)
			}
		}
		return nil
	})

}

// pacedMX is a destination that allows one MAIL per gap from everyone
// together and answers any sooner one with 451 4.7.1 (a rate limit); it
// counts the accepted recipients and the refusals.
type pacedMX struct {
	gap     time.Duration
	mu      sync.Mutex
	last    time.Time
	refused int
	rcpts   map[string]int
	mails   []string // each MAIL: when, from which node, how long after the last accepted one, refused or not
}

func startPacedMX(n *mailNet, domain string, gap time.Duration) *pacedMX {
	n.t.Helper()
	m := &pacedMX{gap: gap, rcpts: map[string]int{}}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &pacedSession{m: m, from: c.Conn().RemoteAddr().String()}, nil
	}))
	srv.Domain = "mx." + domain
	ln, err := net.Listen("tcp", n.mxAddr(domain))
	if err != nil {
		n.t.Fatal(err)
	}
	go srv.Serve(ln)
	n.t.Cleanup(func() { srv.Close() })
	return m
}

type pacedSession struct {
	m     *pacedMX
	from  string
	rcpts []string
}

func (s *pacedSession) Mail(string, *smtp.MailOptions) error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	now := time.Now()
	since := now.Sub(s.m.last)
	ok := since >= s.m.gap
	s.m.mails = append(s.m.mails, fmt.Sprintf("%s from %s, %v after the last accepted: %s",
		now.Format("15:04:05.000"), s.from, since.Round(time.Millisecond), map[bool]string{true: "accepted", false: "refused"}[ok]))
	if ok {
		s.m.last = now
		return nil
	}
	s.m.refused++
	return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 7, 1}, Message: "rate limit exceeded, slow down"}
}

func (s *pacedSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.rcpts = append(s.rcpts, to)
	return nil
}

func (s *pacedSession) Data(r io.Reader) error {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	s.m.mu.Lock()
	for _, rc := range s.rcpts {
		s.m.rcpts[rc]++
	}
	s.m.mu.Unlock()
	return nil
}

// received returns how often each recipient was accepted.
func (m *pacedMX) received() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.rcpts)
}

// timeline returns every MAIL, one a line.
func (m *pacedMX) timeline() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.mails, "\n")
}

// refusals returns how many MAILs were refused.
func (m *pacedMX) refusals() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused
}

func (s *pacedSession) Reset()        { s.rcpts = nil }
func (s *pacedSession) Logout() error { return nil }

// TestClusterSharedPace: three nodes send to a destination that allows
// one message per 400 ms from all of them together. With shared limits
// they learn its pace together and hold it together (one reservation per
// start in Redis); with cluster.destination_limits local each paces on
// its own and the three together keep running into the limit. Every
// message arrives once either way.
func TestClusterSharedPace(t *testing.T) {
	peers.Require(t, "swaks", "redis-server")
	t.Parallel()
	for _, scope := range []string{"shared", "local"} {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			n := newMailNet(t)
			rds := peers.StartRedis(t, "")
			mx := startPacedMX(n, "slow.test", 400*time.Millisecond)
			var nodes []*testRelay
			for range 3 {
				nodes = append(nodes, n.clusterNode(rds.Addr, "cluster.destination_limits="+scope))
			}
			const per = 8
			var rcpts []string
			for i := range per {
				for k, r := range nodes {
					rcpt := fmt.Sprintf("n%d-%d@slow.test", k, i)
					r.send(peers.SwaksMessage{From: "a@src.test", To: []string{rcpt}})
					rcpts = append(rcpts, rcpt)
				}
			}
			// Each node paces on its own in the control, from its own
			// opening: 30-67 s on a loaded two-core machine.
			waitDeliveredOnce(t, mx.received, 120*time.Second, rcpts, nodes...)
			if t.Failed() {
				t.Logf("MAILs:\n%s", mx.timeline())
			}
			// Learning the pace costs a refusal or two: the first teaches every
			// node (each reads the shared view again at least once a second,
			// also on a connection it keeps open), a node whose view is not
			// yet a second old may start once more unpaced, and the pace,
			// growing again, finds the limit once. Three nodes pacing on
			// their own were refused 4-10 times in trial runs.
			refused := mx.refusals()
			t.Logf("%s: %d MAILs refused for %d messages", scope, refused, 3*per)
			if scope == "shared" && refused > 3 {
				t.Errorf("%d MAILs refused with a shared pace, want at most 3; the MAILs:\n%s", refused, mx.timeline())
			}
			if scope == "local" && refused <= 3 {
				t.Errorf("only %d MAILs refused with each node pacing alone: the destination does not tell shared from local pacing", refused)
			}
		})
	}
}
