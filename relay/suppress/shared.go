package suppress

import (
	"bytes"
	"encoding/json"

	bolt "go.etcd.io/bbolt"
)

// Sharing the list across a cluster.
//
// The shared store (Redis) holds every entry, keyed as the local file
// keys them, and a log of changes (an entry put or removed) with ordered
// IDs. Each node keeps its whole list in its own file, so that Check never
// waits for the network and the list keeps working while the store is
// away, and follows the log:
//
//   - A change made here is written to the file with a pending mark in
//     the same transaction, then published (the entry, or its removal);
//     the mark goes when the store took it. Marks left while the store
//     was away are published at the next Sync.
//   - Sync (every few seconds) applies the log's changes after the last
//     one it applied. Keys still pending here keep their local value: this
//     node's change is newer and will reach the others.
//   - When the log no longer holds the last change applied (it is
//     trimmed), the node reads every shared entry and takes that set as
//     its own: entries it has that the store lacks were removed elsewhere.
//   - The shared list has an epoch, a random name the first node to find
//     none sets. A Redis that restarted empty has a new one; the node then
//     publishes every entry it has (the union of the nodes' lists is the
//     list again) instead of deleting them.
//
// Expiry needs no change: each entry carries its end, and every node
// prunes by it.

// Shared is the store the nodes of a cluster share the list through
// (relay/cluster implements it over Redis). Every method returns quickly
// and reports false while the store is away.
type Shared interface {
	// PublishSuppression stores v under key (v nil: removes key) and
	// logs the change.
	PublishSuppression(key string, v []byte) bool
	// SuppressionChanges returns the changes logged after after.
	SuppressionChanges(after string) (Changes, bool)
	// SuppressionSnapshot returns every shared entry.
	SuppressionSnapshot() (Snapshot, bool)
	// ForgetSuppression removes key if its value is still v, without
	// logging a change (an expired entry).
	ForgetSuppression(key string, v []byte) bool
}

// Change is one logged change: Value nil is a removal. ID is its place
// in the shared store's log.
type Change struct {
	ID    string
	Key   string
	Value []byte
}

// Changes is what SuppressionChanges returns.
type Changes struct {
	Epoch string
	// Gap: the log no longer holds after; read a Snapshot.
	Gap  bool
	Last string // the last change's ID (after, if there is none)
	List []Change
}

// Snapshot is every shared entry, as of the log's change Last.
type Snapshot struct {
	Epoch, Last string
	Entries     map[string][]byte
}

var (
	metaEpoch = []byte("epoch")
	metaAfter = []byte("after")
)

// markPending marks k changed here when err is nil; it returns err.
func (l *List) markPending(tx *bolt.Tx, k []byte, err error) error {
	if err != nil || l.opt.Shared == nil {
		return err
	}
	return tx.Bucket(pending).Put(k, []byte{1})
}

// publish hands key's local value (or its absence) to the shared store
// and clears its pending mark when the store took it.
func (l *List) publish(k []byte) bool {
	if l.opt.Shared == nil {
		return true
	}
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	return l.publishLocked(k)
}

func (l *List) publishLocked(k []byte) bool {
	var v []byte
	l.db.View(func(tx *bolt.Tx) error {
		v = bytes.Clone(tx.Bucket(bucket).Get(k))
		return nil
	})
	ok := l.opt.Shared.PublishSuppression(string(k), v)
	l.db.Update(func(tx *bolt.Tx) error {
		if ok {
			return tx.Bucket(pending).Delete(k)
		}
		return tx.Bucket(pending).Put(k, []byte{1})
	})
	return ok
}

// Sync brings the list and the shared store together once: it publishes
// what is pending here and applies what changed elsewhere. It does nothing
// without a shared store, and stops at the first call the store does not
// answer (the next Sync goes on).
func (l *List) Sync() error {
	if l.opt.Shared == nil {
		return nil
	}
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	var keys [][]byte
	var epoch, after string
	l.db.View(func(tx *bolt.Tx) error {
		tx.Bucket(pending).ForEach(func(k, _ []byte) error {
			keys = append(keys, bytes.Clone(k))
			return nil
		})
		m := tx.Bucket(meta)
		epoch, after = string(m.Get(metaEpoch)), string(m.Get(metaAfter))
		return nil
	})
	for _, k := range keys {
		if !l.publishLocked(k) {
			return nil
		}
	}
	ch, ok := l.opt.Shared.SuppressionChanges(after)
	switch {
	case !ok:
		return nil
	case ch.Epoch != epoch || after == "":
		return l.adopt(true)
	case ch.Gap:
		return l.adopt(false)
	}
	return l.db.Update(func(tx *bolt.Tx) error {
		b, p := tx.Bucket(bucket), tx.Bucket(pending)
		for _, c := range ch.List {
			k := []byte(c.Key)
			if p.Get(k) != nil {
				continue
			}
			if err := applyOne(b, k, c.Value); err != nil {
				return err
			}
		}
		return tx.Bucket(meta).Put(metaAfter, []byte(ch.Last))
	})
}

// applyOne stores v under k, or deletes k for nil; a value that is no
// entry is left out.
func applyOne(b *bolt.Bucket, k, v []byte) error {
	if v == nil {
		return b.Delete(k)
	}
	var e Entry
	if json.Unmarshal(v, &e) != nil || e.Address == "" {
		return nil
	}
	return b.Put(k, v)
}

// adopt takes the store's whole list. With merge (a new epoch: the store
// lost its state, or this node never synced) it first publishes every
// entry the store lacks and deletes nothing; without, entries the store
// lacks were removed elsewhere and go.
func (l *List) adopt(merge bool) error {
	snap, ok := l.opt.Shared.SuppressionSnapshot()
	if !ok {
		return nil
	}
	if merge {
		var mine map[string][]byte
		l.db.View(func(tx *bolt.Tx) error {
			mine = map[string][]byte{}
			return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
				mine[string(k)] = bytes.Clone(v)
				return nil
			})
		})
		for k, v := range mine {
			if _, there := snap.Entries[k]; there {
				continue
			}
			if !l.opt.Shared.PublishSuppression(k, v) {
				return nil
			}
		}
	}
	return l.db.Update(func(tx *bolt.Tx) error {
		b, p := tx.Bucket(bucket), tx.Bucket(pending)
		if !merge {
			var gone [][]byte
			b.ForEach(func(k, _ []byte) error {
				if _, there := snap.Entries[string(k)]; !there && p.Get(k) == nil {
					gone = append(gone, bytes.Clone(k))
				}
				return nil
			})
			for _, k := range gone {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
		}
		for k, v := range snap.Entries {
			if p.Get([]byte(k)) == nil {
				if err := applyOne(b, []byte(k), v); err != nil {
					return err
				}
			}
		}
		m := tx.Bucket(meta)
		if err := m.Put(metaEpoch, []byte(snap.Epoch)); err != nil {
			return err
		}
		return m.Put(metaAfter, []byte(snap.Last))
	})
}
