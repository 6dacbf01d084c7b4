package delivery

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestLoop_OperatorChangesWhileDelivering: the operator's changes (suspend,
// the list of suspensions, resume, retry, requeue, forget) run on the
// loop's goroutine while workers deliver, ask it for jobs and leave it
// notes. Every change returns, every message is delivered exactly once,
// and Run ends when asked (harness.stop fails the test otherwise). Run
// with -race, it guards the rule that only the loop touches its state.
func TestLoop_OperatorChangesWhileDelivering(t *testing.T) {
	t.Parallel()
	ip := relaytest.Loopback(t)
	h := newHarness(t)
	domains := []string{"l1.test", "l2.test", "l3.test"}
	for _, d := range domains {
		h.dns.MX(d, 10, "mx."+d).A("mx."+d, ip)
	}
	mx := startMX(t, ip, h.port, relaytest.MXOptions{})
	h.start()
	const n = 30
	var ids []queue.ID
	for i := range n {
		ids = append(ids, h.enqueue("alice@sender.test", fmt.Sprintf("r%d@%s", i, domains[i%len(domains)])))
	}
	var wg sync.WaitGroup
	for _, d := range domains {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				now := time.Now()
				if _, err := h.eng.Suspend(d, "test", now.Add(time.Hour), now); err != nil {
					t.Errorf("Suspend %s: %v", d, err)
				}
				if got := h.eng.Suspensions(now); len(got) == 0 {
					t.Errorf("Suspensions after suspending %s: none", d)
				}
				if was, _, err := h.eng.Resume(d, now); err != nil || !was {
					t.Errorf("Resume %s = %v, %v; want it suspended", d, was, err)
				}
				if _, err := h.eng.Retry(queue.Selector{Domain: d}, now); err != nil {
					t.Errorf("Retry %s: %v", d, err)
				}
				if _, err := h.eng.Requeue(queue.Selector{Domain: d}, now); err != nil {
					t.Errorf("Requeue %s: %v", d, err)
				}
				if _, err := h.eng.Forget(d, false, now); err != nil {
					t.Errorf("Forget %s: %v", d, err)
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, wait, "every message delivered", func() bool {
		for _, id := range ids {
			if !h.gone(id) {
				return false
			}
		}
		return true
	})
	if got := len(mx.Delivered()); got != n {
		t.Errorf("the MX got %d messages, want %d", got, n)
	}
}
