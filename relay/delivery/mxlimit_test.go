package delivery

import (
	"testing"

	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestDeliver_MXSessionLimit: hosts that answer but leave the recipients
// undone (421 at MAIL) are tried for at most delivery.mx_session_limit
// sessions per attempt, as Postfix's smtp_mx_session_limit bounds them; the
// recipient waits for the next attempt.
func TestDeliver_MXSessionLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) { c.Delivery.MXSessionLimit = 2 })
	busy := func(int) error {
		return relaytest.Reply("421 4.3.2 busy, closing")
	}
	var mxs []*relaytest.FakeMX
	for i := range 3 {
		ip := relaytest.Loopback(t)
		host := []string{"mx1", "mx2", "mx3"}[i] + ".limit.test"
		h.dns.MX("limit.test", uint16(10*(i+1)), host).A(host, ip)
		mxs = append(mxs, startMX(t, ip, h.port, relaytest.MXOptions{Script: relaytest.Script{Mail: busy}}))
	}
	h.enqueue("alice@sender.test", "x@limit.test")
	h.start()
	eventually(t, wait, "attempt logged", func() bool { return len(h.outcomes("x@limit.test")) > 0 })
	h.stop()
	got := []int{len(mxs[0].Connections()), len(mxs[1].Connections()), len(mxs[2].Connections())}
	if got[0] != 1 || got[1] != 1 || got[2] != 0 {
		t.Errorf("connections per MX %v, want [1 1 0]", got)
	}
	if outs := h.outcomes("x@limit.test"); outs[0]["outcome"] == "delivered" || outs[0]["outcome"] == "failed" {
		t.Errorf("outcome %v, want deferred", outs[0])
	}
}
