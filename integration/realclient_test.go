package integration

// Behind the PROXY protocol every security decision is about the client
// the header names, not the balancer next door: whether AUTH may go in
// clear, and whose failures lock out whom. The relay listens on loopback,
// as it does behind a local HAProxy, and the clients come from 203.0.113.x
// (HAProxy is told to name that address; the raw headers name it
// themselves).

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

func authPlain(user, pass string) string {
	return "AUTH PLAIN " + base64.StdEncoding.EncodeToString([]byte("\x00"+user+"\x00"+pass))
}

// TestAuthBehindProxyUsesRealClient: a client from 203.0.113.9 reaching a
// loopback listener through HAProxy, or with a PROXY v1 header the test
// writes itself, is not offered AUTH before STARTTLS and gets 523 5.7.10
// for it, then 235 under TLS; a loopback client behind the same balancer
// may still AUTH in clear. Failures lock alice out for 203.0.113.9 only,
// not for 203.0.113.10 behind the same balancer. `config check` warns of a
// PROXY listener that would offer AUTH in clear.
func TestAuthBehindProxyUsesRealClient(t *testing.T) {
	peers.Require(t, "haproxy")
	t.Parallel()
	mn := newMailNet(t)
	mn.sink("dest.test", peers.SinkOptions{})
	ip := mn.host("")
	cert := peers.NewCert(t, "relay.test")
	users := rbUsersFile(t, "alice", "right-password", "")
	r := peers.StartRelay(t, mn.relayYAML(ip,
		fmt.Sprintf(`listeners=[{address: "%s", mode: smtp, proxy_protocol: true, tls_cert: %q, tls_key: %q}]`,
			peers.FreeAddr(t, ip), cert.CertFile, cert.KeyFile),
		"proxy_protocol.trusted=[127.0.0.1/32]", fmt.Sprintf("users_file=%q", users),
		"limits.max_auth_failures_per_user=2"))
	lb := peers.StartHAProxy(t, peers.HAProxyConfig{Backends: []string{r.SMTPAddr}, ClientAddr: "203.0.113.9"})

	// open starts a session as client: through HAProxy ("haproxy"), or
	// straight to the relay from the balancer's address with a PROXY v1
	// header naming client.
	open := func(t *testing.T, via, client string) *rbConn {
		t.Helper()
		addr := lb.Addr
		if via == "v1" {
			addr = r.SMTPAddr
		}
		c, err := rbDial(addr, "127.0.0.1", false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if via == "v1" {
			if err := c.WriteRaw([]byte(fmt.Sprintf("PROXY TCP4 %s 127.0.0.1 40000 25\r\n", client))); err != nil {
				t.Fatal(err)
			}
		}
		if rep, err := c.Read(); err != nil || rep.Code != 220 {
			t.Fatalf("%s %s: greeting %v %v", via, client, rep, err)
		}
		return c
	}
	ehlo := func(t *testing.T, c *rbConn) string {
		t.Helper()
		rep, err := c.Cmd("EHLO client.test")
		if err != nil || rep.Code != 250 {
			t.Fatalf("EHLO: %v %v", rep, err)
		}
		return rep.Text()
	}
	expect := func(t *testing.T, c *rbConn, cmd string, code int, enhanced string) {
		t.Helper()
		rep, err := c.Cmd(cmd)
		if err != nil || rep.Code != code || !strings.HasPrefix(rep.Text(), enhanced) {
			t.Fatalf("%s: %v %v, want %d %s", strings.Fields(cmd)[0], rep, err, code, enhanced)
		}
	}
	tlsSession := func(t *testing.T, via, client string) *rbConn {
		t.Helper()
		c := open(t, via, client)
		ehlo(t, c)
		if err := c.StartTLS(); err != nil {
			t.Fatal(err)
		}
		if caps := ehlo(t, c); !strings.Contains(caps, "AUTH PLAIN LOGIN") {
			t.Fatalf("AUTH not offered under TLS: %s", caps)
		}
		return c
	}

	for _, via := range []string{"haproxy", "v1"} {
		t.Run(via, func(t *testing.T) {
			c := open(t, via, "203.0.113.9")
			if caps := ehlo(t, c); strings.Contains(caps, "AUTH") {
				t.Errorf("AUTH offered in clear to 203.0.113.9: %s", caps)
			}
			expect(t, c, authPlain("alice", "right-password"), 523, "5.7.10")
			if err := c.StartTLS(); err != nil {
				t.Fatal(err)
			}
			ehlo(t, c)
			expect(t, c, authPlain("alice", "right-password"), 235, "2.0.0")
		})
	}
	t.Run("loopback client", func(t *testing.T) {
		c := open(t, "v1", "127.0.0.7")
		if caps := ehlo(t, c); !strings.Contains(caps, "AUTH PLAIN LOGIN") {
			t.Errorf("AUTH not offered in clear to a loopback client: %s", caps)
		}
		expect(t, c, authPlain("alice", "right-password"), 235, "2.0.0")
	})

	t.Run("lockout by the real client", func(t *testing.T) {
		c := tlsSession(t, "haproxy", "203.0.113.9")
		expect(t, c, authPlain("alice", "guess-1"), 535, "5.7.8")
		expect(t, c, authPlain("alice", "guess-2"), 421, "4.7.0")
		c = tlsSession(t, "v1", "203.0.113.9")
		expect(t, c, authPlain("alice", "right-password"), 421, "4.7.0")
		c = tlsSession(t, "v1", "203.0.113.10")
		expect(t, c, authPlain("alice", "right-password"), 235, "2.0.0")
	})

	t.Run("config check", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "greyrelay.yaml")
		yml := mn.relayYAML(ip,
			fmt.Sprintf(`listeners=[{address: "%s", mode: smtp, proxy_protocol: true, allow_plaintext_auth: true}]`, peers.FreeAddr(t, ip)),
			"proxy_protocol.trusted=[127.0.0.1/32]", fmt.Sprintf("users_file=%q", users))
		if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
		res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", path)
		if out := res.Stdout + res.Stderr; !strings.Contains(out, "has proxy_protocol and allow_plaintext_auth: AUTH PLAIN/LOGIN is offered before STARTTLS") {
			t.Errorf("config check said nothing of AUTH in clear behind PROXY:\n%s", res)
		}
	})
}

