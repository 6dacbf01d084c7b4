package admin

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/internal/fulldisk"
)

// On a full disk, where the queue's database cannot take the messages its
// journal accepted, the API's reads answer 200 with what the database
// holds and say how many recipients they lack, and the status page shows
// it; a message the database does not hold answers 503 (it may be on its
// way), and the actions still fail. A file size limit as small as the
// database's two meta pages stands in for the full disk: every commit
// fails with EFBIG, while the journal, already allocated, writes its few
// records below it.
func TestFullDiskReads(t *testing.T) {
	if !fulldisk.RunAlone(t) {
		return
	}
	f := newFixture(t)
	var before ListResult
	f.getJSON(t, "GET", "/api/queue", 200, &before)
	beforeSt, err := f.q.Stats()
	if err != nil {
		t.Fatal(err)
	}
	beforeMsgs := beforeSt.Messages
	restore := fulldisk.Limit(t, uint64(2*os.Getpagesize())) // bbolt's page size
	defer restore()
	id := enqueue(t, f.q, "alice@example.org", testNow, "x@new.test", "y@new.test")

	const wantErr = "file too large"
	var l ListResult
	f.getJSON(t, "GET", "/api/queue", 200, &l)
	if l.Total != before.Total || l.Recipients != 2 || !strings.Contains(l.Error, wantErr) {
		t.Errorf("/api/queue: total %d, unsettled %+v; want %d and 2 recipients, %q", l.Total, l.Unsettled, before.Total, wantErr)
	}
	if note := l.Note("this list"); !strings.HasPrefix(note, "note: 2 recipients accepted and journaled are not in this list yet") {
		t.Errorf("note %q", note)
	}
	var st Stats
	f.getJSON(t, "GET", "/api/stats", 200, &st)
	if st.Unsettled.Recipients != 2 || st.Recipients != before.Total {
		t.Errorf("/api/stats: %d recipients, unsettled %+v; want %d and 2", st.Recipients, st.Unsettled, before.Total)
	}
	var sh Shape
	f.getJSON(t, "GET", "/api/shape", 200, &sh)
	if sh.Unsettled.Recipients != 2 {
		t.Errorf("/api/shape: unsettled %+v, want 2 recipients", sh.Unsettled)
	}
	if rec := f.do(t, "GET", "/"); rec.Code != 200 || !strings.Contains(rec.Body.String(), "2 recipients accepted and journaled") {
		t.Errorf("status page: %d, without the note:\n%s", rec.Code, rec.Body)
	}
	if rec := f.do(t, "GET", "/metrics", "Accept", "text/plain"); rec.Code != 200 ||
		!strings.Contains(rec.Body.String(), "\ngreyrelay_queue_unsettled_recipients 2\n") ||
		!strings.Contains(rec.Body.String(), fmt.Sprintf("\ngreyrelay_queue_messages %d\n", beforeMsgs)) {
		t.Errorf("/metrics on a full disk: %d, without the database's counts and 2 unsettled recipients:\n%s", rec.Code, rec.Body)
	}
	if rec := f.do(t, "GET", "/api/queue/"+id.String()); rec.Code != 503 {
		t.Errorf("the journaled message: %d %s, want 503", rec.Code, rec.Body)
	}
	f.getJSON(t, "GET", "/api/queue/"+f.m1.String(), 200, nil)
	// The actions: not done for want of room, and saying so (507), by
	// selection and by the ID of a message the disk keeps out of the
	// database; never a bare 500.
	for _, path := range []string{"/api/queue/hold?all=1", "/api/queue/retry?all=1", "/api/queue/delete?all=1",
		"/api/queue/" + id.String() + "/delete", "/api/queue/" + f.m1.String() + "/hold"} {
		if rec := f.do(t, "POST", path); rec.Code != http.StatusInsufficientStorage {
			t.Errorf("POST %s on a full disk: %d %s, want 507", path, rec.Code, rec.Body)
		}
	}

	restore()
	rec := f.do(t, "GET", "/api/queue")
	if rec.Code != 200 || strings.Contains(rec.Body.String(), "unsettled") {
		t.Errorf("/api/queue with room again: %d, still unsettled:\n%s", rec.Code, rec.Body)
	}
	f.getJSON(t, "GET", "/api/queue", 200, &l)
	if l.Total != before.Total+2 {
		t.Errorf("/api/queue with room again: total %d, want %d", l.Total, before.Total+2)
	}
}
