package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

type txtMap map[string][]string

func (m txtMap) LookupTXT(_ context.Context, name string) ([]string, error) { return m[name], nil }

type mailbox struct {
	mu    sync.Mutex
	mails []tlsrpt.Mail
}

func (b *mailbox) EnqueueReport(m tlsrpt.Mail) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mails = append(b.mails, m)
	return nil
}

func (b *mailbox) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.mails)
}

// The background loop sends a day's report once the UTC day is over, and
// not before.
func TestTLSReportsDaily(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		box := &mailbox{}
		r := &tlsReports{agg: tlsrpt.NewAggregator(), log: zap.NewNop(), sender: &tlsrpt.Sender{
			Submitter: tlsrpt.Submitter{Organization: "o", Contact: "c", Host: "relay.test"}, From: "r@relay.test",
			TXT: txtMap{"_smtp._tls.d.test": {"v=TLSRPTv1; rua=mailto:rep@sink.test"}}, Queue: box,
			Rand: strings.NewReader(strings.Repeat("x", 1000))}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.run(ctx)
		start := time.Now().UTC()
		r.agg.Success(tlsrpt.Policy{Type: tlsrpt.TypeNoPolicy, Domain: "d.test"}, start)
		endOfDay := start.Truncate(24 * time.Hour).Add(24 * time.Hour)
		time.Sleep(endOfDay.Sub(start) - time.Minute)
		synctest.Wait()
		if n := box.count(); n != 0 {
			t.Fatalf("%d reports before the day ended", n)
		}
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if n := box.count(); n != 1 {
			t.Fatalf("%d reports an hour after the day ended, want 1", n)
		}
		cancel()
	})
}
