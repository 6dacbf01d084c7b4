package queue

import (
	"fmt"
	"strings"
	"time"
)

// suspendStore is the Store (kv.go) of the destinations the operator
// suspended, keyed by lower-case domain. A suspension is the operator's
// word, not something learned, so it lives apart from the destination
// records: forgetting what was learned about a domain
// (ForgetDestinations) keeps it, and the delivery engine's writes of
// those records never overwrite it; as a store, queue/salvage copies it.
const suspendStore = "suspended"

// Suspension says that the operator stopped delivery to a domain (as
// Postfix's defer_transports or KumoMTA's `kcli suspend` do): its mail
// stays queued, is not attempted, and goes out when the suspension ends.
type Suspension struct {
	Domain string
	Reason string    // the operator's words, shown wherever the suspension is
	Since  time.Time // when it began
	Until  time.Time // when it ends by itself; zero: when the operator resumes
	Node   string    // the node whose operator suspended it ("" on a single node)
}

// Active reports whether s stops delivery at now.
func (s Suspension) Active(now time.Time) bool {
	return s.Domain != "" && (s.Until.IsZero() || now.Before(s.Until))
}

func encodeSuspension(s *Suspension) []byte {
	e := newEnc()
	e.s(s.Domain)
	e.s(s.Reason)
	e.t(s.Since)
	e.t(s.Until)
	e.s(s.Node)
	return e.b
}

func decodeSuspension(b []byte) (Suspension, error) {
	d := newDec(b)
	s := Suspension{Domain: d.s(), Reason: d.s(), Since: d.t(), Until: d.t(), Node: d.s()}
	return s, d.done()
}

func suspendKey(domain string) string {
	return strings.ToLower(strings.TrimSuffix(domain, "."))
}

// Suspend stores s, replacing the domain's earlier suspension.
func (q *Queue) Suspend(s Suspension) error {
	if s.Domain == "" {
		return fmt.Errorf("queue: suspend: %w: no domain", ErrInvalid)
	}
	if err := q.Store(suspendStore).Put(suspendKey(s.Domain), encodeSuspension(&s)); err != nil {
		return fmt.Errorf("queue: suspend %s: %w", s.Domain, err)
	}
	return nil
}

// Resume deletes the suspension of domain and reports whether there was
// one.
func (q *Queue) Resume(domain string) (bool, error) {
	st := q.Store(suspendStore)
	v, err := st.Get(suspendKey(domain))
	if err == nil && v != nil {
		err = st.Put(suspendKey(domain), nil)
	}
	if err != nil {
		return false, fmt.Errorf("queue: resume %s: %w", domain, err)
	}
	return v != nil, nil
}

// Suspensions returns the stored suspensions, in domain order, including
// any whose Until has passed (the caller decides what is over). An
// undecodable record is skipped.
func (q *Queue) Suspensions() ([]Suspension, error) {
	st := q.Store(suspendStore)
	keys, err := st.Keys()
	if err != nil {
		return nil, fmt.Errorf("queue: suspensions: %w", err)
	}
	var out []Suspension
	for _, k := range keys {
		v, err := st.Get(k)
		if err != nil {
			return nil, fmt.Errorf("queue: suspensions: %w", err)
		}
		if s, err := decodeSuspension(v); err == nil && v != nil {
			out = append(out, s)
		}
	}
	return out, nil
}
