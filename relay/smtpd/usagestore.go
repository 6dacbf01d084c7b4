package smtpd

import (
	"encoding/json"
	"sync"
)

// KV is where StoredUsage keeps the counts: a named store in the queue's
// file (queue.Store).
type KV interface {
	Get(key string) ([]byte, error)
	Put(key string, v []byte) error
}

// StoredUsage is the UsageStore of a node on its own: the counts are kept
// in the queue's file, so that a restart does not reset them.
type StoredUsage struct {
	kv KV
	mu sync.Mutex // read, add, write: one at a time
}

// NewStoredUsage keeps the counts in kv.
func NewStoredUsage(kv KV) *StoredUsage { return &StoredUsage{kv: kv} }

// AddUsage implements UsageStore. A count that cannot be read is taken as
// none; one that cannot be written reports the store away (the counts
// stay pending and are tried again).
func (s *StoredUsage) AddUsage(id string, add map[int64][2]int64, since int64) (map[int64][2]int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := map[int64][2]int64{}
	if b, err := s.kv.Get(id); err == nil && b != nil {
		json.Unmarshal(b, &cur)
	}
	changed := len(add) > 0
	for m, c := range add {
		o := cur[m]
		cur[m] = [2]int64{o[0] + c[0], o[1] + c[1]}
	}
	for m := range cur {
		if m < since {
			delete(cur, m)
			changed = true
		}
	}
	if changed {
		b, err := json.Marshal(cur)
		if err != nil || s.kv.Put(id, b) != nil {
			return nil, false
		}
	}
	out := make(map[int64][2]int64, len(cur))
	for m, c := range cur {
		out[m] = c
	}
	return out, true
}
