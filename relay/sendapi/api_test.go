package sendapi

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/configs"
	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/smtpd"
)

// fakeIntake records submissions and answers with err (nil: queued).
type fakeIntake struct {
	mu   sync.Mutex
	subs []smtpd.Submission
	body []string
	err  error
}

func (f *fakeIntake) Submit(s smtpd.Submission) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := new(strings.Builder)
	if s.Body != nil {
		buf := make([]byte, 1<<20)
		for {
			n, err := s.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
	}
	f.subs = append(f.subs, s)
	f.body = append(f.body, b.String())
	if f.err != nil {
		return "", f.err
	}
	return "00000000000000" + string(rune('a'+len(f.subs)%26)) + "1", nil
}

func (f *fakeIntake) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subs)
}

type apiEnv struct {
	srv    *Server
	intake *fakeIntake
	token  string
	now    time.Time
}

func newAPI(t *testing.T, dir string) *apiEnv {
	t.Helper()
	cfg, err := config.Load(config.Source{Default: configs.Default})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Hostname = "relay.test"
	cfg.Queue.Path = filepath.Join(dir, "queue.db")
	cfg.Limits.MaxMessageBytes = 10000
	tok, line, err := smtpd.NewToken("shop", []string{"@shop.example"})
	if err != nil {
		t.Fatal(err)
	}
	users, err := smtpd.ParseTokens(strings.NewReader(line))
	if err != nil {
		t.Fatal(err)
	}
	e := &apiEnv{intake: &fakeIntake{}, token: tok, now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	e.srv, err = New(Options{Config: cfg, Intake: e.intake, Users: users, Now: func() time.Time { return e.now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.srv.idem.close() })
	return e
}

// do sends one request; header pairs follow the body.
func (e *apiEnv) do(t *testing.T, target, contentType, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("POST", target, strings.NewReader(body))
	req.RemoteAddr = "192.0.2.7:4321"
	req.Header.Set("Authorization", "Bearer "+e.token)
	req.Header.Set("Content-Type", contentType)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	w := httptest.NewRecorder()
	e.srv.Handler().ServeHTTP(w, req)
	return w
}

const okJSON = `{"from": "Shop <noreply@shop.example>", "to": ["a@dest.example"], "bcc": ["b@dest.example"], "subject": "Hi", "text": "hello", "tag": "t1"}`

func TestSendRefusals(t *testing.T) {
	e := newAPI(t, t.TempDir())
	const path = "/api/v1/messages"
	for _, tc := range []struct {
		name, target, ct, body string
		header                 []string
		want                   int
		text                   string // in the answer
	}{
		{"no token", path, "application/json", okJSON, []string{"Authorization", ""}, 401, "bearer token"},
		{"unknown token", path, "application/json", okJSON, []string{"Authorization", "Bearer grt_nope"}, 401, "bearer token"},
		{"basic auth", path, "application/json", okJSON, []string{"Authorization", "Basic c2hvcDp4"}, 401, "bearer token"},
		{"content type", path, "text/plain", okJSON, nil, 415, "Content-Type"},
		{"unknown field", path, "application/json", `{"from": "a@shop.example", "to": ["x@y.example"], "tags": "x"}`, nil, 400, "unknown field"},
		{"no recipient", path, "application/json", `{"from": "a@shop.example"}`, nil, 400, "no recipient"},
		{"bad from", path, "application/json", `{"from": "nobody", "to": ["x@y.example"]}`, nil, 400, "from"},
		{"bad to", path, "application/json", `{"from": "a@shop.example", "to": ["x@"]}`, nil, 400, "to"},
		{"reserved header", path, "application/json", `{"from": "a@shop.example", "to": ["x@y.example"], "headers": {"content-type": "text/html"}}`, nil, 400, "written by the API"},
		{"header injection", path, "application/json", `{"from": "a@shop.example", "to": ["x@y.example"], "headers": {"X-A": "1\r\nBcc: z@z.example"}}`, nil, 400, "control character"},
		{"subject injection", path, "application/json", `{"from": "a@shop.example", "to": ["x@y.example"], "subject": "a\nb"}`, nil, 400, "control character"},
		{"bad header name", path, "application/json", `{"from": "a@shop.example", "to": ["x@y.example"], "headers": {"X A": "1"}}`, nil, 400, "header field name"},
		{"attachment without name", path, "application/json", `{"from": "a@shop.example", "to": ["x@y.example"], "attachments": [{"content": "eA=="}]}`, nil, 400, "filename"},
		{"raw without from", path + "?to=x@y.example", "message/rfc822", "Subject: x\r\n\r\nx\r\n", nil, 400, "from"},
		{"raw without to", path + "?from=a@shop.example", "message/rfc822", "Subject: x\r\n\r\nx\r\n", nil, 400, "to"},
		{"raw unknown parameter", path + "?from=a@shop.example&to=x@y.example&notify=never", "message/rfc822", "x\r\n", nil, 400, "notify"},
		{"raw bad ret", path + "?from=a@shop.example&to=x@y.example&ret=ALL", "message/rfc822", "x\r\n", nil, 400, "ret"},
		{"raw too large", path + "?from=a@shop.example&to=x@y.example", "message/rfc822", strings.Repeat("x", 10001), nil, 413, "larger"},
		{"bad key", path, "application/json", okJSON, []string{"Idempotency-Key", strings.Repeat("k", 256)}, 400, "Idempotency-Key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.intake.count()
			w := e.do(t, tc.target, tc.ct, tc.body, tc.header...)
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.text) {
				t.Errorf("%d %s, want %d with %q", w.Code, w.Body, tc.want, tc.text)
			}
			if e.intake.count() != before {
				t.Error("the request reached the intake")
			}
			if tc.want == 401 && w.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
}

// TestSendIntakeRefusals: the intake's SMTP reply becomes the HTTP status,
// and a temporary one is never a 2xx and carries Retry-After.
func TestSendIntakeRefusals(t *testing.T) {
	e := newAPI(t, t.TempDir())
	for _, tc := range []struct {
		err        error
		want       int
		retryAfter bool
	}{
		{&smtp.SMTPError{Code: 553, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "Sender address not allowed"}, 403, false},
		{&smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "No DKIM key"}, 403, false},
		{&smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 10}, Message: "REQUIRETLS needs TLS"}, 403, false},
		{&smtp.SMTPError{Code: 552, EnhancedCode: smtp.EnhancedCode{5, 3, 4}, Message: "too big"}, 413, false},
		{&smtp.SMTPError{Code: 501, EnhancedCode: smtp.EnhancedCode{5, 1, 3}, Message: "bad address"}, 400, false},
		{&smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 5, 3}, Message: "Too many recipients"}, 400, false},
		{&smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Local error"}, 503, true},
		{&smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 3, 2}, Message: "shutting down"}, 503, true},
		{&smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 3, 1}, Message: "Insufficient system storage"}, 507, true},
		{errors.New("disk on fire"), 503, true},
		{&smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 7, 1}, Message: "Sending rate limit reached"}, 429, true},
		{&smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 5, 3}, Message: "Recipient rate limit reached for shop"}, 429, true},
	} {
		e.intake.err = tc.err
		w := e.do(t, "/api/v1/messages", "application/json", okJSON)
		var ans apiError
		json.Unmarshal(w.Body.Bytes(), &ans)
		if w.Code != tc.want || ans.Error == "" || (w.Header().Get("Retry-After") != "") != tc.retryAfter {
			t.Errorf("%v: %d %s (Retry-After %q), want %d", tc.err, w.Code, w.Body, w.Header().Get("Retry-After"), tc.want)
		}
	}
}

