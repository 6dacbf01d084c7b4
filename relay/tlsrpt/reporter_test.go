package tlsrpt_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/tlsrpt"
)

type txtMap map[string][]string

func (m txtMap) LookupTXT(_ context.Context, name string) ([]string, error) { return m[name], nil }

// memStore is a tlsrpt.Store in memory.
type memStore map[string][]byte

func (m memStore) Get(key string) ([]byte, error) { return m[key], nil }
func (m memStore) Put(key string, v []byte) error {
	m[key] = v
	return nil
}

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
		r := &tlsrpt.Reporter{Agg: tlsrpt.NewAggregator(), Log: zap.NewNop(), Store: memStore{}, Now: time.Now, Sender: &tlsrpt.Sender{
			Submitter: tlsrpt.Submitter{Organization: "o", Contact: "c", Host: "relay.test"}, From: "r@relay.test",
			TXT: txtMap{"_smtp._tls.d.test": {"v=TLSRPTv1; rua=mailto:rep@sink.test"}}, Queue: box,
			Rand: strings.NewReader(strings.Repeat("x", 1000))}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.Run(ctx)
		start := time.Now().UTC()
		r.Agg.Success(tlsrpt.Policy{Type: tlsrpt.TypeNoPolicy, Domain: "d.test"}, start)
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

// The day's counts survive a restart: saved to the queue database when
// the relay stops, loaded by the next start, and in the next report.
func TestTLSReportsRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	open := func() *queue.Queue {
		q, err := queue.Open(path, queue.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	box := &mailbox{}
	newReports := func(q *queue.Queue) *tlsrpt.Reporter {
		r := &tlsrpt.Reporter{Agg: tlsrpt.NewAggregator(), Log: zap.NewNop(), Store: q.Store(tlsrpt.StoreName), Now: time.Now, Sender: &tlsrpt.Sender{
			Submitter: tlsrpt.Submitter{Organization: "o", Contact: "c", Host: "relay.test"}, From: "r@relay.test",
			TXT: txtMap{"_smtp._tls.d.test": {"v=TLSRPTv1; rua=mailto:rep@sink.test"}}, Queue: box,
			Rand: strings.NewReader(strings.Repeat("x", 1000))}}
		if err := r.Load(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	q := open()
	r := newReports(q)
	p := tlsrpt.Policy{Type: tlsrpt.TypeNoPolicy, Domain: "d.test"}
	r.Agg.Success(p, time.Now())
	r.Agg.Success(p, time.Now())
	r.Save() // as at shutdown
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q = open()
	defer q.Close()
	r = newReports(q)
	r.Agg.Success(p, time.Now())
	if res := r.Send(context.Background(), true); len(res) != 1 || len(res[0].Sent) != 1 {
		t.Fatalf("send = %+v", res)
	}
	b := box.mails[0].Body
	if !bytes.Contains(b, []byte("application/tlsrpt+gzip")) {
		t.Fatalf("no report attached:\n%s", b)
	}
	if got := successes(t, b); got != 3 {
		t.Errorf("report counts %d successful sessions, want 3 (2 before the restart)", got)
	}
}

// successes decodes a mailed report and returns its successful sessions.
func successes(t *testing.T, mail []byte) int64 {
	t.Helper()
	_, enc, _ := bytes.Cut(mail, []byte("Content-Disposition"))
	_, enc, _ = bytes.Cut(enc, []byte("\r\n\r\n"))
	enc, _, _ = bytes.Cut(enc, []byte("\r\n--"))
	gz, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(string(enc), "\r\n", ""))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	var rep tlsrpt.Report
	if err := json.NewDecoder(zr).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, p := range rep.Policies {
		n += p.Summary.Successful
	}
	return n
}

// A relay upgraded from a greyrelay whose queue kept the reporting state
// itself keeps it: queue/testdata/stores.db was written by that version
// (see the queue's TestStoresReadOldBuckets) with a day of counts for
// example.test (2 sessions, 1 failure) and a report owed to owed.test.
// Both are read back through the queue's store of StoreName.
func TestStateFromOldQueue(t *testing.T) {
	b, err := os.ReadFile("../../queue/testdata/stores.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "q.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	q, err := queue.Open(path, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	st := q.Store(tlsrpt.StoreName)
	a := tlsrpt.NewAggregator()
	if err := a.Load(st); err != nil {
		t.Fatal(err)
	}
	days := a.Take(time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC), false)
	if len(days) != 1 || days[0].Domain != "example.test" || len(days[0].Counts) != 1 ||
		days[0].Counts[0].Success != 2 || days[0].Counts[0].Failed() != 1 {
		t.Errorf("counts of the old queue: %+v, want example.test's day: 2 sessions, 1 failure", days)
	}
	owed, err := tlsrpt.LoadOwed(st)
	if err != nil || len(owed) != 1 || owed[0].Day.Domain != "owed.test" || owed[0].Tries != 1 ||
		len(owed[0].RUAs) != 1 || owed[0].RUAs[0] != "mailto:tlsrpt@owed.test" {
		t.Errorf("reports owed in the old queue: %+v, %v; want one to owed.test", owed, err)
	}
}
