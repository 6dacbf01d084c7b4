package queue

import (
	"bytes"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Destination records are keyed by the lower-cased domain. They are written
// only through Apply (in the same transaction as the outcomes that taught
// the caller something) and replaced whole: the caller computes them.

func destKey(domain string) []byte { return []byte(strings.ToLower(domain)) }

func (w *wtx) putDestination(d *Destination) error {
	return w.b(bDests).Put(destKey(d.Domain), encodeDestination(d))
}

// Destination returns what is stored for domain (case-insensitive); ok is
// false if nothing is. An undecodable record is quarantined and reported as
// absent, so the caller starts afresh instead of failing.
func (q *Queue) Destination(domain string) (d Destination, ok bool, err error) {
	var ps []problem
	err = q.view(func(tx *bolt.Tx) error {
		k := destKey(domain)
		v := tx.Bucket(bDests).Get(k)
		if v == nil {
			return nil
		}
		x, derr := decodeDestination(v)
		if derr != nil {
			ps = append(ps, problem{corruptRecord, bDests, k, derr})
			return nil
		}
		d, ok = x, true
		return nil
	})
	q.fixup(ps)
	if err != nil {
		return Destination{}, false, fmt.Errorf("queue: destination %s: %w", domain, err)
	}
	return d, ok, nil
}

// Destinations returns every stored destination, ordered by domain.
func (q *Queue) Destinations() ([]Destination, error) {
	var out []Destination
	var ps []problem
	err := q.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bDests).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			x, derr := decodeDestination(v)
			if derr != nil {
				ps = append(ps, problem{corruptRecord, bDests, bytes.Clone(k), derr})
				continue
			}
			out = append(out, x)
		}
		return nil
	})
	q.fixup(ps)
	if err != nil {
		return nil, fmt.Errorf("queue: destinations: %w", err)
	}
	return out, nil
}
