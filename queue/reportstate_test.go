package queue

import (
	"path/filepath"
	"testing"
)

// The TLS reporting state survives closing and opening the queue, and a
// nil value deletes it.
func TestReportStatePersists(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	q, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := q.ReportState("counts"); err != nil || v != nil {
		t.Fatalf("empty queue: %q, %v", v, err)
	}
	if err := q.PutReportState("counts", []byte(`[1]`)); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if v, err := q.ReportState("counts"); err != nil || string(v) != "[1]" {
		t.Fatalf("after reopening: %q, %v; want [1]", v, err)
	}
	if err := q.PutReportState("counts", nil); err != nil {
		t.Fatal(err)
	}
	if v, _ := q.ReportState("counts"); v != nil {
		t.Errorf("after deleting: %q", v)
	}
}
