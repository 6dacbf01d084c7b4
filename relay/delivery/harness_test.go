package delivery

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/metrics"
	"github.com/greyrelay/greyrelay/relay/mx"
	"github.com/greyrelay/greyrelay/relay/mx/mxtest"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// sourceIP is the pinned source address every test delivers from.
const sourceIP = "127.0.0.2"

// baseYAML is the test configuration: loopback destinations allowed,
// short timeouts, a retry schedule in milliseconds, no jitter.
const baseYAML = `
hostname: relay.test
delivery:
  source_ipv4: 127.0.0.2
  allow_private_destinations: true
  tls: may
  connect_timeout: 2s
  greeting_timeout: 2s
  command_timeout: 2s
  data_timeout: 2s
retry:
  initial_interval: 150ms
  max_interval: 400ms
  factor: 2
  jitter: 0
  greylist_first_retry: 300ms
  greylist_second_retry: 400ms
  hint_min: 50ms
  hint_max: 1s
  lifetime: 1h
  delay_warnings: []
`

// harness is one engine on a fresh queue, with a test DNS server and a
// sink MX for sender.test that receives the DSNs.
type harness struct {
	t      *testing.T
	cfg    *config.Config
	path   string
	qopt   queue.Options // what openQueue opens the queue with
	q      *queue.Queue
	dns    *mxtest.Server
	port   int
	sink   *relaytest.FakeMX
	m      *metrics.Metrics
	logs   *observer.ObservedLogs
	eng    *Engine
	cancel context.CancelFunc
	done   chan error
}

// newHarness builds the harness; mods adjust the configuration.
func newHarness(t *testing.T, mods ...func(c *config.Config)) *harness {
	t.Helper()
	h := &harness{t: t, path: filepath.Join(t.TempDir(), "queue.db"), port: freePort(t)}
	cfg, err := config.Load(config.Source{Default: configs.Default, File: []byte(baseYAML)})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range mods {
		f(cfg)
	}
	cfg.Delivery.Port = h.port
	h.cfg = cfg
	h.dns = &mxtest.Server{}
	h.dns.Start(t)
	h.openQueue()
	sinkIP := relaytest.Loopback(t)
	h.dns.MX("sender.test", 10, "mx.sender.test").A("mx.sender.test", sinkIP)
	h.sink = startMX(t, sinkIP, h.port, relaytest.MXOptions{})
	return h
}

func (h *harness) openQueue() {
	q, err := queue.Open(h.path, h.qopt)
	if err != nil {
		h.t.Fatal(err)
	}
	h.q = q
}

// freePort returns a TCP port free on 127.0.0.20, for the fake MXes of a
// test (delivery.port is one port for every MX).
func freePort(t *testing.T) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 500 {
		// Below Linux's ephemeral range (32768 and up): every fake MX of a
		// test listens on this one port at its own address, and an
		// ephemeral port may meanwhile become the local end of some
		// outgoing connection on one of those addresses (seen once, as
		// "address already in use", when the whole repository's tests ran
		// at once).
		port := 20000 + rand.IntN(12000)
		if portsUsed[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.20:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		portsUsed[port] = true
		return port
	}
	t.Fatal("no free port below the ephemeral range")
	return 0
}

// portsUsed holds the ports freePort handed out in this test process, so
// that two parallel tests never share one.
var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

// router routes through the test DNS server to h.port.
func (h *harness) router() *mx.Router {
	return &mx.Router{Resolver: mx.NewDNS(h.dns.Addr(), time.Second), Port: h.port,
		AllowPrivate: true, IPv4: true, Smarthost: h.cfg.Delivery.Smarthost.Address, Routes: h.cfg.Delivery.Routes}
}

// start creates the engine with opt's changes applied and runs it.
func (h *harness) start(mod ...func(*Options)) {
	h.t.Helper()
	h.build(mod...)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.eng.Run(ctx) }()
	h.t.Cleanup(h.stop)
}

// build makes h.eng without running it.
func (h *harness) build(mod ...func(*Options)) {
	h.t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	h.logs = logs
	h.m = metrics.New(prometheus.NewRegistry())
	cl, err := classifier.New(h.cfg.Retry.Rules)
	if err != nil {
		h.t.Fatal(err)
	}
	opt := Options{Config: h.cfg, Queue: h.q, Classifier: cl, Router: h.router(),
		Dialer4: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(sourceIP)}},
		Logger:  zap.New(core), Metrics: h.m, Now: time.Now, Rand: func() float64 { return 0 }}
	for _, f := range mod {
		f(&opt)
	}
	h.eng, err = New(opt)
	if err != nil {
		h.t.Fatal(err)
	}
}

