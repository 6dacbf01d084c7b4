package peers

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRealRelay runs the real binary end to end: swaks submits to the
// relay, whose static route delivers to a sink.
func TestRealRelay(t *testing.T) {
	Require(t, "swaks")
	sink := StartSink(t, "", SinkOptions{})
	smtpAddr, adminAddr := FreeAddr(t, "127.0.0.1"), FreeAddr(t, "127.0.0.1")
	cfg := fmt.Sprintf(`hostname: relay.test
listeners:
  - address: %s
    mode: smtp
admin:
  address: %s
queue:
  path: queue.db
delivery:
  source_ipv4: 127.0.0.1
  allow_private_destinations: true
  tls: none
  routes:
    dest.test: %q
`, smtpAddr, adminAddr, sink.Addr)
	r := StartRelay(t, cfg)
	out, code := SwaksMessage{Server: r.SMTPAddr, From: "a@src.test", To: []string{"b@dest.test"},
		Data: []byte("Subject: real relay\r\n\r\nhello\r\n")}.Send(t)
	if code != 0 {
		t.Fatalf("swaks exit %d:\n%s", code, out)
	}
	msgs := sink.WaitFor(t, 1, 20*time.Second)
	if msgs[0].From != "a@src.test" || !strings.Contains(string(msgs[0].Data), "\r\n\r\nhello\r\n") {
		t.Errorf("sink got from %q data %q", msgs[0].From, msgs[0].Data)
	}
}
