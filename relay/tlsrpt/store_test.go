package tlsrpt

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// memStore is a Store in memory.
type memStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memStore) Get(key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key], nil
}

func (s *memStore) Put(key string, v []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string][]byte{}
	}
	if v == nil {
		delete(s.m, key)
	} else {
		s.m[key] = v
	}
	return nil
}

// Counts saved before a restart are there after it: a new Aggregator
// loading the store reports the same day, failures included, and keeps
// counting on top of them.
func TestAggregatorSaveLoad(t *testing.T) {
	st := &memStore{}
	a := NewAggregator()
	a.Success(sts, day1.Add(time.Hour))
	a.Success(sts, day1.Add(2*time.Hour))
	f := Failure{ResultType: ResultTLSAInvalid, MXHost: "mx.dane.test", ReceivingIP: "192.0.2.1"}
	a.Failure(dane, f, day1.Add(3*time.Hour))
	if err := a.Save(st); err != nil {
		t.Fatal(err)
	}
	b := NewAggregator() // the restarted relay
	if err := b.Load(st); err != nil {
		t.Fatal(err)
	}
	b.Success(sts, day1.Add(5*time.Hour))
	now := day1.Add(25 * time.Hour)
	got := map[string]Counts{}
	for _, d := range b.Take(now, false) {
		for _, c := range d.Counts {
			got[c.Policy.Domain] = c
		}
	}
	if c := got["sts.test"]; c.Success != 3 || !reflect.DeepEqual(c.Policy, sts) {
		t.Errorf("sts.test after restart: %+v, want 3 successes", c)
	}
	if c := got["dane.test"]; c.Failures[f] != 1 || !reflect.DeepEqual(c.Policy, dane) {
		t.Errorf("dane.test after restart: %+v, want the tlsa-invalid failure", c)
	}
	// Take changed the counts: saving again stores what is left (nothing).
	if err := b.Save(st); err != nil {
		t.Fatal(err)
	}
	c := NewAggregator()
	if err := c.Load(st); err != nil || len(c.Take(now, true)) != 0 {
		t.Errorf("after the reports were taken, the store still holds counts (%v)", err)
	}
}