func TestSendAccepted(t *testing.T) {
	e := newAPI(t, t.TempDir())
	w := e.do(t, "/api/v1/messages", "application/json; charset=utf-8", okJSON)
	var rc Receipt
	if err := json.Unmarshal(w.Body.Bytes(), &rc); w.Code != 202 || err != nil {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	sub := e.intake.subs[0]
	if sub.User != "shop" || !slices.Equal(sub.Allowed, []string{"@shop.example"}) || sub.From != "noreply@shop.example" ||
		!slices.Equal(sub.To, []string{"a@dest.example", "b@dest.example"}) || sub.Client.String() != "192.0.2.7:4321" {
		t.Errorf("submission %+v", sub)
	}
	if len(rc.Recipients) != 2 || rc.Recipients[1].Address != "b@dest.example" || rc.Recipients[1].QueueID != rc.QueueID ||
		!strings.HasSuffix(rc.MessageID, "@relay.test>") {
		t.Errorf("receipt %+v", rc)
	}
	body := e.intake.body[0]
	for _, want := range []string{"From: \"Shop\" <noreply@shop.example>\r\n", "To: <a@dest.example>\r\n", "Subject: Hi\r\n",
		"X-Greyrelay-Tag: t1\r\n", "Message-ID: " + rc.MessageID + "\r\n", "Date: Fri, 02 Jan 2026 03:04:05 +0000\r\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("message lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "b@dest.example") {
		t.Errorf("the Bcc recipient is in the message:\n%s", body)
	}

	raw := "From: a@shop.example\r\nMessage-ID: <m1@shop.example>\r\n\r\nhi\r\n"
	w = e.do(t, "/api/v1/messages?from=a@shop.example&to=x@y.example&to=z@y.example&envid=E1&ret=hdrs&requiretls=true", "message/rfc822", raw)
	if w.Code != 202 || !strings.Contains(w.Body.String(), "<m1@shop.example>") {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	sub = e.intake.subs[1]
	if sub.From != "a@shop.example" || len(sub.To) != 2 || sub.Mail.EnvelopeID != "E1" || sub.Mail.Return != smtp.DSNReturnHeaders ||
		!sub.Mail.RequireTLS || e.intake.body[1] != raw {
		t.Errorf("raw submission %+v %q", sub, e.intake.body[1])
	}
}

func TestIdempotency(t *testing.T) {
	dir := t.TempDir()
	e := newAPI(t, dir)
	send := func(key, body string) *httptest.ResponseRecorder {
		return e.do(t, "/api/v1/messages", "application/json", body, "Idempotency-Key", key)
	}
	first := send("k1", okJSON)
	again := send("k1", okJSON)
	if first.Code != 202 || again.Code != 202 || again.Header().Get("Idempotent-Replayed") != "true" ||
		first.Body.String() != again.Body.String() || e.intake.count() != 1 {
		t.Fatalf("first %d %s, again %d %s (%d submissions)", first.Code, first.Body, again.Code, again.Body, e.intake.count())
	}
	if w := send("k1", strings.Replace(okJSON, "hello", "other", 1)); w.Code != 422 || e.intake.count() != 1 {
		t.Errorf("the key with another request: %d %s", w.Code, w.Body)
	}
	// Another token's same key is another key.
	if w := send("k2", okJSON); w.Code != 202 || e.intake.count() != 2 {
		t.Errorf("a new key: %d", w.Code)
	}
	// A temporary refusal is forgotten: the retry reaches the intake.
	e.intake.err = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Local error"}
	if w := send("k3", okJSON); w.Code != 503 {
		t.Errorf("k3: %d", w.Code)
	}
	e.intake.err = nil
	if w := send("k3", okJSON); w.Code != 202 || e.intake.count() != 4 {
		t.Errorf("k3 retried: %d (%d submissions)", w.Code, e.intake.count())
	}
	// A permanent refusal is kept.
	e.intake.err = &smtp.SMTPError{Code: 553, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "no"}
	send("k4", okJSON)
	e.intake.err = nil
	if w := send("k4", okJSON); w.Code != 403 || e.intake.count() != 5 {
		t.Errorf("k4 repeated: %d (%d submissions)", w.Code, e.intake.count())
	}
	// In progress in this process: 409.
	if _, err := e.srv.idem.begin(storeKey("shop", "k5"), fingerprint("application/json", "", "shop", []byte(okJSON)), "<m5@x>", e.now, false); err != nil {
		t.Fatal(err)
	}
	if w := send("k5", okJSON); w.Code != 409 || !strings.Contains(w.Body.String(), "in progress") {
		t.Errorf("k5: %d %s", w.Code, w.Body)
	}
	if _, err := e.srv.idem.begin(storeKey("shop", "k6"), fingerprint("application/json", "", "shop", []byte(okJSON)), "<m6@x>", e.now, false); err != nil {
		t.Fatal(err)
	}
	// The answers outlive the process; a key left pending by it is
	// unknown to the next one, which names the Message-ID.
	e.srv.idem.close()
	e2 := newAPI(t, dir)
	e2.token = e.token // the file is the same; the directory is not
	e2.srv.users = e.srv.users
	if w := e2.do(t, "/api/v1/messages", "application/json", okJSON, "Idempotency-Key", "k1"); w.Code != 202 ||
		w.Body.String() != first.Body.String() || e2.intake.count() != 0 {
		t.Errorf("k1 after a restart: %d %s", w.Code, w.Body)
	}
	if w := e2.do(t, "/api/v1/messages", "application/json", okJSON, "Idempotency-Key", "k5"); w.Code != 409 ||
		!strings.Contains(w.Body.String(), "<m5@x>") {
		t.Errorf("k5 after a restart, nothing to look in: %d %s", w.Code, w.Body)
	}
	// With the queue to look in, the interrupted keys are settled: k5's
	// message was queued (its queue id is the answer), k6's was not (it is
	// submitted now, once).
	var asked []string
	e2.srv.find = func(user, messageID string, since time.Time) (string, bool, error) {
		asked = append(asked, user+" "+messageID)
		if since.After(e.now) {
			t.Errorf("looked for messages since %v, after the pending record's %v", since, e.now)
		}
		return "00000000000000aa", messageID == "<m5@x>", nil
	}
	if w := e2.do(t, "/api/v1/messages", "application/json", okJSON, "Idempotency-Key", "k5"); w.Code != 202 ||
		!strings.Contains(w.Body.String(), `"queue_id": "00000000000000aa"`) || e2.intake.count() != 0 {
		t.Errorf("k5 settled from the queue: %d %s (%d submissions)", w.Code, w.Body, e2.intake.count())
	}
	for range 2 {
		if w := e2.do(t, "/api/v1/messages", "application/json", okJSON, "Idempotency-Key", "k6"); w.Code != 202 || e2.intake.count() != 1 {
			t.Errorf("k6, never queued: %d %s (%d submissions)", w.Code, w.Body, e2.intake.count())
		}
	}
	if strings.Join(asked, ",") != "shop <m5@x>,shop <m6@x>" {
		t.Errorf("looked up %q", asked)
	}
	// Keys expire after the TTL and may then be used again.
	e2.now = e2.now.Add(e2.srv.cfg.API.IdempotencyTTL)
	if n, err := e2.srv.idem.prune(e2.now); err != nil || n != 6 {
		t.Errorf("prune: %d, %v; want 6 keys", n, err)
	}
	if w := e2.do(t, "/api/v1/messages", "application/json", okJSON, "Idempotency-Key", "k1"); w.Code != 202 || e2.intake.count() != 2 {
		t.Errorf("k1 after expiry: %d (%d submissions)", w.Code, e2.intake.count())
	}
}

// TestOpenAPIDescribesEveryRoute: docs/openapi.yaml parses, and its paths
// and methods are exactly the API's routes.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	b, err := os.ReadFile("../../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI string                    `yaml:"openapi"`
		Paths   map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi: %q", doc.OpenAPI)
	}
	var described, served []string
	for p, ops := range doc.Paths {
		for m := range ops {
			described = append(described, strings.ToUpper(m)+" "+p)
		}
	}
	for _, r := range (&Server{}).routes() {
		served = append(served, r.method+" "+r.path)
	}
	slices.Sort(described)
	slices.Sort(served)
	if !slices.Equal(described, served) {
		t.Errorf("docs/openapi.yaml describes %q, the API serves %q", described, served)
	}
}
