package queue

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestFormatStamp checks the format stamp: Open writes it on a new or an
// unstamped (older) database, and refuses, without writing, a database
// stamped by a newer greyrelay.
func TestFormatStamp(t *testing.T) {
	cases := []struct {
		name    string
		stamp   []byte // nil: remove the key, as in a file from before the stamp
		wantErr error
		want    uint64 // the stamp afterwards
	}{
		{"unstamped", nil, nil, formatVersion},
		{"older", binary.BigEndian.AppendUint64(nil, 2), nil, formatVersion},
		{"current", binary.BigEndian.AppendUint64(nil, formatVersion), nil, formatVersion},
		{"newer", binary.BigEndian.AppendUint64(nil, formatVersion+1), ErrNewerFormat, formatVersion + 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := dbPath(t)
			q := openAt(t, path, Options{})
			id := mustEnqueue(t, q, msg("s@x.test", "r@a.test"))
			q.Close()
			poke(t, path, func(tx *bolt.Tx) error {
				if tc.stamp == nil {
					return tx.Bucket(bJournal).Delete(keyFormat)
				}
				return tx.Bucket(bJournal).Put(keyFormat, tc.stamp)
			})
			q2, err := Open(path, Options{LockTimeout: time.Second})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Open = %v, want %v", err, tc.wantErr)
			}
			if err == nil {
				mustShow(t, q2, id)
				checkStats(t, q2)
				q2.Close()
			}
			var got uint64
			poke(t, path, func(tx *bolt.Tx) error { got = storedFormat(tx); return nil })
			if got != tc.want {
				t.Errorf("stamp after Open = %d, want %d", got, tc.want)
			}
		})
	}
}