// TestAuthLockoutPerUser: with the default limits, 21 wrong passwords for
// bob from one address (a NAT, or Docker's -p, which puts every client
// behind one address) lock bob out there and nobody else: alice's right
// password from that address still gets 235, bob's gets 421, and bob from
// another address gets 235. Guessing on to the address's own ceiling
// (max_auth_failures_per_ip) only slows it: every AUTH reply to it then
// waits auth_delay, and alice still gets in.
func TestAuthLockoutPerUser(t *testing.T) {
	t.Parallel()
	mn := newMailNet(t)
	ip := mn.host("")
	users := filepath.Join(t.TempDir(), "users")
	var lines []byte
	for _, u := range []string{"alice", "bob"} {
		b, err := os.ReadFile(rbUsersFile(t, u, u+"-password", ""))
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, b...)
	}
	if err := os.WriteFile(users, lines, 0o600); err != nil {
		t.Fatal(err)
	}
	r := peers.StartRelay(t, mn.relayYAML(ip, fmt.Sprintf("users_file=%q", users)))
	nat, elsewhere := mn.host(""), mn.host("")

	// guess sends wrong passwords for user from addr, n of them, over as
	// many connections as max_auth_failures (3) makes it take.
	guess := func(t *testing.T, addr, user string, n int) {
		t.Helper()
		for n > 0 {
			c, err := rbDialSMTP(r.SMTPAddr, addr, false, "guess.test")
			if err != nil {
				t.Fatal(err)
			}
			for n > 0 {
				rep, err := c.Cmd(authPlain(user, fmt.Sprintf("guess-%d", n)))
				if err != nil || rep.Code != 535 && rep.Code != 421 {
					t.Fatalf("guess: %v %v, want 535 or 421", rep, err)
				}
				n--
				if rep.Code == 421 {
					break
				}
			}
			c.Close()
		}
	}
	login := func(t *testing.T, addr, user string) (rbReply, time.Duration) {
		t.Helper()
		c, err := rbDialSMTP(r.SMTPAddr, addr, false, "client.test")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		rep, err := c.Cmd(authPlain(user, user+"-password"))
		if err != nil {
			t.Fatalf("AUTH %s from %s: %v", user, addr, err)
		}
		return rep, time.Since(start)
	}

	guess(t, nat, "bob", 21)
	if rep, _ := login(t, nat, "alice"); rep.Code != 235 {
		t.Errorf("alice from %s after 21 guesses for bob there: %v, want 235", nat, rep)
	}
	if rep, _ := login(t, nat, "bob"); rep.Code != 421 || !strings.HasPrefix(rep.Text(), "4.7.0") {
		t.Errorf("bob from %s after 21 guesses for him there: %v, want 421 4.7.0", nat, rep)
	}
	if rep, _ := login(t, elsewhere, "bob"); rep.Code != 235 {
		t.Errorf("bob from %s: %v, want 235", elsewhere, rep)
	}

	// The address's ceiling (100 failures an hour, for any users): past it
	// every reply waits auth_delay (5 s), and a right password still works.
	for i := range 4 {
		guess(t, nat, fmt.Sprintf("user%d", i), 20)
	}
	rep, took := login(t, nat, "alice")
	if rep.Code != 235 {
		t.Errorf("alice from %s past the address's ceiling: %v, want 235", nat, rep)
	}
	if took < 5*time.Second {
		t.Errorf("AUTH from an address past its ceiling answered after %v, want auth_delay (5s) or more", took)
	}
}
