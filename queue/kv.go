package queue

import (
	"bytes"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Stores: named key/value buckets other packages keep in the queue's file,
// so that what they learned survives a restart with the mail it concerns
// (relay/tlspolicy's MTA-STS policies, relay/tlsrpt's reporting state).
// The queue does not know what the values mean: it stores bytes under
// keys, in a top-level bucket of the store's name, created by its first
// Put. queue/salvage copies every such bucket it can read (IsStoreName).

// ErrReservedStore is the error of every call on a Store whose name is
// one of the queue's own buckets.
var ErrReservedStore = errors.New("queue: store name is one of the queue's own buckets")

// Store is one named bucket of opaque values in the queue's file.
type Store struct {
	q    *Queue
	name []byte
}

// Store returns the store called name. A name the queue uses for its own
// records gives a Store whose every call fails with ErrReservedStore.
func (q *Queue) Store(name string) *Store { return &Store{q: q, name: []byte(name)} }

// IsStoreName reports whether name, a top-level bucket of a queue file,
// belongs to a Store rather than to the queue's own records.
func IsStoreName(name []byte) bool {
	for _, n := range ownBuckets() {
		if bytes.Equal(n, name) {
			return false
		}
	}
	return len(name) > 0
}

// ownBuckets lists every top-level bucket the queue itself writes.
func ownBuckets() [][]byte {
	return append(allBuckets[:len(allBuckets):len(allBuckets)], bOutbox, bSalvaged)
}

func (s *Store) check() error {
	if !IsStoreName(s.name) {
		return fmt.Errorf("%w: %q", ErrReservedStore, s.name)
	}
	return nil
}

// Get returns the value stored under key, or nil.
func (s *Store) Get(key string) ([]byte, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	var v []byte
	err := s.q.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(s.name); b != nil {
			v = bytes.Clone(b.Get([]byte(key)))
		}
		return nil
	})
	return v, err
}

// Put stores v under key; a nil v deletes it.
func (s *Store) Put(key string, v []byte) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.q.update(func(w *wtx) error {
		if v == nil {
			if b := w.b(s.name); b != nil {
				return b.Delete([]byte(key))
			}
			return nil
		}
		b, err := w.tx.CreateBucketIfNotExists(s.name)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), v)
	})
}

// Keys lists the keys with a stored value, in byte order.
func (s *Store) Keys() ([]string, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	var out []string
	err := s.q.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(s.name)
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
