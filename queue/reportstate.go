package queue

import (
	"bytes"

	bolt "go.etcd.io/bbolt"
)

// bReports holds the TLS reporting state (RFC 8460): the day's session
// counts and the reports still owed to a rua, under keys the caller
// (relay/tlsrpt) chooses. The queue only stores the values, so a restart
// neither loses the day so far nor forgets a report whose sending failed.
var bReports = []byte("tlsreport")

// ReportState returns the stored TLS reporting value under key, or nil.
func (q *Queue) ReportState(key string) ([]byte, error) {
	var v []byte
	err := q.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bReports); b != nil {
			v = bytes.Clone(b.Get([]byte(key)))
		}
		return nil
	})
	return v, err
}

// PutReportState stores the TLS reporting value under key; a nil v
// deletes it.
func (q *Queue) PutReportState(key string, v []byte) error {
	return q.update(func(w *wtx) error {
		if v == nil {
			return w.b(bReports).Delete([]byte(key))
		}
		return w.b(bReports).Put([]byte(key), v)
	})
}