// A report whose https: POST fails is tried again later, with growing
// waits, to that rua only, and dropped a day after its period ended.
func TestDeliverRetries(t *testing.T) {
	var mu sync.Mutex
	fail, posts := 2, 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		posts++
		if fail > 0 {
			fail--
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	box := &fakeQueue{}
	s := &Sender{Submitter: sub, HTTP: srv.Client(), Rand: strings.NewReader(strings.Repeat("r", 1000)), Queue: box, From: "r@relay.test",
		TXT: fakeTXT{"_smtp._tls.sts.test": {"v=TLSRPTv1;rua=mailto:rep@x.test," + srv.URL + "/tlsrpt"}}}
	a := NewAggregator()
	a.Success(sts, day1.Add(time.Hour))
	now := day1.Add(24*time.Hour + time.Minute)
	ctx := context.Background()
	res, owed := s.Deliver(ctx, a.Take(now, false), nil, now)
	if len(res) != 1 || len(res[0].Sent) != 1 || len(owed) != 1 || !reflect.DeepEqual(owed[0].RUAs, []string{srv.URL + "/tlsrpt"}) {
		t.Fatalf("first try: results %+v, owed %+v; want the mail sent and the POST owed", res, owed)
	}
	// Not yet due: nothing is tried.
	if res, owed = s.Deliver(ctx, nil, owed, now.Add(retryFirst-time.Second)); len(res) != 0 || len(owed) != 1 {
		t.Fatalf("before the first wait ended: results %+v, owed %d", res, len(owed))
	}
	now = owed[0].Next
	res, owed = s.Deliver(ctx, nil, owed, now) // the second failure
	if len(owed) != 1 || owed[0].Next.Sub(now) != 2*retryFirst {
		t.Fatalf("second try: results %+v, owed %+v; want a wait of %v", res, owed, 2*retryFirst)
	}
	now = owed[0].Next
	res, owed = s.Deliver(ctx, nil, owed, now)
	if len(res) != 1 || len(res[0].Sent) != 1 || len(owed) != 0 {
		t.Fatalf("third try: results %+v, owed %+v; want the POST sent", res, owed)
	}
	mu.Lock()
	if posts != 3 || len(box.mails) != 1 {
		t.Errorf("%d POSTs and %d mails, want 3 and 1 (the mail is not sent again)", posts, len(box.mails))
	}
	mu.Unlock()

	// A server that never accepts: the report is dropped a day after its
	// period ended.
	mu.Lock()
	fail = 1 << 30
	mu.Unlock()
	a.Success(sts, day1.Add(time.Hour))
	now = day1.Add(24*time.Hour + time.Minute)
	_, owed = s.Deliver(ctx, a.Take(now, false), nil, now)
	tries := 1
	for len(owed) > 0 && tries < 100 {
		now = owed[0].Next
		_, owed = s.Deliver(ctx, nil, owed, now)
		tries++
	}
	if len(owed) != 0 || now.After(day1.Add(48*time.Hour)) {
		t.Errorf("a report never accepted: still owed after %d tries at %v", tries, now)
	}
}

// Owed reports survive in the store.
func TestOwedSaveLoad(t *testing.T) {
	st := &memStore{}
	a := NewAggregator()
	a.Failure(dane, Failure{ResultType: ResultTLSAInvalid, MXHost: "mx.dane.test"}, day1)
	owed := []Owed{{Day: a.Take(day1.Add(25*time.Hour), false)[0], RUAs: []string{"https://r.test/"}, Tries: 2, Next: day1.Add(26 * time.Hour)}}
	if err := SaveOwed(st, owed); err != nil {
		t.Fatal(err)
	}
	got, err := LoadOwed(st)
	if err != nil || !reflect.DeepEqual(got, owed) {
		t.Errorf("LoadOwed = %+v, %v; want %+v", got, err, owed)
	}
	if err := SaveOwed(st, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := LoadOwed(st); got != nil {
		t.Errorf("after saving none: %+v", got)
	}
}

// Stored state that is damaged is refused or read, never a panic; what
// is read can be saved again.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`[{"Domain":"d.test","Start":"2026-12-01T00:00:00Z","End":"2026-12-02T00:00:00Z","Counts":[{"Policy":{"Type":"tlsa","Domain":"d.test"},"Success":2,"Failures":[{"ResultType":"tlsa-invalid","Count":1}]}]}]`))
	f.Add([]byte(`[{"Day":{"Domain":"d.test"},"RUAs":["https://r.test/"],"Tries":1}]`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st := &memStore{m: map[string][]byte{keyCounts: b, keyOwed: b}}
		a := NewAggregator()
		if a.Load(st) == nil {
			if err := a.Save(&memStore{}); err != nil {
				t.Fatal(err)
			}
		}
		if owed, err := LoadOwed(st); err == nil {
			if err := SaveOwed(&memStore{}, owed); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// What no retry can fix is not kept: a domain without a record
// (NXDOMAIN), and a record whose only rua has no address.
func TestDeliverNoRetry(t *testing.T) {
	s := &Sender{Submitter: sub, Rand: strings.NewReader(strings.Repeat("r", 1000)), Queue: &fakeQueue{}, From: "r@relay.test",
		TXT: fakeTXT{"_smtp._tls.sts.test": {"v=TLSRPTv1;rua=mailto:?to=a@b.test"}}}
	a := NewAggregator()
	a.Success(sts, day1.Add(time.Hour))
	a.Success(Policy{Type: TypeNoPolicy, Domain: "none.test"}, day1.Add(time.Hour))
	now := day1.Add(25 * time.Hour)
	res, owed := s.Deliver(context.Background(), a.Take(now, false), nil, now)
	if len(res) != 2 || len(owed) != 0 {
		t.Errorf("results %+v, owed %+v; want two results and nothing owed", res, owed)
	}
}
