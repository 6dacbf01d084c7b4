package integration

// `greyrelay probe`: a delivery attempt that stops before DATA,
// with the relay's own configuration, and an exit status a script can use
// (0 accepted, 1 deferred, 2 refused or unreachable).

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// probeReport is the part of `probe -json` the test reads.
type probeReport struct {
	Target    string `json:"target"`
	Recipient string `json:"recipient"`
	Verdict   string `json:"verdict"`
	Reason    string `json:"reason"`
	ExitCode  int    `json:"exit_code"`
	Paths     []struct {
		Host    string `json:"host"`
		Address string `json:"address"`
		Source  string `json:"source"`
	} `json:"paths"`
}

// TestProbe probes three destinations with the relay's configuration (no
// relay needs to run): a Postfix greylisting with postgrey (exit 1,
// greylisted), a healthy sink (exit 0) and a Postfix that does not know
// the recipient (exit 2). No message may reach any of them: a probe never
// sends DATA.
func TestProbe(t *testing.T) {
	peers.Require(t, "postfix", "postgrey")
	t.Parallel()
	n := newMailNet(t)
	final := peers.StartSink(t, net.JoinHostPort(n.host(""), "0"), peers.SinkOptions{})
	grey := peers.StartPostgrey(t, "", 60*time.Second)
	greyMX := n.postfix("grey.test", peers.PostfixConfig{DeliverTo: final.Addr, Postgrey: grey})
	knownMX := n.postfix("known.test", peers.PostfixConfig{DeliverTo: final.Addr, KnownRecipients: []string{"known@known.test"}})
	okMX := n.sink("ok.test", peers.SinkOptions{})
	ip := n.host("")
	cfg := filepath.Join(t.TempDir(), "greyrelay.yaml")
	if err := os.WriteFile(cfg, []byte(n.relayYAML(ip)), 0o600); err != nil {
		t.Fatal(err)
	}
	probe := func(t *testing.T, target string, wantExit int, wantVerdict string) probeReport {
		t.Helper()
		res := runGreyrelay(t, t.TempDir(), "", nil, "probe", "-config", cfg, "-json", target)
		var rep probeReport
		if err := json.Unmarshal([]byte(res.Stdout), &rep); err != nil {
			t.Fatalf("probe -json %s: not JSON (%v): %s", target, err, res)
		}
		if res.Code != wantExit || rep.Verdict != wantVerdict || rep.ExitCode != wantExit {
			t.Errorf("probe %s: exit %d, verdict %q, exit_code %d; want %d %q\n%s", target, res.Code, rep.Verdict, rep.ExitCode, wantExit, wantVerdict, res)
		}
		for _, p := range rep.Paths {
			if host, _, _ := net.SplitHostPort(p.Source); p.Source != "" && host != ip {
				t.Errorf("probe %s connected from %s, want the pinned %s", target, p.Source, ip)
			}
		}
		return rep
	}

	t.Run("greylisted", func(t *testing.T) {
		rep := probe(t, "user@grey.test", 1, "deferred")
		if rep.Reason != "greylisted" {
			t.Errorf("probe reason %q, want greylisted", rep.Reason)
		}
		log := greyMX.WaitLog(10*time.Second, "NOQUEUE: reject: RCPT from unknown["+ip+"]: 450 4.2.0")
		if !strings.Contains(log, "NOQUEUE: reject: RCPT from unknown["+ip+"]: 450 4.2.0") {
			t.Errorf("Postfix did not greylist the probe from %s:\n%s", ip, log)
		}
		if strings.Contains(log, "data=") || strings.Contains(log, "client=unknown["+ip+"]") || !greyMX.QueueEmpty() {
			t.Errorf("the probe reached DATA or queued a message at Postfix:\n%s", log)
		}
	})

	t.Run("accepted", func(t *testing.T) {
		probe(t, "someone@ok.test", 0, "accepted")
		cmds := okMX.Commands()
		if cmds["RCPT"] != 1 || cmds["DATA"] != 0 || cmds["BDAT"] != 0 || len(okMX.Messages()) != 0 {
			t.Errorf("the sink saw %v and %d messages; want one RCPT and no DATA", cmds, len(okMX.Messages()))
		}
	})

	t.Run("unknown recipient", func(t *testing.T) {
		probe(t, "unknown@known.test", 2, "refused")
		if log := knownMX.WaitLog(10*time.Second, "550 5.1.1 <unknown@known.test>"); !strings.Contains(log, "550 5.1.1 <unknown@known.test>") || strings.Contains(log, "data=") {
			t.Errorf("Postfix should have refused the recipient with 550 5.1.1 and seen no DATA:\n%s", log)
		}
	})

	if c := final.Connections(); c != 0 {
		t.Errorf("the destinations behind Postfix got %d connections: a probe delivered something", c)
	}
}
