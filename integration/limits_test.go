package integration

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// TestRobustLimits: denial-of-service and brute-force limits. The
// connection cap per client address answers 421 and closes; a client
// sending DATA below limits.min_data_rate is cut off with no 250 (while one
// above the rate, for longer than command_timeout, is not: the deadline is
// a data rate, not a fixed read timeout); an AUTH brute force
// ends with 421 and a close after limits.max_auth_failures, and the
// (address, user) AUTH limit then refuses even the right password for
// that user from that address, but not from another.
func TestRobustLimits(t *testing.T) {
	t.Parallel()
	relayIP, sinkIP := relaytest.Loopback(t), relaytest.Loopback(t)
	floodIP, slowIP, bruteIP, goodIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{})
	const perIP, authFailures, authPerUser = 5, 3, 5
	cfg := rbRelay{IP: relayIP, Routes: map[string]string{"dest.test": sink.Addr},
		UsersFile: rbUsersFile(t, "alice", "right-password", ""),
		Limits: map[string]string{
			"max_connections_per_ip": fmt.Sprint(perIP), "command_timeout": "2s", "min_data_rate": "500",
			"max_auth_failures": fmt.Sprint(authFailures), "max_auth_failures_per_user": fmt.Sprint(authPerUser),
		}}
	r := peers.StartRelay(t, cfg.YAML(t))

	t.Run("connection flood", func(t *testing.T) {
		t.Parallel()
		var held []*rbConn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for i := range perIP {
			c, err := rbDial(r.SMTPAddr, floodIP, false)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
			if rep, err := c.Read(); err != nil || rep.Code != 220 {
				t.Fatalf("connection %d under the cap: %v %v", i+1, rep, err)
			}
		}
		var slowest time.Duration
		for i := range 20 {
			start := time.Now()
			c, err := rbDial(r.SMTPAddr, floodIP, false)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := c.Read()
			took := time.Since(start)
			slowest = max(slowest, took)
			if err != nil || rep.Code != 421 || !strings.HasPrefix(rep.Text(), "4.7.0") {
				t.Errorf("connection %d over the cap: %v %v, want 421 4.7.0", perIP+i+1, rep, err)
			}
			if _, err := c.Read(); !errors.Is(err, io.EOF) {
				t.Errorf("connection %d over the cap was not closed after 421: %v", perIP+i+1, err)
			}
			c.Close()
			if took > 2*time.Second {
				t.Errorf("421 took %v", took)
			}
		}
		t.Logf("the slowest 421 came after %v", slowest)
		// The cap is per address: another client is served meanwhile.
		other, err := rbDialSMTP(r.SMTPAddr, goodIP, false, "good.test")
		if err != nil {
			t.Fatalf("another address during the flood: %v", err)
		}
		other.Close()
		// A freed slot is usable again.
		held[0].Close()
		held = held[1:]
		rbWaitUntil(t, 5*time.Second, "a free slot after a close", func() bool {
			c, err := rbDial(r.SMTPAddr, floodIP, false)
			if err != nil {
				return false
			}
			rep, err := c.Read()
			if err == nil && rep.Code == 220 {
				held = append(held, c)
				return true
			}
			c.Close()
			return false
		})
	})

	t.Run("slow DATA is cut off", func(t *testing.T) {
		t.Parallel()
		// 20 bytes every 100 ms: 200 B/s, below the 500 B/s minimum.
		replies, took, err := rbDripData(r.SMTPAddr, slowIP, "slow@src.test", 20, 100*time.Millisecond, 30*time.Second)
		for _, rep := range replies {
			if rep.Code == 250 {
				t.Errorf("a client below min_data_rate got %v", rep)
			}
		}
		if err == nil {
			t.Fatalf("the slow client was not cut off within 30 s (replies %v)", replies)
		}
		t.Logf("cut off after %v: replies %v, then %v", took.Round(time.Millisecond), replies, err)
		if took > 10*time.Second {
			t.Errorf("cut off only after %v (command_timeout 2s, min_data_rate 500)", took)
		}
	})

	t.Run("DATA above the rate outlasts command_timeout", func(t *testing.T) {
		t.Parallel()
		// 100 bytes every 100 ms: 1000 B/s for 4 s, twice command_timeout.
		replies, took, err := rbDripData(r.SMTPAddr, goodIP, "fast@src.test", 100, 100*time.Millisecond, 4*time.Second)
		if err != nil || len(replies) != 1 || replies[0].Code != 250 {
			t.Fatalf("after %v: replies %v, error %v; want 250", took, replies, err)
		}
		if m := sink.WaitFor(t, 1, 10*time.Second)[0]; m.From != "fast@src.test" {
			t.Errorf("the sink received a message from %q", m.From)
		}
	})

	t.Run("AUTH brute force", func(t *testing.T) {
		t.Parallel()
		plain := func(user, pass string) string {
			return "AUTH PLAIN " + base64.StdEncoding.EncodeToString([]byte("\x00"+user+"\x00"+pass))
		}
		// Connection 1: failures until 421 and close.
		c, err := rbDialSMTP(r.SMTPAddr, bruteIP, false, "brute.test")
		if err != nil {
			t.Fatal(err)
		}
		fails := 0
		for i := range 100 {
			rep, err := c.Cmd(plain("alice", fmt.Sprintf("guess-%d", i)))
			if err != nil {
				t.Fatalf("attempt %d: connection failed without a 421: %v", i+1, err)
			}
			if rep.Code == 421 {
				break
			}
			if rep.Code != 535 {
				t.Fatalf("attempt %d: %v, want 535 5.7.8 or 421", i+1, rep)
			}
			fails++
		}
		if fails >= authFailures {
			t.Errorf("%d failures answered 535 before the 421, want fewer than max_auth_failures=%d", fails, authFailures)
		}
		if _, err := c.Read(); !errors.Is(err, io.EOF) {
			t.Errorf("the connection stayed open after 421: %v", err)
		}
		c.Close()
		// More connections from the same address until alice's limit
		// there (5 failures an hour) is used up; then even her right
		// password is refused from there.
		total := fails + 1
		for total < authPerUser {
			c, err := rbDialSMTP(r.SMTPAddr, bruteIP, false, "brute.test")
			if err != nil {
				t.Fatal(err)
			}
			for total < authPerUser {
				rep, err := c.Cmd(plain("alice", "wrong"))
				if err != nil || rep.Code/100 == 2 {
					t.Fatalf("failure %d: %v %v", total+1, rep, err)
				}
				total++
				if rep.Code == 421 {
					break
				}
			}
			c.Close()
		}
		c, err = rbDialSMTP(r.SMTPAddr, bruteIP, false, "brute.test")
		if err != nil {
			t.Fatal(err)
		}
		if rep, err := c.Cmd(plain("alice", "right-password")); err == nil && rep.Code/100 == 2 {
			t.Errorf("after %d failures from %s, the right password was accepted: %v", total, bruteIP, rep)
		}
		c.Close()
		// Another address is not affected.
		g, err := rbDialSMTP(r.SMTPAddr, goodIP, false, "good.test")
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if rep, err := g.Cmd(plain("alice", "right-password")); err != nil || rep.Code != 235 {
			t.Errorf("the right password from another address: %v %v, want 235", rep, err)
		}
	})

	t.Cleanup(func() {
		// Nothing from the slow client was queued or delivered: the only
		// message is the one above the rate.
		if st := rbStats(t, r); st.Messages > 1 {
			t.Errorf("%d messages queued, want at most the fast client's", st.Messages)
		}
		for _, m := range sink.Messages() {
			if m.From != "fast@src.test" {
				t.Errorf("the sink received a message from %q", m.From)
			}
		}
	})
}

