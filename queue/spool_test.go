package queue

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// spoolNames lists the body files in q's spool directory.
func spoolNames(t *testing.T, q *Queue) []string {
	t.Helper()
	ents, err := os.ReadDir(q.spoolDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// spooledMsg is msg with its body written to a spool file instead.
func spooledMsg(t *testing.T, q *Queue, body []byte, addrs ...string) NewMessage {
	t.Helper()
	m := msg("a@x.example", addrs...)
	f, err := q.CreateBody()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(body); i += 1000 { // written in pieces, as smtpd does
		if _, err := f.Write(body[i:min(i+1000, len(body))]); err != nil {
			t.Fatal(err)
		}
	}
	m.Body, m.File = nil, f
	return m
}

func TestSpool_EnqueueReadReopenDelete(t *testing.T) {
	q, path := newQ(t)
	body := bytes.Repeat([]byte("0123456789abcdef\r\n"), 20000) // 360 KB
	id := mustEnqueue(t, q, spooledMsg(t, q, body, "r@y.example"))
	if got := mustShow(t, q, id).Size; got != int64(len(body)) {
		t.Errorf("Size = %d, want %d", got, len(body))
	}
	c, err := q.OpenBody(id)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.Bytes(), body) || c.Len() != len(body) {
		t.Errorf("OpenBody: %d octets, differ from what was written", c.Len())
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	q.Close()
	q = openAt(t, path, Options{})
	if b, err := q.Body(id); err != nil || !bytes.Equal(b, body) {
		t.Fatalf("Body after reopen: %d octets, err %v", len(b), err)
	}
	if n := len(spoolNames(t, q)); n != 1 {
		t.Fatalf("spool holds %d files, want 1", n)
	}
	if n, err := q.Delete(Selector{ID: id}); err != nil || n != 1 {
		t.Fatalf("Delete = %d, %v", n, err)
	}
	if names := spoolNames(t, q); len(names) != 0 {
		t.Errorf("spool after delete: %v, want empty", names)
	}
	if _, err := q.OpenBody(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("OpenBody after delete: %v, want ErrNotFound", err)
	}
	checkStats(t, q)
}

func TestSpool_DeliveredMessageLosesItsFile(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, spooledMsg(t, q, []byte("Subject: x\r\n\r\nbig\r\n"), "r@y.example"))
	k := Key{id, 0}
	if err := q.Begin(Start{Keys: []Key{k}, Time: t0, LeaseUntil: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Apply(Update{Results: []Result{{Key: k, Status: Delivered, End: t0}}}); err != nil {
		t.Fatal(err)
	}
	if names := spoolNames(t, q); len(names) != 0 {
		t.Errorf("spool after the last recipient was delivered: %v", names)
	}
}

// A crash between writing a body file and the commit that names it (or
// between a delete's commit and the file's removal) leaves an orphan: the
// next Open removes it, and keeps every file a message still needs.
func TestSpool_OpenRemovesOrphans(t *testing.T) {
	q, path := newQ(t)
	keep := mustEnqueue(t, q, spooledMsg(t, q, []byte("kept\r\n"), "r@y.example"))
	orphan, err := q.CreateBody()
	if err != nil {
		t.Fatal(err)
	}
	orphan.Write([]byte("never enqueued\r\n"))
	other := filepath.Join(q.spoolDir(), "not-ours")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	q.Close()
	q = openAt(t, path, Options{})
	names := spoolNames(t, q)
	if len(names) != 2 || !strings.HasPrefix(names[0], bodyFilePrefix) || names[1] != "not-ours" {
		t.Errorf("spool after reopen: %v, want the kept body and the foreign file", names)
	}
	if b, err := q.Body(keep); err != nil || string(b) != "kept\r\n" {
		t.Errorf("kept body: %q, %v", b, err)
	}
}

func TestSpool_DiscardAndInvalid(t *testing.T) {
	q, _ := newQ(t)
	m := spooledMsg(t, q, []byte("x\r\n"), "r@y.example")
	m.Body = []byte("both")
	if _, err := q.Enqueue(m); !errors.Is(err, ErrInvalid) {
		t.Errorf("Enqueue with Body and File: %v, want ErrInvalid", err)
	}
	if err := m.File.Discard(); err != nil {
		t.Fatal(err)
	}
	if names := spoolNames(t, q); len(names) != 0 {
		t.Errorf("spool after Discard: %v", names)
	}
}

// A spooled message whose file vanished is treated like a missing body:
// quarantined, and reported as not found.
func TestSpool_MissingFile(t *testing.T) {
	q, _ := newQ(t)
	id := mustEnqueue(t, q, spooledMsg(t, q, []byte("x\r\n"), "r@y.example"))
	for _, n := range spoolNames(t, q) {
		os.Remove(filepath.Join(q.spoolDir(), n))
	}
	if _, err := q.OpenBody(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("OpenBody: %v, want ErrNotFound", err)
	}
	if _, err := q.Message(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("the message is still in the queue (%v); want it quarantined", err)
	}
	if st, _ := q.Stats(); st.Messages != 0 || st.Recipients != 0 {
		t.Errorf("Stats after quarantine: %d messages, %d recipients; want none", st.Messages, st.Recipients)
	}
	checkStats(t, q)
}
