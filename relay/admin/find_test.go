package admin

import (
	"net/http"
	"strings"
	"testing"

	"github.com/greyrelay/greyrelay/queue"
)

// TestFindByApplicationNames: the API and the status page find a message
// by its tag, ENVID or Message-ID, after delivery too (history).
func TestFindByApplicationNames(t *testing.T) {
	f := newFixture(t)
	m := queue.NewMessage{From: "app@shop.test", Body: []byte("Subject: x\r\n\r\nhi\r\n"), Arrival: t0,
		To: []queue.NewRecipient{{Addr: "a@dest.test", Domain: "dest.test"}}, EnvID: "env-7",
		Tag: "welcome", MessageID: "<w7@shop.test>"}
	id, err := f.q.Enqueue(m)
	if err != nil {
		t.Fatal(err)
	}
	finishKeys(t, f.q, t0, queue.Delivered, "", queue.Reply{Code: 250, Enhanced: "2.0.0", Text: "ok"}, queue.Key{ID: id})
	for _, q := range []string{"tag=welcome", "envid=env-7", "message_id=w7@shop.test", "message_id=%3Cw7@shop.test%3E"} {
		var l ListResult
		f.getJSON(t, "GET", "/api/queue?"+q, http.StatusOK, &l)
		if len(l.Rows) != 1 || l.Rows[0].ID != id.String() || l.Rows[0].Tag != "welcome" ||
			l.Rows[0].MessageID != "<w7@shop.test>" || l.Rows[0].EnvID != "env-7" || l.Rows[0].Finished == nil {
			t.Errorf("%s: %+v", q, l.Rows)
		}
	}
	var l ListResult
	if f.getJSON(t, "GET", "/api/queue?tag=welcome&status=queued", http.StatusOK, &l); len(l.Rows) != 0 {
		t.Errorf("a live status lists the delivered message: %+v", l.Rows)
	}
	var msg Message
	if f.getJSON(t, "GET", "/api/queue/"+id.String(), http.StatusOK, &msg); msg.Tag != "welcome" || msg.MessageID != "<w7@shop.test>" {
		t.Errorf("message %+v", msg)
	}
	for _, tc := range []struct{ q, want string }{
		{"by=tag&q=welcome", "Messages with tag welcome"},
		{"by=message_id&q=w7@shop.test", id.String() + "/0"},
		{"by=envid&q=env-7", "&lt;w7@shop.test&gt;"},
		{"by=tag&q=nothing", "No message, queued or kept in the history, has it."},
		{"by=tag&q=%3Cscript%3E", "Messages with tag &lt;script&gt;"},
	} {
		rec := f.do(t, "GET", "/?"+tc.q)
		if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, tc.want) || strings.Contains(body, "<script") {
			t.Errorf("/?%s: %d, want %q in the page", tc.q, rec.Code, tc.want)
		}
	}
	if body := f.do(t, "GET", "/").Body.String(); strings.Contains(body, `id="found"`) || !strings.Contains(body, `name="q"`) {
		t.Error("the page without a search shows results, or no search form")
	}
}
