package integration

// The status page as an operator sees it in a browser (Debian's chromium,
// headless), on a relay just started with the default configuration:
// the charts read well after the first outcomes (bars several pixels
// wide, not a line at the edge of six hours) and keep them across a
// restart; neither the page nor a message page scrolls sideways at 1,400
// or 400 px; a queue ID links to its message page, which shows the
// attempts and the last reply explained; the DKIM record `dkim keygen`
// printed is listed with its value as one string.

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
)

func TestStatusPageInBrowser(t *testing.T) {
	peers.Require(t, "swaks", "chromium")
	t.Parallel()
	n := newMailNet(t)
	n.sink("ok.test", peers.SinkOptions{})
	n.sink("grey.test", peers.SinkOptions{Rcpt: func(string, int) *smtp.SMTPError {
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 7, 1},
			Message: "Greylisted <b>for</b> a while, see https://grey.test/why?a=1&b=2"}
	}})
	// A signing key, as `dkim keygen` makes it: the page lists its record.
	keys := t.TempDir()
	keygen := runGreyrelay(t, keys, "", nil, "dkim", "keygen", "-algorithm", "rsa2048", "ok.test", "s1")
	if keygen.Code != 0 {
		t.Fatal(keygen)
	}
	_, value, _ := strings.Cut(keygen.Stdout, "value this one line (no quotes):\n")
	value, _, _ = strings.Cut(value, "\n")
	if !strings.HasPrefix(value, "v=DKIM1; k=rsa; p=") {
		t.Fatalf("keygen prints no one-line value: %s", keygen)
	}
	r := n.relay("dkim.domains={ok.test: {selectors: [{selector: s1, key_file: " + keys + "/ok.test.s1.key}]}}")
	delivered := r.send(peers.SwaksMessage{From: "a@ok.test", To: []string{"x@ok.test"}, Data: message("a@ok.test", "x@ok.test", "delivered one")})
	waiting := r.send(peers.SwaksMessage{From: "a@ok.test", To: []string{"z@grey.test"}, Data: message("a@ok.test", "z@grey.test", "waiting one")})
	r.waitAttempts(delivered, "delivered", 15*time.Second)
	r.waitAttempts(waiting, "deferred", 15*time.Second)

	// A restart keeps the charts: the outcomes were stored in the queue.
	r.Restart(t)
	base := "http://" + r.AdminAddr + "/"
	dom := chromium(t, "--dump-dom", base)
	// (The delivery happened before the restart only; the greylisted
	// recipient may have been tried again since.)
	for _, want := range []string{"Recipients per minute, last hour", "<b>Delivered</b>: 1 ", "<b>Deferred</b>: ",
		`fill="#2e7d32"`, `fill="#ef6c00"`, "the relay started at",
		"<code>s1._domainkey.ok.test</code>", `<dd class="mono">` + value + "</dd>"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page after a restart lacks %q", want)
		}
	}
	for _, bar := range regexp.MustCompile(`<rect x="\d+" y="\d+" width="(\d+)" height="\d+" fill="#`).FindAllStringSubmatch(dom, -1) {
		if w, _ := strconv.Atoi(bar[1]); w < 4 {
			t.Errorf("a bar %s px wide in an hour's chart: %s", bar[1], bar[0])
		}
	}

	// The queue ID links to the message page, which has the history.
	link := `href="message/` + waiting + `#rcpt-0"`
	if !strings.Contains(dom, link) {
		t.Fatalf("the page has no %s", link)
	}
	msg := chromium(t, "--dump-dom", base+"message/"+waiting)
	for _, want := range []string{"z@grey.test", "deferred (greylisted)", `id="rcpt-0"`,
		"451 4.7.1 Greylisted &lt;b&gt;for&lt;/b&gt; a while, see https://grey.test/why?a=1&amp;b=2",
		"<th>Meaning</th>", "<th>What to do</th>", `<table class="history">`, "<td>deferred</td><td>greylisted</td>",
		"Subject: waiting one", "Received: from"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the message page lacks %q", want)
		}
	}
	if strings.Contains(msg, "<b>for</b>") {
		t.Error("the message page renders the remote server's markup")
	}
	if fin := chromium(t, "--dump-dom", base+"message/"+delivered); !strings.Contains(fin, "its content is not kept") ||
		!strings.Contains(fin, "<td>delivered</td>") {
		t.Errorf("the delivered message's page: %s", fin)
	}

	// No sideways scrolling, wide or narrow; and a screenshot of each to
	// look at (GREYRELAY_SCREENSHOT=DIR keeps them).
	for _, width := range []int{1400, 400} {
		for name, path := range map[string]string{"status": "", "message": "message/" + waiting} {
			sw, cw, wide := pageWidth(t, r, path, width)
			if cw > width || cw < width-40 || sw > cw {
				t.Errorf("%s page at %d px: scrollWidth %d, clientWidth %d; too wide: %s", name, width, sw, cw, wide)
			}
			shot := filepath.Join(t.TempDir(), name+".png")
			chromium(t, "--screenshot="+shot, "--window-size="+strconv.Itoa(width)+",2400", "--hide-scrollbars", base+path)
			if name == "status" {
				checkScreenshot(t, shot, map[string]color.RGBA{
					"delivered chart": {0x2e, 0x7d, 0x32, 0xff},
					"deferred chart":  {0xef, 0x6c, 0x00, 0xff},
				})
			}
			if dir := os.Getenv("GREYRELAY_SCREENSHOT"); dir != "" {
				if b, err := os.ReadFile(shot); err == nil {
					_ = os.WriteFile(filepath.Join(dir, name+"-"+strconv.Itoa(width)+".png"), b, 0o644)
				}
			}
		}
	}
}

