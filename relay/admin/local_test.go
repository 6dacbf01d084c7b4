package admin

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// TestLocalRefusesBadQueries: Local validates with the API's own parser
// and reports a query the API answers with 400 as its bad-request error,
// and an unknown message as the queue's typed error (adminclient's
// TestLocalRefusesWhatTheAPIRefuses compares with the HTTP answers).
func TestLocalRefusesBadQueries(t *testing.T) {
	f := newFixture(t)
	l := NewLocal(f.q, "relay.test", nil)
	ctx := context.Background()
	for _, lq := range []ListQuery{{Status: "bogus"}, {Limit: MaxLimit + 1}, {Offset: -1}, {OlderThan: -time.Hour}} {
		_, err := l.List(ctx, lq)
		var br *badRequest
		if !errors.As(err, &br) {
			t.Errorf("List(%+v): %v, want a bad request", lq, err)
		}
	}
	if _, err := l.Message(ctx, "ffff"); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
}
