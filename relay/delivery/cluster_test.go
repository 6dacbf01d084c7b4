package delivery

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/cluster"
	"github.com/greyrelay/greyrelay/relay/cluster/clustertest"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// clusterNode connects an engine's Shared to st, the store the test's
// nodes share: an in-memory one, so that these tests need no Redis
// server (relay/cluster's store on a real redis-server is tested in the
// integration package, and so are nodes of the real binary sharing one).
func clusterNode(t *testing.T, name string, st cluster.Store) *cluster.Cluster {
	t.Helper()
	return clusterNodeLimits(t, name, st, cluster.LimitsShared)
}

// clusterNodeLimits is clusterNode with cluster.destination_limits set to
// limits.
func clusterNodeLimits(t *testing.T, name string, st cluster.Store, limits string) *cluster.Cluster {
	t.Helper()
	c, err := cluster.New(cluster.Options{Node: cluster.Node{Name: name}, Registry: prometheus.NewRegistry(), Store: st,
		Config: config.Cluster{Redis: config.Redis{Timeout: time.Second},
			DestinationLimits: limits, LeaseTTL: 3 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// throttlingMX answers MAIL with 451 4.7.1 when it comes sooner than gap
// after the previous accepted one, whichever node sent it: a destination
// that allows one message per gap from everyone together.
type throttlingMX struct {
	gap time.Duration

	mu       sync.Mutex
	last     time.Time
	accepted []time.Time
	refused  int
}

func (m *throttlingMX) mail(int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if !m.last.IsZero() && now.Sub(m.last) < m.gap {
		m.refused++
		return relaytest.Reply("451 4.7.1 rate limit exceeded, slow down")
	}
	m.last = now
	m.accepted = append(m.accepted, now)
	return nil
}

// TestSharedPaceAcrossNodes: three engines, each on its own queue, share
// a destination's learned pace through a shared store. Together they
// start no faster than the pace, so a destination allowing one message
// per 150 ms from all of them refuses nothing; each pacing on its own,
// they would start three at a time and be refused.
func TestSharedPaceAcrossNodes(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	st := clustertest.NewMemory()
	// The destination allows less than the learned pace (one start per
	// 400 ms), leaving 250 ms for a start's reservation and its MAIL to
	// drift apart on a busy machine.
	const interval = 400 * time.Millisecond
	dest := &throttlingMX{gap: 150 * time.Millisecond}
	// What one node learned: the destination accepts one message per 400 ms.
	clusterNode(t, "teacher", st).Publish(queue.Destination{Domain: "paced.test",
		PaceInterval: interval, PaceBase: interval, Updated: time.Now()})
	type node struct {
		h   *harness
		sh  *cluster.Cluster
		ids []queue.ID
	}
	var nodes []node
	for i, name := range []string{"a", "b", "c"} {
		h := newHarness(t)
		h.dns.MX("paced.test", 10, "mx.paced.test").A("mx.paced.test", ip)
		startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Mail: dest.mail}})
		n := node{h: h, sh: clusterNode(t, name, st)}
		for j := range 4 {
			n.ids = append(n.ids, h.enqueue("alice@sender.test", fmt.Sprintf("r%d@paced.test", 4*i+j)))
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		n.h.start(func(o *Options) { o.Shared = n.sh })
	}
	eventually(t, 30*time.Second, "12 messages delivered", func() bool {
		for _, n := range nodes {
			for _, id := range n.ids {
				if !n.h.gone(id) {
					return false
				}
			}
		}
		return true
	})
	dest.mu.Lock()
	defer dest.mu.Unlock()
	if dest.refused > 0 {
		t.Errorf("the destination refused %d MAILs: the nodes together sent faster than the shared pace", dest.refused)
	}
	slices.SortFunc(dest.accepted, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(dest.accepted); i++ {
		if gap := dest.accepted[i].Sub(dest.accepted[i-1]); gap < dest.gap {
			t.Errorf("starts %d and %d %v apart, want at least %v", i-1, i, gap, dest.gap)
		}
	}
}

// TestLocalPaceOwnRefusals: with cluster.destination_limits local each
// node paces on its own, so what another node's refusals taught it does
// not space this node's starts. Another node published the record of an
// opening refused eight times in a row (its gap: 2 s doubled seven times,
// over four minutes); this node, whose own transactions the destination
// accepts, delivers its messages one after another. Before, it adopted
// that record: the refusals of every node added up in one count, and in
// the integration test's three-node cluster one node, never refused
// since its last acceptance, waited out such a gap for over 90 s.
func TestLocalPaceOwnRefusals(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	st := clustertest.NewMemory()
	h := newHarness(t)
	h.dns.MX("paced.test", 10, "mx.paced.test").A("mx.paced.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{})
	first := h.enqueue("alice@sender.test", "r0@paced.test")
	h.start(func(o *Options) { o.Shared = clusterNodeLimits(t, "a", st, cluster.LimitsLocal) })
	eventually(t, 10*time.Second, "the first message delivered", func() bool { return h.gone(first) })
	// This node has started a transaction (its pace counts from it); now
	// the other node's record arrives, newer than this node's.
	clusterNodeLimits(t, "other", st, cluster.LimitsLocal).Publish(queue.Destination{Domain: "paced.test",
		PaceInterval: 2 * time.Second, PaceRefusals: 8, ThrottleLevel: 1, Updated: time.Now().Add(time.Second)})
	time.Sleep(sharedRefresh + 100*time.Millisecond) // the next start reads the shared view again
	var ids []queue.ID
	for i := range 3 {
		ids = append(ids, h.enqueue("alice@sender.test", fmt.Sprintf("r%d@paced.test", i+1)))
	}
	h.eng.Kick()
	eventually(t, 20*time.Second, "3 more messages delivered", func() bool {
		for _, id := range ids {
			if !h.gone(id) {
				return false
			}
		}
		return true
	})
}

// concurrencyMX counts transactions between MAIL and the final dot, and
// keeps the highest count seen; each transaction lasts at least hold.
type concurrencyMX struct {
	hold     time.Duration
	mu       sync.Mutex
	cur, max int
}

func (m *concurrencyMX) mail(int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur++
	m.max = max(m.max, m.cur)
	return nil
}

func (m *concurrencyMX) data(int) error {
	time.Sleep(m.hold)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur--
	return nil
}

// TestConnectionCaps: delivery.max_per_destination_local caps one node's
// connections to a destination, alone or under a limit the nodes share;
// a shared max_per_destination holds for the nodes together, and every
// message is delivered.
func TestConnectionCaps(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		perDest, cap int
		nodes        int
		shared       bool
		wantMax      int
		wantMoreThan int // the cap binds: without it more would be open
	}{
		{name: "no local cap", perDest: 6, nodes: 1, wantMax: 6, wantMoreThan: 2},
		{name: "local cap 2 of 6", perDest: 6, cap: 2, nodes: 1, wantMax: 2},
		{name: "shared 2 over two nodes", perDest: 2, nodes: 2, shared: true, wantMax: 2},
		{name: "shared 6, local cap 2, two nodes", perDest: 6, cap: 2, nodes: 2, shared: true, wantMax: 4, wantMoreThan: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each case its own MX host, harnesses and store
			st := clustertest.NewMemory()
			ip := relaytest.Loopback(t)
			dest := &concurrencyMX{hold: 300 * time.Millisecond}
			var all []func() bool
			var hs []*harness
			for n := range tt.nodes {
				h := newHarness(t, func(c *config.Config) {
					c.Delivery.MaxPerDestination, c.Delivery.MaxPerDestinationLocal = tt.perDest, tt.cap
					c.Delivery.InitialPerDestination = tt.perDest // no slow start: the caps are what binds
					c.Delivery.MaxMessagesPerConnection = 1       // a connection per message: the caps bind at once
				})
				h.dns.MX("busy.test", 10, "mx.busy.test").A("mx.busy.test", ip)
				startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Mail: dest.mail, Data: dest.data}})
				for j := range 24 {
					id := h.enqueue("alice@sender.test", fmt.Sprintf("r%d-%d@busy.test", n, j))
					all = append(all, func() bool { return h.gone(id) })
				}
				hs = append(hs, h)
			}
			for n, h := range hs {
				if tt.shared {
					sh := clusterNode(t, fmt.Sprintf("n%d", n), st)
					h.start(func(o *Options) { o.Shared = sh })
				} else {
					h.start()
				}
			}
			eventually(t, 60*time.Second, "every message delivered", func() bool {
				return !slices.ContainsFunc(all, func(gone func() bool) bool { return !gone() })
			})
			dest.mu.Lock()
			defer dest.mu.Unlock()
			if dest.max > tt.wantMax || dest.max <= tt.wantMoreThan {
				t.Errorf("at most %d transactions at once, want at most %d and more than %d", dest.max, tt.wantMax, tt.wantMoreThan)
			}
		})
	}
}

