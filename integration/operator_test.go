package integration

// The operator's view of a message's whole life, through the binary:
// finished messages stay visible to `queue show` and `queue list -status`,
// `queue show -headers|-body` prints a queued message's content (postcat),
// `queue shape` counts the queue by destination and age (qshape), and the
// status page, rendered by a real browser (Debian's chromium, headless),
// shows its charts, the shape, the destinations, the bounces and the
// explanations.

import (
	"bytes"
	"context"
	"fmt"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

func TestOperatorMessageLife(t *testing.T) {
	peers.Require(t, "swaks", "chromium")
	t.Parallel()
	n := newMailNet(t)
	n.sink("ok.test", peers.SinkOptions{})
	n.sink("src.test", peers.SinkOptions{}) // takes the bounce
	n.sink("bad.test", peers.SinkOptions{Rcpt: func(string, int) *smtp.SMTPError {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "No such user here"}
	}})
	n.sink("grey.test", peers.SinkOptions{Rcpt: func(string, int) *smtp.SMTPError {
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 7, 1}, Message: "Greylisted, please try again later"}
	}})
	r := n.relay("retry.greylist_first_retry=10m", "retry.greylist_second_retry=10m")

	send := func(to, subject string) string {
		return r.send(peers.SwaksMessage{From: "a@src.test", To: []string{to}, Data: message("a@src.test", to, subject)})
	}
	delivered := send("x@ok.test", "delivered one")
	bounced := send("y@bad.test", "bounced one")
	waiting := send("z@grey.test", "waiting one")
	r.waitAttempts(delivered, "delivered", 15*time.Second)
	r.waitAttempts(bounced, "failed", 15*time.Second)
	r.waitAttempts(waiting, "deferred", 15*time.Second)

	t.Run("finished messages", func(t *testing.T) {
		relaytest.Eventually(t, 10*time.Second, "the delivered message to leave the queue", func() error {
			if rows := r.rowsOf(delivered); len(rows) > 0 {
				return fmt.Errorf("still queued: %+v", rows)
			}
			return nil
		})

		res := r.cli("queue", "show", delivered)
		for _, want := range []string{"finished", "no longer in the queue", "x@ok.test", "delivered", "250"} {
			if res.Code != 0 || !strings.Contains(res.Stdout, want) {
				t.Errorf("queue show of a delivered message lacks %q: %s", want, res)
			}
		}
		res = r.cli("queue", "show", bounced)
		if res.Code != 0 || !strings.Contains(res.Stdout, "failed (no-such-user)") || !strings.Contains(res.Stdout, "550 5.1.1") {
			t.Errorf("queue show of a bounced message: %s", res)
		}
		res = r.cli("queue", "list", "-status", "delivered")
		if res.Code != 0 || !strings.Contains(res.Stdout, delivered+"/0") {
			t.Errorf("queue list -status delivered: %s", res)
		}
		res = r.cli("queue", "list", "-status", "failed")
		if res.Code != 0 || !strings.Contains(res.Stdout, bounced+"/0") || strings.Contains(res.Stdout, delivered) {
			t.Errorf("queue list -status failed: %s", res)
		}
		res = r.cli("queue", "show", delivered, "-body")
		if res.Code == 0 || !strings.Contains(res.Stderr, "content is not kept") {
			t.Errorf("queue show -body of a finished message: %s", res)
		}
		res = r.cli("queue", "show", "00000000000fffff")
		if res.Code == 0 || !strings.Contains(res.Stderr, "history.retention") {
			t.Errorf("queue show of an unknown message: %s", res)
		}
	})

	t.Run("postcat", func(t *testing.T) {
		res := r.cli("queue", "show", waiting, "-headers") // as docs/operations.md writes it
		if res.Code != 0 || !strings.Contains(res.Stdout, "Subject: waiting one\n") ||
			!strings.Contains(res.Stdout, "Received: from") || strings.Contains(res.Stdout, "\r") {
			t.Errorf("queue show -headers: %s", res)
		}
		res = r.cli("queue", "show", waiting, "-body", "-raw")
		want := withoutTrace(onWire(message("a@src.test", "z@grey.test", "waiting one")))
		if _, body, ok := bytes.Cut(want, []byte("\r\n\r\n")); res.Code != 0 || !ok || res.Stdout != string(body) {
			t.Errorf("queue show -body -raw: %s\nwant body %q", res, body)
		}
		res = r.cli("queue", "show", waiting, "-body", "-max", "5")
		if res.Code != 0 || len(res.Stdout) != 5 || !strings.Contains(res.Stderr, "showed the first 5 of") {
			t.Errorf("queue show -body -max 5: %s", res)
		}
	})

	t.Run("qshape", func(t *testing.T) {
		res := r.cli("queue", "shape")
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if res.Code != 0 || len(lines) != 3 || strings.Join(strings.Fields(lines[2]), " ") != "grey.test 1 1 0 0 0 0 0 0 0 0 0" {
			t.Errorf("queue shape: %s", res)
		}
		res = r.cli("queue", "shape", "-by", "reason")
		if res.Code != 0 || !strings.Contains(res.Stdout, "greylisted") {
			t.Errorf("queue shape -by reason: %s", res)
		}
	})

	t.Run("status page in a browser", func(t *testing.T) {
		url := "http://" + r.AdminAddr + "/"
		dom := chromium(t, "--dump-dom", url)
		for _, want := range []string{
			`id="chart-delivered"`, `id="chart-deferred"`, `id="chart-bounced"`, "<rect ",
			`id="shape"`, "<th>TOTAL</th>", "grey.test",
			`id="destinations"`, `id="bounced"`, "y@bad.test",
			`id="explanations"`, `href="#why-`,
		} {
			if !strings.Contains(dom, want) {
				t.Errorf("the rendered page lacks %q", want)
			}
		}
		shot := filepath.Join(t.TempDir(), "status.png")
		chromium(t, "--screenshot="+shot, "--window-size=1400,2200", "--hide-scrollbars", url)
		checkScreenshot(t, shot, map[string]color.RGBA{
			"delivered chart": {0x2e, 0x7d, 0x32, 0xff},
			"deferred chart":  {0xef, 0x6c, 0x00, 0xff},
			"bounced chart":   {0xc6, 0x28, 0x28, 0xff},
		})
		if dst := os.Getenv("GREYRELAY_SCREENSHOT"); dst != "" { // to look at it
			if b, err := os.ReadFile(shot); err == nil {
				_ = os.WriteFile(dst, b, 0o644)
			}
		}
	})
}

// chromium runs headless chromium with args and returns its stdout.
func chromium(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, "chromium", append(base, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

// checkScreenshot requires a PNG of a rendered page (not blank) that shows
// each of the colours: the page's charts are drawn in them.
func checkScreenshot(t *testing.T, path string, colours map[string]color.RGBA) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	b := img.Bounds()
	if b.Dx() < 380 || b.Dy() < 1000 {
		t.Fatalf("screenshot is %v", b)
	}
	found := map[string]int{}
	dark := 0 // text
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			px := color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), 0xff}
			if px.R < 0x60 && px.G < 0x60 && px.B < 0x60 {
				dark++
			}
			for name, c := range colours {
				if near(px, c) {
					found[name]++
				}
			}
		}
	}
	if dark < 2000 {
		t.Errorf("the screenshot has %d dark pixels: no text rendered?", dark)
	}
	for name := range colours {
		if found[name] == 0 {
			t.Errorf("the screenshot does not show the %s", name)
		}
	}
}

func near(a, b color.RGBA) bool {
	d := func(x, y uint8) int {
		if x > y {
			return int(x - y)
		}
		return int(y - x)
	}
	return d(a.R, b.R) <= 6 && d(a.G, b.G) <= 6 && d(a.B, b.B) <= 6
}
