package sendapi

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Idempotency keys (the Idempotency-Key header of
// draft-ietf-httpapi-idempotency-key-header): a request repeated with the
// same key is answered with the first answer, and its message is never
// taken twice.
//
// Each key goes through two durable states. Before the message goes to the
// queue the key is written "pending"; once the queue has it, the answer is
// written, and only then is the answer sent. So a client that saw an answer
// gets the same one again, however often it repeats the request and
// whether or not the relay restarted in between. A key still pending is a
// request in progress: its repetition gets 409. A key left pending by a
// process that stopped (a crash between the queue's commit and the
// answer's) is settled by the Message-ID the pending record names: the
// queue (and its history) is asked for a message of that identity with
// it; found, its queue id is the answer; not found, the message never
// reached the queue and the request is carried out now. Only when that
// cannot be told (no Message-ID, no lookup) does the repetition get 409,
// rather than a second copy. A temporary refusal (503, 507, 429) is not
// kept: the client is meant to try again with the same key.
//
// Records live in their own bbolt file next to the queue, for
// idempotency_ttl after their request; a key used again with a different
// request gets 422.

var bucketKeys = []byte("keys")

// record is one key's state, stored as JSON.
type record struct {
	Run         string    `json:"run"`         // the process that wrote it pending
	Fingerprint []byte    `json:"fingerprint"` // SHA-256 of the identity and the request
	Created     time.Time `json:"created"`
	MessageID   string    `json:"message_id,omitempty"`
	Done        bool      `json:"done"`
	Status      int       `json:"status,omitempty"`
	Body        []byte    `json:"body,omitempty"`
}

// idemStore keeps the records.
type idemStore struct {
	db  *bolt.DB
	run string
	ttl time.Duration
}

func openIdem(path string, ttl time.Duration) (*idemStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("idempotency store %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketKeys)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("idempotency store %s: %w", path, err)
	}
	run := make([]byte, 8)
	rand.Read(run)
	return &idemStore{db: db, run: fmt.Sprintf("%x", run), ttl: ttl}, nil
}

func (s *idemStore) close() error { return s.db.Close() }

// errKeyBusy: the key's request is still in progress in this process.
var errKeyBusy = errors.New("a request with this Idempotency-Key is in progress")

// keyConflict is a key whose earlier request cannot be answered again.
type keyConflict struct {
	status int
	msg    string
}

func (e *keyConflict) Error() string { return e.msg }

// interrupted is a key left pending by a process that stopped.
type interrupted struct{ rec record }

func (e *interrupted) Error() string {
	return "an earlier request with this Idempotency-Key was interrupted by a restart; " +
		"whether its message was queued is unknown (look for Message-ID " + e.rec.MessageID + ")"
}

// begin claims key for a request. It returns the stored answer when the
// request was answered before (done), or writes the key pending.
//
// A key left pending by another process is an *interrupted error, unless
// takeOver, which claims it for this request.
func (s *idemStore) begin(key string, fp []byte, messageID string, now time.Time, takeOver bool) (prev *record, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		if v := b.Get([]byte(key)); v != nil {
			var r record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("idempotency record: %w", err)
			}
			if now.Sub(r.Created) < s.ttl {
				switch {
				case !bytes.Equal(r.Fingerprint, fp):
					return &keyConflict{422, "Idempotency-Key was used with a different request"}
				case r.Done:
					prev = &r
					return nil
				case r.Run == s.run:
					return &keyConflict{409, errKeyBusy.Error()}
				}
				if !takeOver {
					return &interrupted{r}
				}
			}
		}
		v, err := json.Marshal(record{Run: s.run, Fingerprint: fp, Created: now, MessageID: messageID})
		if err != nil {
			return err
		}
		return b.Put([]byte(key), v)
	})
	return prev, err
}

// finish stores the answer to key's request (keep), or forgets the key so
// the request may be tried again.
func (s *idemStore) finish(key string, keep bool, status int, body []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		v := b.Get([]byte(key))
		if v == nil {
			return nil
		}
		if !keep {
			return b.Delete([]byte(key))
		}
		var r record
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		r.Done, r.Status, r.Body = true, status, body
		nv, err := json.Marshal(r)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), nv)
	})
}

// prune deletes records older than the TTL; it returns how many.
func (s *idemStore) prune(now time.Time) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		var old [][]byte // a cursor skips records when deleting as it goes
		b.ForEach(func(k, v []byte) error {
			var r record
			if json.Unmarshal(v, &r) != nil || now.Sub(r.Created) >= s.ttl {
				old = append(old, bytes.Clone(k))
			}
			return nil
		})
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		n = len(old)
		return nil
	})
	return n, err
}

// storeKey scopes a client's key to its identity, so two applications
// cannot see or block each other's keys.
func storeKey(user, key string) string {
	b := binary.AppendUvarint(nil, uint64(len(user)))
	return string(b) + user + key
}
