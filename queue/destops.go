package queue

import (
	"bytes"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Waiting reports whether any recipient of domain (case-insensitive) other
// than those in except is still live and not held: queued, deferred or in
// flight. It walks the due index, whose values name the domain, without
// decoding a record, so it costs a few bytes compared per live recipient.
// The engine asks it when a destination's last known recipients expire,
// to know whether what it learned about the destination still governs
// mail that is waiting. Like List, it may return what the database holds
// with an *UnsettledError.
func (q *Queue) Waiting(domain string, except []Key) (bool, error) {
	unsettled := q.unsettled(q.settle())
	want := []byte(strings.ToLower(strings.TrimSuffix(domain, ".")))
	skip := make(map[Key]bool, len(except))
	for _, k := range except {
		skip[k] = true
	}
	found := false
	err := q.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bDue).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(v) < 1 || !bytes.Equal(v[1:], want) {
				continue
			}
			if _, key, ok := parseDueKey(k); ok && skip[key] {
				continue
			}
			found = true
			return nil
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("queue: waiting %s: %w", domain, err)
	}
	if found {
		return true, nil // whatever the database lacks cannot change that
	}
	return false, unsettled
}

// ForgetDestinations deletes what is stored about the given domains
// (case-insensitive), or about every destination when all is set, and
// returns how many records it deleted. Like the records' other writes it
// goes through the writer, so it is ordered with Apply.
func (q *Queue) ForgetDestinations(domains []string, all bool) (int, error) {
	n := 0
	err := q.submit(max(len(domains), 1), 0, func(w *wtx) error {
		n = 0
		b := w.b(bDests)
		var keys [][]byte
		if all {
			c := b.Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				keys = append(keys, bytes.Clone(k))
			}
		}
		for _, d := range domains {
			keys = append(keys, destKey(strings.TrimSuffix(d, ".")))
		}
		for _, k := range keys {
			if b.Get(k) == nil {
				continue
			}
			if err := b.Delete(k); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("queue: forget destinations: %w", err)
	}
	return n, nil
}
