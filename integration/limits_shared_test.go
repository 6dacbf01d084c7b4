package integration

// user_limits counts with the real binary: two nodes sharing a real Redis
// share one AUTH user's hourly quota, and neither a restart of a lone
// node nor one of a cluster's node resets the counts (a relay restarted
// in a loop would otherwise let a runaway application past its quota).

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// authSend sends one message as user (password user-pw) through r.
func authSend(t *testing.T, r *testRelay, user string) (string, int) {
	t.Helper()
	m := peers.SwaksMessage{Server: r.SMTPAddr, From: user + "@users.test", To: []string{user + "@dest.test"},
		Args: []string{"--auth", "PLAIN", "--auth-user", user, "--auth-password", user + "-pw"}}
	return m.Send(t)
}

const overQuota = "451 4.7.1 Sending rate limit reached for alice: 3 messages per hour"

func TestUserLimitsSharedByTheCluster(t *testing.T) {
	peers.Require(t, "swaks", "redis-server")
	t.Parallel()
	n := newMailNet(t)
	rds := peers.StartRedis(t, "")
	sink := n.sink("dest.test", peers.SinkOptions{})
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte(userLine(t, "alice")), 0o600); err != nil {
		t.Fatal(err)
	}
	ov := []string{"users_file=" + users, "trusted_networks=[]", "user_limits.messages_per_hour=3"}
	a, b := n.clusterNode(rds.Addr, ov...), n.clusterNode(rds.Addr, ov...)
	for i := range 2 {
		if out, code := authSend(t, a, "alice"); code != 0 {
			t.Fatalf("alice's message %d through node A: swaks exit %d\n%s", i, code, out)
		}
	}
	// Node A hands its counts to Redis within a second; node B reads them
	// at alice's first message there.
	waitRedisUsage(t, rds.Addr, "alice", 2)
	if out, code := authSend(t, b, "alice"); code != 0 {
		t.Fatalf("alice's third message, through node B: swaks exit %d\n%s", code, out)
	}
	if out, code := authSend(t, b, "alice"); code == 0 || !strings.Contains(out, overQuota) {
		t.Errorf("alice's fourth message, through node B: swaks exit %d\n%s", code, out)
	}
	waitRedisUsage(t, rds.Addr, "alice", 3)
	// Node A reads the sum back within a second (its metric says when).
	relaytest.Eventually(t, 20*time.Second, "node A reads alice's 3 messages", func() error {
		if v := metricValue(a.metrics(), "greyrelay_user_messages_last_hour", map[string]string{"user": "alice"}); v != 3 {
			return fmt.Errorf("greyrelay_user_messages_last_hour{alice} = %v", v)
		}
		return nil
	})
	if out, code := authSend(t, a, "alice"); code == 0 || !strings.Contains(out, overQuota) {
		t.Errorf("alice's fourth message, through node A: swaks exit %d\n%s", code, out)
	}
	// A restarted node still counts them.
	b.Restart(t)
	if out, code := authSend(t, b, "alice"); code == 0 || !strings.Contains(out, overQuota) {
		t.Errorf("alice's message through node B after its restart: swaks exit %d\n%s", code, out)
	}
	sink.WaitFor(t, 3, 30*time.Second)
}

// waitRedisUsage waits until Redis counts want messages of id.
func waitRedisUsage(t *testing.T, addr, id string, want int64) {
	t.Helper()
	rdb := rsClient(t, addr)
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, err := rdb.HGetAll(t.Context(), "greyrelay:usage:{"+id+"}").Result()
		var sum int64
		for k, v := range m {
			if strings.HasPrefix(k, "m") {
				var n int64
				for _, c := range v {
					n = n*10 + int64(c-'0')
				}
				sum += n
			}
		}
		if err == nil && sum == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis counts %d messages of %s (%v, %v), want %d", sum, id, m, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestUserLimitsSurviveRestart(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte(userLine(t, "alice")), 0o600); err != nil {
		t.Fatal(err)
	}
	r := n.relay("users_file="+users, "trusted_networks=[]", "user_limits.messages_per_hour=3")
	for i := range 3 {
		if out, code := authSend(t, r, "alice"); code != 0 {
			t.Fatalf("alice's message %d: swaks exit %d\n%s", i, code, out)
		}
	}
	r.Restart(t)
	if out, code := authSend(t, r, "alice"); code == 0 || !strings.Contains(out, overQuota) {
		t.Errorf("alice's fourth message, after a restart: swaks exit %d\n%s", code, out)
	}
	sink.WaitFor(t, 3, 30*time.Second)
}