// stop ends the engine and closes the queue; it dumps the log on failure.
func (h *harness) stop() {
	if h.cancel != nil {
		h.cancel()
		select {
		case err := <-h.done:
			if err != nil {
				h.t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			h.t.Error("Run did not return after cancel")
		}
		h.cancel = nil
	}
	if h.q != nil {
		h.q.Close()
		h.q = nil
	}
	if h.t.Failed() && h.logs != nil {
		for _, e := range h.logs.All() {
			h.t.Logf("%s %s %v", e.Level, e.Message, e.ContextMap())
		}
	}
}

// enqueue queues a message from "from" to the given recipients.
func (h *harness) enqueue(from string, to ...string) queue.ID {
	h.t.Helper()
	return h.enqueueMsg(queue.NewMessage{From: from}, to...)
}

// enqueueMsg queues m (Body and Arrival filled in if empty) to the given
// recipients; "addr|NOTIFY" sets a NOTIFY parameter.
func (h *harness) enqueueMsg(m queue.NewMessage, to ...string) queue.ID {
	h.t.Helper()
	for _, a := range to {
		addr, notify, _ := strings.Cut(a, "|")
		dom, _ := domainOf(addr)
		m.To = append(m.To, queue.NewRecipient{Addr: addr, Domain: dom, Notify: notify})
	}
	if m.Body == nil {
		m.Body = []byte("From: <" + m.From + ">\r\nSubject: test\r\nMessage-ID: <t@sender.test>\r\n\r\nhello\r\n")
	}
	if m.Arrival.IsZero() {
		m.Arrival = time.Now()
	}
	id, err := h.q.Enqueue(m)
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}

// rcpt returns recipient i of message id; ok is false once the message is
// gone (all its recipients final).
func (h *harness) rcpt(id queue.ID, i int) (queue.Recipient, bool) {
	h.t.Helper()
	m, err := h.q.Show(id)
	if errors.Is(err, queue.ErrNotFound) {
		return queue.Recipient{}, false
	}
	if err != nil {
		h.t.Fatal(err)
	}
	for _, r := range m.Recipients {
		if r.Key.Rcpt == i {
			return r, true
		}
	}
	return queue.Recipient{}, false
}

// gone reports whether message id has left the queue.
//
// It waits on the queue alone: the engine logs and counts an attempt
// before it stores the outcome (see settle), so once the message is gone
// assertions on the log and the metrics can follow at once.
func (h *harness) gone(id queue.ID) bool {
	_, err := h.q.Message(id)
	return errors.Is(err, queue.ErrNotFound)
}

// outcomes returns the logged outcome of each attempt for rcpt, in order.
//
// Only attempts whose outcome the queue has stored count: the engine logs
// an attempt before it hands the outcome to the queue, so a test that
// waited for a line alone could read the recipient's state before it
// changed.
func (h *harness) outcomes(rcpt string) []map[string]any {
	var out []map[string]any
	for _, e := range h.logs.FilterMessageSnippet("delivery attempt").All() {
		if m := e.ContextMap(); m["rcpt"] == rcpt && h.stored(m) {
			out = append(out, m)
		}
	}
	return out
}

// stored reports whether the queue holds the outcome of the attempt that
// log line m reports: the message is gone, or its recipient has moved past
// that attempt, or that attempt is no longer in progress.
func (h *harness) stored(m map[string]any) bool {
	h.t.Helper()
	id, err := queue.ParseID(fmt.Sprint(m["queue_id"]))
	if err != nil {
		h.t.Fatalf("log line %v: %v", m, err)
	}
	n, _ := strconv.Atoi(fmt.Sprint(m["attempt"]))
	if h.q == nil {
		return true // stopped: the engine stored or held every outcome first
	}
	msg, err := h.q.Show(id)
	if errors.Is(err, queue.ErrNotFound) {
		return true
	}
	if err != nil {
		h.t.Fatal(err)
	}
	for _, r := range msg.Recipients {
		if r.Addr != m["rcpt"] {
			continue
		}
		if r.Attempts != n {
			return r.Attempts > n
		}
		return len(r.History) == 0 || r.History[len(r.History)-1].Outcome != "in-progress"
	}
	return true
}

// queued returns how many messages in the queue have a recipient still
// to deliver, DSNs included. The engine queues a DSN in the same update
// that stores the outcome it reports, so once that outcome is stored its
// DSN is either counted here or already delivered to the sink: a test
// waits for this event instead of sleeping to see that no (further) DSN
// comes. It reads the records, as gone does (Stats' counts may trail a
// commit).
func (h *harness) queued() int {
	h.t.Helper()
	ids := map[queue.ID]bool{}
	err := h.q.Walk(queue.Filter{}, func(m *queue.Message, _ *queue.Recipient) bool {
		ids[m.ID] = true
		return true
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return len(ids)
}

// drained reports whether the queue is empty: every message left it, and
// every DSN the engine queued has reached the sink.
func (h *harness) drained() bool { return h.queued() == 0 }

// dsns returns the DSNs the sink has received (MAIL FROM:<>).
func (h *harness) dsns() []relaytest.Tx {
	var out []relaytest.Tx
	for _, tx := range h.sink.Delivered() {
		if tx.From == "" {
			out = append(out, tx)
		}
	}
	return out
}

// counter reads a counter of a CounterVec.
func counter(c *prometheus.CounterVec, labels ...string) float64 {
	return testutil.ToFloat64(c.WithLabelValues(labels...))
}

// eventually is relaytest.Eventually for a condition.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	relaytest.Eventually(t, d, what, func() error {
		if !cond() {
			return errors.New("not yet")
		}
		return nil
	})
}