// rbDripData opens a session from localIP, starts DATA and sends the body
// chunk bytes at a time every interval for up to dur (then the final dot).
// A reader collects every reply. It returns the replies, the time from
// DATA to the end, and the error that ended the session (nil if the final
// dot was answered and the connection is still open).
func rbDripData(addr, localIP, from string, chunk int, interval, dur time.Duration) ([]rbReply, time.Duration, error) {
	c, err := rbDialSMTP(addr, localIP, false, "drip.test")
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	for _, cmd := range []string{"MAIL FROM:<" + from + ">", "RCPT TO:<user@dest.test>"} {
		if rep, err := c.Cmd(cmd); err != nil || rep.Code != 250 {
			return nil, 0, fmt.Errorf("%s: %v %v", cmd, rep, err)
		}
	}
	if rep, err := c.Cmd("DATA"); err != nil || rep.Code != 354 {
		return nil, 0, fmt.Errorf("DATA: %v %v", rep, err)
	}
	start := time.Now()
	type result struct {
		rep rbReply
		err error
	}
	got := make(chan result, 4)
	c.timeout = time.Minute
	go func() {
		for {
			rep, err := c.Read()
			got <- result{rep, err}
			if err != nil {
				return
			}
		}
	}()
	var replies []rbReply
	line := strings.Repeat("x", chunk-2) + "\r\n"
	tick := time.NewTicker(interval)
	defer tick.Stop()
	end := time.After(dur)
	for sending := true; sending; {
		select {
		case r := <-got:
			if r.err != nil {
				return replies, time.Since(start), r.err
			}
			replies = append(replies, r.rep)
		case <-tick.C:
			if err := c.WriteRaw([]byte(line)); err != nil {
				// The server closed: collect what it said before.
				took := time.Since(start)
				for r := range got {
					if r.err != nil {
						break
					}
					replies = append(replies, r.rep)
				}
				return replies, took, err
			}
		case <-end:
			sending = false
		}
	}
	if err := c.WriteRaw([]byte(".\r\n")); err != nil {
		return replies, time.Since(start), err
	}
	r := <-got
	if r.err != nil {
		return replies, time.Since(start), r.err
	}
	return append(replies, r.rep), time.Since(start), nil
}
