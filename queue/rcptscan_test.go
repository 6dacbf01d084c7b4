package queue

import (
	"bytes"
	"reflect"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestShowSkipsMalformedRecipientKey: a recipient record under a message's
// prefix whose key is not a recipient key (here two bytes short) is not
// shown as a recipient, whatever its value; it is quarantined instead.
func TestShowSkipsMalformedRecipientKey(t *testing.T) {
	path := dbPath(t)
	q := openAt(t, path, Options{})
	a := mustEnqueue(t, q, msg("s@x.test", "r1@a.test"))
	q.Close()
	bad := append(idKey(a), 0, 0)
	rot(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket(bRcpts)
		return b.Put(bad, bytes.Clone(b.Get(rcptKey(Key{a, 0}))))
	})
	var ql quarantineLog
	q = openAt(t, path, ql.opt())
	m, err := q.Show(a)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Recipients) != 1 || m.Recipients[0].Key != (Key{a, 0}) {
		t.Errorf("Show = %d recipients %v, want only %v", len(m.Recipients), m.Recipients, Key{a, 0})
	}
	if want := []report{{"rcpts", bad}}; !reflect.DeepEqual(ql.take(), want) {
		t.Errorf("the malformed key was not quarantined")
	}
	q.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bRcpts).Get(bad) != nil {
			t.Errorf("malformed key still in the recipient bucket")
		}
		return nil
	})
}
