package integration

// users_file empty at start: the relay starts with no users (and offers
// no AUTH), watches the file all the same, and a user added later
// authenticates without a restart or a signal. (An absent users_file is
// refused by the configuration check: a mistyped path must not start a
// relay without its users.)

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

func TestUsersFileEmptyAtStartIsWatched(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	n := newMailNet(t)
	sink := n.sink("dest.test", peers.SinkOptions{})
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := n.relay("users_file="+users, "trusted_networks=[]")
	// With no user, AUTH is not even offered.
	if out, code := authSend(t, r, "dora"); code == 0 || !strings.Contains(out, "Host did not advertise authentication") {
		t.Fatalf("dora before she was added: swaks exit %d\n%s", code, out)
	}
	if err := os.WriteFile(users, []byte(userLine(t, "dora")), 0o600); err != nil {
		t.Fatal(err)
	}
	relaytest.Eventually(t, 20*time.Second, "the users_file change noticed", func() error {
		if !strings.Contains(r.Log(), "file changed: users_file and api.tokens_file reloaded") {
			return fmt.Errorf("no reload logged")
		}
		return nil
	})
	if out, code := authSend(t, r, "dora"); code != 0 {
		t.Errorf("dora after the file changed: swaks exit %d\n%s", code, out)
	}
	sink.WaitFor(t, 1, 30*time.Second)
}
