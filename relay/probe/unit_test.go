package probe

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/relay/mx"
)

func TestNewReport(t *testing.T) {
	tests := []struct {
		target, sender       string
		recipient, domain    string
		wantSender, errorHas string
	}{
		{target: "user@Example.TEST", recipient: "user@example.test", domain: "example.test"},
		{target: " <User@example.test> ", recipient: "User@example.test", domain: "example.test"},
		{target: "example.test.", recipient: "postmaster@example.test", domain: "example.test"},
		{target: "example.test", sender: "<>", recipient: "postmaster@example.test", domain: "example.test"},
		{target: "example.test", sender: "probe@relay.test", recipient: "postmaster@example.test", domain: "example.test", wantSender: "probe@relay.test"},
		{target: "user@example.test@evil.test", errorHas: "bad address"},
		{target: "user%evil.test@example.test", errorHas: "bad address"},
		{target: "user@[192.0.2.1]", errorHas: "address literals"},
		{target: "192.0.2.1", errorHas: "bad domain"},
		{target: "", errorHas: "bad domain"},
		{target: "example.test", sender: "a@b@c", errorHas: "probe.sender"},
	}
	for _, tc := range tests {
		rep, err := newReport(tc.target, tc.sender)
		if tc.errorHas != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errorHas) {
				t.Errorf("newReport(%q, %q) error %v, want %q", tc.target, tc.sender, err, tc.errorHas)
			}
			continue
		}
		if err != nil || rep.Recipient != tc.recipient || rep.Domain != tc.domain || rep.Sender != tc.wantSender {
			t.Errorf("newReport(%q, %q) = %q %q %q, %v", tc.target, tc.sender, rep.Recipient, rep.Domain, rep.Sender, err)
		}
	}
}

// FuzzNewReport: any target either fails or yields a recipient in the
// domain, with nothing that could break a command line.
func FuzzNewReport(f *testing.F) {
	for _, s := range []string{"user@example.test", "example.test", "<a@b.test>", "a@b@c", "x\r\ny@z.test", "\"q u\"@d.test"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		rep, err := newReport(target, "")
		if err != nil {
			return
		}
		// Angle brackets may only appear inside a quoted local part, where
		// RFC 5321 §4.1.2 allows them and RCPT TO:<"<"@d> stays one path.
		local := strings.TrimSuffix(rep.Recipient, "@"+rep.Domain)
		quoted := len(local) >= 2 && local[0] == '"' && local[len(local)-1] == '"'
		if local == rep.Recipient || strings.ContainsAny(rep.Recipient, "\r\n\x00") ||
			(!quoted && strings.ContainsAny(local, "<>")) || strings.ContainsAny(rep.Domain, "<>") {
			t.Errorf("newReport(%q) = recipient %q domain %q", target, rep.Recipient, rep.Domain)
		}
	})
}

func TestDNSBLName(t *testing.T) {
	tests := []struct{ addr, want string }{
		{"192.0.2.99", "99.2.0.192.bl.test"},
		{"::ffff:127.0.0.2", "2.0.0.127.bl.test"},
		// RFC 5782 §2.4.
		{"2001:db8:1:2:3:4:567:89ab", "b.a.9.8.7.6.5.0.4.0.0.0.3.0.0.0.2.0.0.0.1.0.0.0.8.b.d.0.1.0.0.2.bl.test"},
	}
	for _, tc := range tests {
		if got := dnsblName(netip.MustParseAddr(tc.addr), "bl.test"); got != tc.want {
			t.Errorf("dnsblName(%s) = %s, want %s", tc.addr, got, tc.want)
		}
	}
}

func TestRawReply(t *testing.T) {
	tests := []struct {
		r    smtpvocab.Reply
		want string
	}{
		{smtpvocab.Reply{Code: 250, Text: "mx Hello\nPIPELINING\nSIZE 100"}, "250-mx Hello\n250-PIPELINING\n250 SIZE 100"},
		{smtpvocab.Reply{Code: 450, Enhanced: "4.2.0", Text: "Greylisted"}, "450 4.2.0 Greylisted"},
		{smtpvocab.Reply{Code: 221}, "221"},
	}
	for _, tc := range tests {
		if got := rawReply(&tc.r); got != tc.want {
			t.Errorf("rawReply(%+v) = %q, want %q", tc.r, got, tc.want)
		}
	}
}

func TestMillisJSON(t *testing.T) {
	b, err := json.Marshal(struct{ D Millis }{Millis(1500 * time.Microsecond)})
	if err != nil || string(b) != `{"D":1.500}` {
		t.Fatalf("%s, %v", b, err)
	}
	var back struct{ D Millis }
	if err := json.Unmarshal(b, &back); err != nil || time.Duration(back.D) != 1500*time.Microsecond {
		t.Errorf("%v, %v", back.D, err)
	}
}

// TestWriteText_ControlCharacters: peer text (a reply, a host name from
// DNS, a certificate's names) cannot drive the terminal: C0 and C1
// controls, escape sequences and bidi overrides are printed as '?'.
func TestWriteText_ControlCharacters(t *testing.T) {
	host := "mx\u202egpj.exe\x1b[31m.example.test"
	rep := Report{Target: "example.test", Verdict: Refused, ExitCode: 2, Paths: []PathReport{{
		Host: host, Outcome: Refused,
		Steps: []Step{{Name: "greeting", Reply: "554 \x1b[2J\x1b]0;pwned\x07 go away\u009b \u2067x\u2069\u0085"}},
		TLS:   &TLSInfo{ServerName: host, Subject: "cn\u202e", Issuer: "ca\x1b", VerifiesFor: true},
	}}, Routing: RoutingReport{Kind: mx.KindMX, Hops: []HopReport{{Host: host, Port: 25, Addrs: []string{"192.0.2.1"}}}}}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, r := range out {
		// package unicode's definitions, not safetext's: the check must
		// not share the code it checks.
		if r != '\n' && unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			t.Errorf("%U reached the terminal:\n%q", r, out)
			break
		}
	}
	for _, want := range []string{"554 ?[2J?]0;pwned? go away? ?x??", "mx?gpj.exe?[31m.example.test"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%q", want, out)
		}
	}
}

// TestDecide follows delivery's order over the paths.
func TestDecide(t *testing.T) {
	tests := []struct {
		outcomes []string
		want     string
		exit     int
	}{
		{[]string{Accepted}, Accepted, 0},
		{[]string{Unreachable, Accepted}, Accepted, 0},
		{[]string{Deferred, Refused}, Refused, 2},
		{[]string{Refused, Accepted}, Refused, 2},
		{[]string{Unreachable, Deferred, Unreachable}, Deferred, 1},
		{[]string{Unreachable, Unreachable}, Unreachable, 2},
		{nil, Unreachable, 2},
	}
	for _, tc := range tests {
		rep := &Report{}
		for i, o := range tc.outcomes {
			rep.Paths = append(rep.Paths, PathReport{Outcome: o, Reason: string(rune('a' + i))})
		}
		p := &prober{rep: rep}
		p.decide()
		if rep.Verdict != tc.want || rep.ExitCode != tc.exit {
			t.Errorf("%v: %s %d, want %s %d", tc.outcomes, rep.Verdict, rep.ExitCode, tc.want, tc.exit)
		}
	}
}
