package admincli

import (
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin/admintest"
)

// hostile is text a remote server controls (its reply, the host name its
// DNS gives) that would drive or disguise a terminal if printed raw: a C0
// control, an ANSI escape sequence (ESC, and the C1 CSI U+009B), NEL, an
// OSC title sequence ended by BEL, a right-to-left override and an isolate.
const hostile = "a\x00b \x1b[2J\x1b]0;pwned\x07 \u009b31m \u0085 \u202egpj.exe \u2067x\u2069"

// rawTerminalText reports the first character in out that must not reach
// a terminal raw, or -1. It uses package unicode's definitions, not
// safetext's: the check must not share the code it checks.
func rawTerminalText(out string) rune {
	for _, r := range out {
		if r != '\n' && r != '\t' && unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			return r
		}
	}
	return -1
}

// TestCLIHostileTextNeverRaw: control characters, escape sequences and
// bidi overrides in a reply and in an MX host name are printed by every
// command that shows them (queue list, queue show, destinations, the
// content of a message) as '?' or a space, never raw.
func TestCLIHostileTextNeverRaw(t *testing.T) {
	f, c := cliFixture(t)
	at := admintest.Now.Add(-time.Minute)
	id, err := f.q.Enqueue(queue.NewMessage{From: "a@example.org", Arrival: at, Helo: "helo" + hostile,
		To:   []queue.NewRecipient{{Addr: "x@evil.test", Domain: "evil.test"}},
		Body: []byte("Subject: " + hostile + "\r\n\r\n" + hostile + "\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	key := queue.Key{ID: id}
	reply := queue.Reply{Code: 451, Enhanced: "4.3.0", Text: "try later " + hostile}
	if err := f.q.Begin(queue.Start{Keys: []queue.Key{key}, Time: at, SourceIP: "192.0.2.10", MXHost: "mx" + hostile + ".evil.test",
		MXAddr: "198.51.100.7", LeaseUntil: at.Add(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	_, err = f.q.Apply(queue.Update{
		Results: []queue.Result{{Key: key, Status: queue.Deferred, Reason: "temporary", Reply: reply, Stage: "rcpt",
			End: at.Add(time.Second), NextAttempt: admintest.Now.Add(time.Minute)}},
		Destinations: []queue.Destination{{Domain: "evil.test", LastReply: reply, Updated: at,
			DeadHosts: map[string]time.Time{"mx" + hostile + ".evil.test": admintest.Now.Add(time.Hour)}}}})
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]func() (string, error){
		"queue list": func() (string, error) { return runQueue(c, "list") },
		"queue show": func() (string, error) { return runQueue(c, "show", id.String()) },
		"queue show -headers -body": func() (string, error) {
			return runQueue(c, "show", "-headers", "-body", id.String())
		},
		"destinations": func() (string, error) {
			var out strings.Builder
			err := RunDestinations(nil, c, &out, &out)
			return out.String(), err
		},
		"destinations evil.test": func() (string, error) {
			var out strings.Builder
			err := RunDestinations([]string{"evil.test"}, c, &out, &out)
			return out.String(), err
		},
	}
	for name, run := range runs {
		out, err := run()
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !strings.Contains(out, "gpj.exe") {
			t.Errorf("%s does not show the hostile text at all:\n%s", name, out)
		}
		if r := rawTerminalText(out); r >= 0 {
			t.Errorf("%s printed %U raw:\n%q", name, r, out)
		}
	}
}
