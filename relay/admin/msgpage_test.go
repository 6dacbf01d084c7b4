package admin

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dkim"
)

// Every queue ID on the status page links to its message page, relative
// to the page (so that a reverse proxy's path prefix is kept).
func TestStatusPageLinksMessages(t *testing.T) {
	f := newFixture(t)
	body := f.do(t, "GET", "/").Body.String()
	for _, k := range []queue.Key{{ID: f.m1}, {ID: f.m1, Rcpt: 1}, {ID: f.m2}, {ID: f.m3}, {ID: f.m4}} {
		want := `<a href="message/` + k.ID.String() + `#rcpt-` + string(rune('0'+k.Rcpt)) + `">` + k.String() + `</a>`
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks %s", want)
		}
	}
}

// The message page shows the envelope, each recipient with its attempts
// and its last reply explained, and the header section; what a client or
// a remote server wrote is escaped and stripped of control characters;
// it offers no action (a GET must not change the queue: no form, no link
// to an action).
func TestMessagePage(t *testing.T) {
	f := newFixture(t)
	rec := f.do(t, "GET", "/message/"+f.m1.String())
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/html; charset=utf-8" ||
		!strings.HasPrefix(rec.Header().Get("Content-Security-Policy"), "default-src 'none'") {
		t.Fatalf("GET /message/%s: %d %v", f.m1, rec.Code, rec.Header())
	}
	body := rec.Body.String()
	for _, want := range []string{
		"alice@example.org", "client.test", `id="rcpt-0"`, `id="rcpt-1"`, "bob@greylist.test", "carol@greylist.test",
		"deferred (greylisted)", "Greylisted &lt;script&gt;alert(1)&lt;/script&gt;, try again in 300 seconds",
		"<th>Meaning</th>", "mx.peer.test", "192.0.2.10", testNow.Add(-time.Hour).UTC().Format("2006-01-02 15:04:05"),
		`<pre class="headers mono">Subject: x</pre>`, `href="../"`, "greyrelay queue retry|hold|release|bounce|delete " + f.m1.String(),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("message page lacks %q", want)
		}
	}
	for _, bad := range []string{"<script>", "<form", "/retry\"", "/delete\"", "/hold\"", "/bounce\""} {
		if strings.Contains(body, bad) {
			t.Errorf("message page has %q", bad)
		}
	}
	// A remote server's control characters (M2's reply has ESC) are not
	// passed to the browser.
	if body := f.do(t, "GET", "/message/"+f.m2.String()).Body.String(); strings.Contains(body, "\x1b") ||
		!strings.Contains(body, "Too many connections  [31mfrom you") {
		t.Errorf("M2's reply on its page: %q", body[strings.Index(body, "Last reply"):][:200])
	}
	if c := f.do(t, "POST", "/message/"+f.m1.String()).Code; c != http.StatusMethodNotAllowed {
		t.Errorf("POST /message/ID: %d, want 405", c)
	}
}

// Headers from the client are escaped; a finished message says its
// content is gone; an unknown or malformed id is 404 or 400.
func TestMessagePageEdges(t *testing.T) {
	f := newFixture(t)
	id, err := f.q.Enqueue(queue.NewMessage{From: "x@example.org", Arrival: testNow,
		Body: []byte("Subject: <img src=x onerror=alert(1)>\r\nX-Evil: a\x1b]8;;b\r\n\r\nhi\r\n"),
		To:   []queue.NewRecipient{{Addr: "y@example.net", Domain: "example.net"}}})
	if err != nil {
		t.Fatal(err)
	}
	body := f.do(t, "GET", "/message/"+id.String()).Body.String()
	if strings.Contains(body, "<img") || !strings.Contains(body, "Subject: &lt;img src=x onerror=alert(1)&gt;") ||
		strings.Contains(body, "\x1b") || !strings.Contains(body, "No attempt yet.") {
		t.Errorf("hostile headers: %s", body)
	}
	finishKeys(t, f.q, testNow.Add(-time.Minute), queue.Delivered, "", queue.Reply{Code: 250, Text: "ok"}, queue.Key{ID: f.m3})
	body = f.do(t, "GET", "/message/"+f.m3.String()).Body.String()
	if !strings.Contains(body, "its content is not kept") || !strings.Contains(body, "<th>Finished</th>") ||
		strings.Contains(body, "queue retry") {
		t.Errorf("finished message page: %s", body)
	}
	for target, want := range map[string]int{"/message/ffffffffff": http.StatusNotFound, "/message/nope": http.StatusBadRequest} {
		if c := f.do(t, "GET", target).Code; c != want {
			t.Errorf("GET %s: %d, want %d", target, c, want)
		}
	}
}

// The status page lists the signing keys' records, each TXT value as one
// string (what a DNS provider's web form takes), and no section without
// keys.
func TestStatusPageDKIMRecords(t *testing.T) {
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keys := dkim.NewKeys([]dkim.Selector{{Domain: "Example.COM.", Name: "ed1", Key: ed},
		{Domain: "a.example", Name: "rsa1", Key: rsaKey}}, false)
	f := newFixture(t, func(o *Options) { o.DKIM = dkim.NewSigner(keys) })
	body := f.do(t, "GET", "/").Body.String()
	edAt := strings.Index(body, "<code>ed1._domainkey.example.com</code>")
	rsaAt := strings.Index(body, "<code>rsa1._domainkey.a.example</code>")
	if edAt < 0 || rsaAt < 0 || rsaAt > edAt {
		t.Errorf("records not listed by domain: ed %d, rsa %d", edAt, rsaAt)
	}
	for _, k := range []crypto.Signer{ed, rsaKey} {
		want := `<dd class="mono">` + strings.ReplaceAll(dkim.Record(k.Public()), "+", "&#43;") + "</dd>"
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks the one-string value %s", want)
		}
	}
	if body := newFixture(t).do(t, "GET", "/").Body.String(); strings.Contains(body, `id="dkim"`) {
		t.Error("a DKIM section without keys")
	}
}