// revokingShared grants every slot; the first one's lost channel is
// revoke, which the test closes, as relay/cluster does with a slot it
// granted while Redis was away and then found no room for.
type revokingShared struct {
	loadOnly
	revoke   chan struct{}
	mu       sync.Mutex
	acquired int
}

func (s *revokingShared) Acquire(string, int) (func(), <-chan struct{}, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acquired++
	if s.acquired == 1 {
		return func() {}, s.revoke, true
	}
	return func() {}, nil, true
}

// TestLostSlotClosesAtMessageBoundary: a connection whose cluster-wide
// slot is taken back while a message is in flight finishes that message,
// then closes; the next message goes on a new connection under a new
// slot. Without the check the one connection would carry all three.
func TestLostSlotClosesAtMessageBoundary(t *testing.T) {
	ip := relaytest.Loopback(t)
	sh := &revokingShared{revoke: make(chan struct{})}
	h := newHarness(t, func(c *config.Config) { c.Delivery.MaxPerDestination = 1 })
	h.dns.MX("busy.test", 10, "mx.busy.test").A("mx.busy.test", ip)
	var once sync.Once
	mx := startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Data: func(int) error {
		once.Do(func() { close(sh.revoke) })
		return nil
	}}})
	var ids []queue.ID
	for i := range 3 {
		ids = append(ids, h.enqueue("alice@sender.test", fmt.Sprintf("r%d@busy.test", i)))
	}
	h.start(func(o *Options) { o.Shared = sh })
	eventually(t, 30*time.Second, "3 messages delivered", func() bool {
		return !slices.ContainsFunc(ids, func(id queue.ID) bool { return !h.gone(id) })
	})
	txs := mx.Delivered()
	if len(txs) != 3 {
		t.Fatalf("%d transactions delivered, want 3", len(txs))
	}
	if txs[1].Conn == txs[0].Conn {
		t.Errorf("the connection whose slot was taken back carried another message (connections %d, %d, %d)", txs[0].Conn, txs[1].Conn, txs[2].Conn)
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.acquired < 2 {
		t.Errorf("%d slots acquired, want a new one after the first was taken back", sh.acquired)
	}
}

