package queue

import (
	"bytes"

	bolt "go.etcd.io/bbolt"
)

// bPolicies holds the MTA-STS policies of destination domains (RFC 8461
// §5.1: a sender caches policies until their max_age), keyed by lower-case
// domain. The values belong to the caller (relay/tlspolicy); the queue only
// stores them, so they survive a restart with the mail they protect.
var bPolicies = []byte("tlspolicy")

// Policy returns the stored policy value of domain, or nil.
func (q *Queue) Policy(domain string) ([]byte, error) {
	var v []byte
	err := q.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bPolicies); b != nil {
			v = bytes.Clone(b.Get([]byte(domain)))
		}
		return nil
	})
	return v, err
}

// PutPolicy stores the policy value of domain; a nil v deletes it.
func (q *Queue) PutPolicy(domain string, v []byte) error {
	return q.update(func(w *wtx) error {
		if v == nil {
			return w.b(bPolicies).Delete([]byte(domain))
		}
		return w.b(bPolicies).Put([]byte(domain), v)
	})
}

// PolicyDomains lists the domains with a stored policy.
func (q *Queue) PolicyDomains() ([]string, error) {
	var out []string
	err := q.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bPolicies)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	return out, err
}
