package delivery

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// storedCheck is a zap core that, while an attempt line is being written,
// watches the queue for a while: if the attempt's message leaves the
// queue meanwhile, its outcome was stored before its line was out, and
// someone waiting on the queue could have read the log (or the metrics)
// without it.
type storedCheck struct {
	q     *queue.Queue
	watch time.Duration

	mu    sync.Mutex
	early []string // queue ids whose message left the queue before their line was written
}

func (c *storedCheck) Enabled(zapcore.Level) bool        { return true }
func (c *storedCheck) With([]zapcore.Field) zapcore.Core { return c }
func (c *storedCheck) Sync() error                       { return nil }

func (c *storedCheck) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return ce.AddCore(ent, c)
}

func (c *storedCheck) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if !strings.HasPrefix(ent.Message, "delivery attempt") {
		return nil
	}
	for _, f := range fields {
		if f.Key != "queue_id" {
			continue
		}
		id, err := queue.ParseID(f.String)
		if err != nil {
			return err
		}
		for end := time.Now().Add(c.watch); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if _, err := c.q.Message(id); errors.Is(err, queue.ErrNotFound) {
				c.mu.Lock()
				c.early = append(c.early, f.String)
				c.mu.Unlock()
				return nil
			}
		}
	}
	return nil
}

// TestDeliver_LoggedBeforeStored: an attempt's log line and metrics exist
// before its outcome is stored, so a test (or an operator) that waits for
// the message to leave the queue finds them at once. The first message
// teaches the destination something (a synchronous store), the second
// does not (handed to the queue asynchronously); both orders are checked.
func TestDeliver_LoggedBeforeStored(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t)
	h.dns.MX("order.test", 10, "mx.order.test").A("mx.order.test", ip)
	startMX(t, ip, h.port, relaytest.MXOptions{})
	check := &storedCheck{q: h.q, watch: 300 * time.Millisecond}
	h.start(func(o *Options) { o.Logger = zap.New(zapcore.NewTee(o.Logger.Core(), check)) })
	for i, rc := range []string{"first@order.test", "second@order.test"} {
		id := h.enqueue("alice@sender.test", rc)
		eventually(t, wait, "delivered", func() bool { return h.gone(id) })
		if outs := h.outcomes(rc); len(outs) != 1 || outs[0]["outcome"] != "delivered" {
			t.Errorf("%s: logged %v when the message left the queue, want its delivered attempt", rc, outs)
		}
		if got := counter(h.m.Deliveries, "delivered", "none"); got != float64(i+1) {
			t.Errorf("%s: Deliveries{delivered} = %v when the message left the queue, want %d", rc, got, i+1)
		}
	}
	check.mu.Lock()
	defer check.mu.Unlock()
	if len(check.early) > 0 {
		t.Errorf("messages %v left the queue while their attempt line was still being written", check.early)
	}
}