// pageWidth renders the admin page at path in a frame width px wide and
// returns the document's scrollWidth and clientWidth and the elements
// outside tables that reach past its right edge. The pages allow no
// script (Content-Security-Policy), so a copy of the page with a
// measuring script is rendered from a file: the same HTML and CSS. It is
// framed because headless Chromium does not make a window narrower than
// about 500 px; the copy posts its measure to the frame's parent.
func pageWidth(t *testing.T, r *testRelay, path string, width int) (int, int, string) {
	t.Helper()
	code, page := r.Get(t, "/"+path)
	if code != 200 {
		t.Fatalf("GET /%s: %d %s", path, code, page)
	}
	const measure = `<script>
const d = document.documentElement, cw = d.clientWidth, wide = [];
for (const e of document.querySelectorAll("body *")) {
  const b = e.getBoundingClientRect();
  if (b.right > cw + 0.5 && !e.closest("table")) wide.push(e.tagName + "." + e.className + " " + Math.round(b.right));
}
parent.postMessage(d.scrollWidth + " " + cw + " " + wide.slice(0, 8).join("; "), "*");
</script></body>`
	const frame = `<!doctype html><body style="margin:0"><iframe src="page.html" style="border:0;width:%dpx;height:900px"></iframe>
<div id="out"></div><script>addEventListener("message", e => document.getElementById("out").setAttribute("data-width", e.data));</script></body>`
	dir := t.TempDir()
	page = strings.Replace(page, "</body>", measure, 1)
	if err := os.WriteFile(filepath.Join(dir, "page.html"), []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "frame.html"), []byte(fmt.Sprintf(frame, width)), 0o644); err != nil {
		t.Fatal(err)
	}
	dom := chromium(t, "--dump-dom", "--window-size="+strconv.Itoa(width+100)+",1000", "--virtual-time-budget=3000",
		"--allow-file-access-from-files", "file://"+filepath.Join(dir, "frame.html"))
	m := regexp.MustCompile(`data-width="(\d+) (\d+) ?([^"]*)"`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no measure in the rendered page: %.300s", dom)
	}
	sw, _ := strconv.Atoi(m[1])
	cw, _ := strconv.Atoi(m[2])
	return sw, cw, m[3]
}