// TestSharedPaceReachesOpenConnection: a pace another node learns while
// this node's worker keeps a connection to the destination open applies
// to that connection's next transactions within sharedRefresh, not only
// to the next connection: until then the node, not paced, neither waits
// nor reserves its starts across the nodes, and runs into theirs (three
// nodes of the real binary were refused four and five times, one node
// carrying on at full speed on the connection it opened before the
// others learned the pace).
func TestSharedPaceReachesOpenConnection(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	st := clustertest.NewMemory()
	teacher := clusterNode(t, "teacher", st)
	const interval = 400 * time.Millisecond
	var (
		mu        sync.Mutex
		mails     []time.Time
		published time.Time
	)
	script := relaytest.Script{
		Mail: func(int) error {
			mu.Lock()
			defer mu.Unlock()
			mails = append(mails, time.Now())
			if len(mails) == 2 { // the connection is open and carries messages: another node learns the pace
				published = time.Now()
				teacher.Publish(queue.Destination{Domain: "paced.test", PaceInterval: interval, PaceBase: interval,
					Updated: published})
			}
			return nil
		},
		Data: func(int) error { time.Sleep(100 * time.Millisecond); return nil }, // a transaction takes a while
	}
	h := newHarness(t, func(c *config.Config) { c.Delivery.MaxPerDestination = 1 })
	h.dns.MX("paced.test", 10, "mx.paced.test").A("mx.paced.test", ip)
	mx := startMX(t, ip, h.port, relaytest.MXOptions{Script: script})
	var ids []queue.ID
	for i := range 24 {
		ids = append(ids, h.enqueue("alice@sender.test", fmt.Sprintf("r%d@paced.test", i)))
	}
	h.start(func(o *Options) { o.Shared = clusterNode(t, "a", st) })
	relaytest.Eventually(t, 60*time.Second, "24 messages delivered", func() error {
		for _, id := range ids {
			if !h.gone(id) {
				return fmt.Errorf("%v not delivered yet", id)
			}
		}
		return nil
	})
	if c := mx.Connections(); len(c) != 1 {
		t.Fatalf("%d connections, want the one the node kept open: the test needs it", len(c))
	}
	mu.Lock()
	defer mu.Unlock()
	// After sharedRefresh (and a transaction in flight) the node knows the
	// pace: from then on its starts are the pace apart. The MAILs are
	// dated at the MX, a start's Begin commit and the command later: on a
	// loaded machine that varies by over 100 ms from one to the next
	// (two MAILs 268 ms and 135 ms apart for starts 400 ms apart, in CI's
	// full suite: a late MAIL makes one gap short and the one before it
	// long), so the median gap must be most of the pace (unpaced, they
	// come a transaction apart: about 100 ms here) and their mean the pace.
	known := published.Add(sharedRefresh + 300*time.Millisecond)
	var (
		first, last time.Time
		gaps        []time.Duration
	)
	for i := 1; i < len(mails); i++ {
		if mails[i-1].Before(known) {
			continue
		}
		if first.IsZero() {
			first = mails[i-1]
		}
		last = mails[i]
		gaps = append(gaps, mails[i].Sub(mails[i-1]))
	}
	paced := len(gaps)
	if paced < 3 {
		t.Fatalf("only %d MAILs came after the pace was known; the test needs more", paced)
	}
	slices.Sort(gaps)
	if median := gaps[paced/2]; median < interval*3/4 {
		t.Errorf("MAILs %v apart by the median on the open connection after another node learned a pace of %v (gaps %v)",
			median.Round(time.Millisecond), interval, gaps)
	}
	if mean := last.Sub(first) / time.Duration(paced); mean < interval-20*time.Millisecond {
		t.Errorf("MAILs %v apart on average on the open connection after another node learned a pace of %v", mean.Round(time.Millisecond), interval)
	}
}
