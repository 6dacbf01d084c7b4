package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseDiskstats(t *testing.T) {
	text := "   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n" +
		" 254       0 vda 91768 13068 3161274 25993 148794 84166 7732040 73118 0 17488 103934 51204 31 4405088 3312 37431 1510\n" +
		"   8       1 sda1 10 0 80 1 42 0 336 7 0 8 8\n"
	tests := []struct {
		name         string
		major, minor uint32
		want         diskFlushes
		wantErr      bool
	}{
		{"flush field present", 254, 0, diskFlushes{Name: "vda", Flushes: 37431, Writes: 148794, HasFlushField: true}, false},
		{"old kernel: writes stand in", 8, 1, diskFlushes{Name: "sda1", Flushes: 42, Writes: 42}, false},
		{"unknown device", 9, 9, diskFlushes{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseDiskstats(text, tc.major, tc.minor)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseStatCPU(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		want    float64
		wantErr bool
	}{
		// utime 150, stime 50, cutime 200, cstime 100 ticks = 5 s.
		{"name with spaces and parens", "1234 (smtpd (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 150 50 200 100 20 0 1 0 1000 1000 100", 5, false},
		{"truncated", "1234 (x) S 1 2 3", 0, true},
		{"no name", "garbage", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU(tc.line)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %v, %v; want %v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestNewMessageSize(t *testing.T) {
	for _, size := range []int{300, 1024, 4096, 4097, 4098, 100 << 10} {
		m := newMessage(size)
		h := m.header(1234567, "rcpt@dest.test")
		if got := len(h) + len(m.body); got != size {
			t.Errorf("size %d: message is %d bytes", size, got)
		}
		if !bytes.HasSuffix(m.body, []byte("\r\n")) || bytes.Contains(m.body, []byte("\n.")) || bytes.Contains(bytes.ReplaceAll(m.body, []byte("\r\n"), nil), []byte("\n")) {
			t.Errorf("size %d: body is not dot-safe CRLF text", size)
		}
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	tests := []struct {
		p    float64
		want time.Duration
	}{{50, 50}, {99, 99}, {100, 100}, {0, 1}}
	for _, tc := range tests {
		if got := percentile(d, tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 99); got != 0 {
		t.Errorf("empty: %v", got)
	}
}

func TestPerfLine(t *testing.T) {
	tests := []struct {
		line    string
		ok      bool
		pct     float64
		pkg     string
		wantSym string
	}{
		{"     5.13%  [.] runtime.tryDeferToSpanScan                 -      -            ", true, 5.13, "runtime", "runtime.tryDeferToSpanScan"},
		{"  40.00%   1.80%  [.] go.etcd.io/bbolt.(*Cursor).nsearch  -  -", true, 40, "go.etcd.io/bbolt", "go.etcd.io/bbolt.(*Cursor).nsearch"},
		{"     2.95%  [k] _raw_spin_unlock_irqrestore", true, 2.95, "kernel", "_raw_spin_unlock_irqrestore"},
		{"     1.00%  [.] github.com/greyrelay/greyrelay/queue.(*Queue).Due.func1", true, 1, "github.com/greyrelay/greyrelay/queue", "github.com/greyrelay/greyrelay/queue.(*Queue).Due.func1"},
		{"# Overhead  Symbol", false, 0, "", ""},
		{"", false, 0, "", ""},
	}
	for _, tc := range tests {
		s, ok := parsePerfLine(tc.line)
		if ok != tc.ok {
			t.Errorf("%q: ok %v", tc.line, ok)
			continue
		}
		if ok && (s.pct != tc.pct || pkgOf(s) != tc.pkg || s.sym != tc.wantSym) {
			t.Errorf("%q: got %+v (package %q)", tc.line, s, pkgOf(s))
		}
	}
}

func TestParseTraceSummary(t *testing.T) {
	out := ` greyrelay (21035), 42612 events, 23.6%

   syscall            calls  errors  total       min       avg       max       stddev
                                     (msec)    (msec)    (msec)    (msec)        (%)
   --------------- --------  ------ -------- --------- --------- ---------     ------
   fdatasync            884      0   361.173     0.079     0.409     4.679      3.83%

 greyrelay (21037), 46154 events, 25.5%
   fdatasync            915      0   391.907     0.081     0.428     4.358      3.95%
   fsync                  1      0     0.157     0.157     0.157     0.157      0.00%
`
	got, err := parseTraceSummary(out)
	if err != nil || got.calls != 1800 || got.msec < 753.23 || got.msec > 753.24 {
		t.Fatalf("got %+v, %v", got, err)
	}
	if _, err := parseTraceSummary("no samples\n"); err == nil {
		t.Fatal("no error for output without fdatasync lines")
	}
}

func TestSetPath(t *testing.T) {
	c := map[string]any{"delivery": map[string]any{"routes": "x"}}
	for _, kv := range []string{"delivery.max_per_destination=20", "log.level=warn", "retry.delay_warnings=[1h, 2h]"} {
		if err := setPath(c, kv); err != nil {
			t.Fatal(err)
		}
	}
	d := c["delivery"].(map[string]any)
	if d["max_per_destination"] != 20 || d["routes"] != "x" {
		t.Errorf("delivery: %v", d)
	}
	if c["log"].(map[string]any)["level"] != "warn" {
		t.Errorf("log: %v", c["log"])
	}
	if w, ok := c["retry"].(map[string]any)["delay_warnings"].([]any); !ok || len(w) != 2 {
		t.Errorf("retry: %v", c["retry"])
	}
}

func TestCPUTimes(t *testing.T) {
	a, err := cpuTimes()
	if err != nil {
		t.Fatal(err)
	}
	if a.total == 0 || a.idle > a.total {
		t.Errorf("cpuTimes = %+v", a)
	}
}

func TestPostfixToolCounters(t *testing.T) {
	sinkLines := []struct {
		line string
		want int64
		ok   bool
	}{
		{"sess=0 quit=0 mesg=1", 1, true},
		{"sess=12 quit=3 mesg=20500", 20500, true},
		{"sess=1 quit=1", 0, false},
		{"sess=1 quit=1 mesg=x", 0, false},
	}
	for _, tc := range sinkLines {
		if n, ok := msgCount(tc.line); n != tc.want || ok != tc.ok {
			t.Errorf("msgCount(%q) = %d, %v; want %d, %v", tc.line, n, ok, tc.want, tc.ok)
		}
	}
	sources := []struct {
		out  string
		want int
	}{
		{"1\r2\r3\r4\r5\r\n", 5},
		{"", 0},
		{"1\r2\rsmtp-source: fatal: lost connection\n", 2},
	}
	for _, tc := range sources {
		if n := lastCount([]byte(tc.out)); n != tc.want {
			t.Errorf("lastCount(%q) = %d, want %d", tc.out, n, tc.want)
		}
	}
}

func TestParsePerfStat(t *testing.T) {
	text := "# started\n836,,raw_syscalls:sys_enter,60607861,100.00,,\n30,,context-switches,60607861,100.00,,\n"
	c, err := parsePerfStat(text)
	if err != nil || c != (perfCounts{Syscalls: 836, Switches: 30}) {
		t.Fatalf("got %+v, %v", c, err)
	}
	if _, err := parsePerfStat("<not counted>,,raw_syscalls:sys_enter,0,100.00,,\n"); err == nil {
		t.Fatal("no counts: want an error")
	}
}

func TestCgroup2Mount(t *testing.T) {
	tests := []struct {
		name, mounts, want string
		wantErr            bool
	}{
		{"hybrid", "cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n", "/sys/fs/cgroup/unified", false},
		{"unified", "sysfs /sys sysfs rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n", "/sys/fs/cgroup", false},
		{"v1 only", "cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cgroup2Mount(tc.mounts)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("got %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseCPUStat(t *testing.T) {
	us, err := parseCPUStat("usage_usec 2154864\nuser_usec 100\nsystem_usec 2154764\nnice_usec 0\n")
	if err != nil || us != 2154864 {
		t.Fatalf("got %d, %v", us, err)
	}
	if _, err := parseCPUStat("user_usec 1\n"); err == nil {
		t.Fatal("no usage_usec: want an error")
	}
}

func TestPerfArgs(t *testing.T) {
	got := strings.Join(perfArgs("greyrelay-bench-1/003-exim", nil), " ")
	events := "raw_syscalls:sys_enter,context-switches,syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync," +
		"syscalls:sys_enter_read,syscalls:sys_enter_readv,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg," +
		"syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg"
	want := "stat -x, -e " + events + " -a -G " + strings.TrimSuffix(strings.Repeat("greyrelay-bench-1/003-exim,", 12), ",")
	if got != want {
		t.Errorf("cgroup:\n got %s\nwant %s", got, want)
	}
	if got := strings.Join(perfArgs("", []int{12, 34}), " "); !strings.HasSuffix(got, " -p 12,34") || strings.Contains(got, "-G") {
		t.Errorf("pids: %s", got)
	}
}

func TestParsePerfStatSyncs(t *testing.T) {
	// perf stat -a -G prints the cgroup in the fourth field.
	text := "864,,syscalls:sys_enter_fsync,g,133244506,100.00,,\n" +
		"1,,syscalls:sys_enter_fdatasync,g,133244506,100.00,,\n" +
		"3862,,raw_syscalls:sys_enter,g,133244506,100.00,,\n" +
		"142,,context-switches,g,133244506,100.00,,\n"
	c, err := parsePerfStat(text)
	if err != nil || c != (perfCounts{Syscalls: 3862, Switches: 142, Syncs: 865, SyncsCounted: true}) {
		t.Fatalf("got %+v, %v", c, err)
	}
	c, err = parsePerfStat("5,,raw_syscalls:sys_enter,,1,100.00,,\n6,,context-switches,,1,100.00,,\n")
	if err != nil || c.SyncsCounted || c.IOCounted {
		t.Fatalf("without the sync tracepoints: got %+v, %v", c, err)
	}
}

func TestParsePerfStatIO(t *testing.T) {
	text := "100,,raw_syscalls:sys_enter,g,1,100.00,,\n7,,context-switches,g,1,100.00,,\n" +
		"30,,syscalls:sys_enter_read,g,1,100.00,,\n2,,syscalls:sys_enter_recvfrom,g,1,100.00,,\n" +
		"20,,syscalls:sys_enter_write,g,1,100.00,,\n3,,syscalls:sys_enter_sendmsg,g,1,100.00,,\n" +
		"9,,syscalls:sys_enter_pwrite64,g,1,100.00,,\n<not counted>,,syscalls:sys_enter_readv,g,0,100.00,,\n"
	c, err := parsePerfStat(text)
	want := perfCounts{Syscalls: 100, Switches: 7, Reads: 32, Writes: 23, IOCounted: true}
	if err != nil || c != want {
		t.Fatalf("got %+v, %v; want %+v", c, err, want)
	}
}

// loopbackOnly fails if text names an IPv4 address outside 127.0.0.0/8.
func loopbackOnly(t *testing.T, name, text string) {
	t.Helper()
	for _, m := range regexp.MustCompile(`\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b`).FindAllString(text, -1) {
		if !strings.HasPrefix(m, "127.") {
			t.Errorf("%s names %s, not a loopback address", name, m)
		}
	}
}

func TestPeerConfigs(t *testing.T) {
	a := peerAddrs{listen: "127.0.0.60:2525", sink: "127.0.0.40:2600", extra: []string{"127.0.0.62:2587", "127.0.0.62:2465"}}
	tests := []struct {
		name string
		text string
		want []string
	}{
		{"smtpd.conf", openSMTPDConfig(a), []string{
			"smtp limit max-mails 1000000", "mta limit max-conn-per-route 20", "mta limit conn-delay-route 0", "mta limit task-hiwat 100000",
			"listen on 127.0.0.60 port 2525", `action "relay" relay host smtp://127.0.0.40:2600`,
			`match from any for domain "dest.test" action "relay"`}},
		{"exim.conf", eximConfig(a, "/w/exim"), []string{
			"local_interfaces = <; 127.0.0.60.2525", "daemon_smtp_ports = 2525", "spool_directory = /w/exim/spool",
			"log_file_path = /w/exim/log/%slog", "smtp_accept_queue_per_connection = 0", "route_list = * 127.0.0.40",
			"port = 2600", "domainlist relay_to_domains = dest.test", "hostlist relay_from_hosts = <; 127.0.0.0/8",
			"rfc1413_hosts =\n", "host_lookup =\n", "tls_advertise_hosts =\n"}},
		{"chasquid.conf", chasquidConfig(a, "/w/chasquid"), []string{
			`smtp_address: "127.0.0.60:2525"`, `submission_address: "127.0.0.62:2587"`,
			`submission_over_tls_address: "127.0.0.62:2465"`, `data_dir: "/w/chasquid/data"`}},
		{"chasquid aliases", chasquidAliases(), []string{"rcpt: rcpt@" + sinkHost + "\n"}},
		{"maddy.conf", maddyConfig(a, "/w/maddy"), []string{
			"targets tcp://127.0.0.40:2600", "starttls no", "location /w/maddy/queue", "max_parallelism 20",
			"smtp tcp://127.0.0.60:2525 {", "destination dest.test {", "deliver_to &relay_queue", "dmarc no",
			"state_dir /w/maddy/state", "tls off"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range tc.want {
				if !strings.Contains(tc.text, w) {
					t.Errorf("missing %q in\n%s", w, tc.text)
				}
			}
			if strings.Contains(tc.text, "%!") {
				t.Errorf("formatting error in\n%s", tc.text)
			}
			loopbackOnly(t, tc.name, tc.text)
		})
	}
}

func TestNSScript(t *testing.T) {
	got := nsScript([]mount{
		{kind: "bind", src: "/w/resolv.conf", dst: "/etc/resolv.conf"},
		{kind: "tmpfs", dst: "/run"},
		{kind: "overlay", src: "/c/root/usr/lib/x:/usr/lib/x", dst: "/usr/lib/x"},
	}, []string{"/usr/sbin/exim4", "-C", "/w/it's.conf"})
	want := "set -e\n" +
		"mount --bind '/w/resolv.conf' '/etc/resolv.conf'\n" +
		"mount -t tmpfs tmpfs '/run'\n" +
		"mount -t overlay overlay -o 'lowerdir=/c/root/usr/lib/x:/usr/lib/x' '/usr/lib/x'\n" +
		"exec '/usr/sbin/exim4' '-C' '/w/it'\\''s.conf'\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if out, err := exec.Command("sh", "-n", "-c", got).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v: %s", err, out)
	}
}

func TestMarkerHas(t *testing.T) {
	marker := "exim4-base 4.96-15+deb12u11\nexim4-daemon-light 4.96-15+deb12u11\nlibidn12 1.41-1\n"
	tests := []struct {
		pkgs []string
		want bool
	}{
		{[]string{"exim4-base", "exim4-daemon-light", "libidn12"}, true},
		{[]string{"exim4-base", "exim4-config"}, false},
		{nil, false},
	}
	for _, tc := range tests {
		if got := markerHas(marker, tc.pkgs); got != tc.want {
			t.Errorf("markerHas(%v) = %v", tc.pkgs, got)
		}
	}
}

func TestRoundOrder(t *testing.T) {
	if got := roundOrder([]string{"A", "B"}, 1); !slices.Equal(got, []string{"A", "B"}) {
		t.Errorf("round 1: %v", got)
	}
	if got := roundOrder([]string{"A", "B"}, 2); !slices.Equal(got, []string{"B", "A"}) {
		t.Errorf("round 2: %v", got)
	}
	// Over five rounds of seven systems, each runs once a round and no
	// system is always first.
	first := map[string]int{}
	for r := 1; r <= 5; r++ {
		got := roundOrder(allSystems, r)
		if s := slices.Sorted(slices.Values(got)); !slices.Equal(s, slices.Sorted(slices.Values(allSystems))) {
			t.Fatalf("round %d: %v", r, got)
		}
		first[got[0]]++
	}
	for s, n := range first {
		if n > 2 {
			t.Errorf("%s first in %d of 5 rounds", s, n)
		}
	}
}

func TestResolveSystems(t *testing.T) {
	tests := []struct {
		only, list string
		want       []string
		wantErr    bool
	}{
		{"", "greyrelay, exim,exim", []string{"greyrelay", "exim"}, false},
		{"both", "maddy", []string{"greyrelay", "postfix"}, false},
		{"sink", "", []string{"sink"}, false},
		{"", "greyrelay,sendmail", nil, true},
		{"", " , ", nil, true},
		{"exim", "", nil, true},
	}
	for _, tc := range tests {
		c := compareFlags{only: tc.only, systemList: tc.list}
		err := c.resolveSystems()
		if (err != nil) != tc.wantErr || !slices.Equal(c.systemNames, tc.want) {
			t.Errorf("-only %q -systems %q: got %v, %v", tc.only, tc.list, c.systemNames, err)
		}
	}
}

func TestSmokeFlags(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		rounds int
		n      int
	}{
		{[]string{"-smoke"}, 1, 500},
		{[]string{"-smoke", "-n", "2000"}, 1, 2000},
		{[]string{"-rounds", "3"}, 3, 20000},
	} {
		var c compareFlags
		fs := flag.NewFlagSet("compare", flag.ContinueOnError)
		c.register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		c.applySmoke(fs)
		if c.rounds != tc.rounds || c.n != tc.n || (c.smoke && c.pacedSeconds != 0) {
			t.Errorf("%v: rounds %d, n %d, paced %v", tc.args, c.rounds, c.n, c.pacedSeconds)
		}
	}
}

func TestCountFiles(t *testing.T) {
	dir := t.TempDir()
	if n, err := countFiles(filepath.Join(dir, "missing")); n != 0 || err != nil {
		t.Fatalf("missing directory: %d, %v", n, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if n, _ := countFiles(dir); n != 0 {
		t.Fatalf("empty directories: %d files", n)
	}
	for _, f := range []string{"x", "a/y", "a/b/z"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := countFiles(dir); n != 3 || err != nil {
		t.Fatalf("got %d, %v; want 3", n, err)
	}
}

// phase is a saturating phase for the report tests.
func phase(system, tools string, acc, deliv, cpuMs, toolsMs float64) roundResult {
	return roundResult{SUT: system, Tools: tools, Label: "4 KiB", AccRate: acc, DelivRate: deliv,
		CPUPer1000: cpuMs, ToolsCPUPer1000: toolsMs, SyncsPerMsg: 1}
}

func TestGoalsAgainstPeers(t *testing.T) {
	rs := []roundResult{
		phase("greyrelay", toolsPostfix, 4000, 3900, 0.30, 0.1),
		phase("postfix", toolsPostfix, 500, 400, 5, 0.1),
		phase("exim", toolsPostfix, 100, 100, 14, 0.1),
		phase("maddy", toolsPostfix, 1000, 2000, 1, 0.1),
		phase("opensmtpd", toolsPostfix, 3000, 150, 2, 0.1), // does not sync: reported beside only
		phase("sink", toolsPostfix, 10000, 10000, 0, 0.25),
	}
	var b strings.Builder
	goalsTable(&b, rs, "4 KiB", []string{toolsPostfix})
	out := b.String()
	for _, want := range []string{
		"accepted ≥ 2× the best peer that syncs before its 250 | 4.00× maddy (4000 vs 1000/s): met",
		"delivered ≥ 2× the best peer that syncs before its 250 | 1.95× maddy (3900 vs 2000/s): **not met**",
		"beside: accepted against the best peer that does not sync | 1.33× OpenSMTPD (4000 vs 3000/s) |",
		"accepted ≥ 5× Postfix | 8.00× (4000 vs 500/s): met",
		"delivered ≥ 5× Postfix | 9.75× (3900 vs 400/s): met",
		"accepted ≥ 45% of the tools alone | 40% (4000 of 10000/s): **not met**",
		"CPU per message ≤ 1.5× smtp-source + smtp-sink | 1.20× (0.300 vs 0.250 ms): met",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	b.Reset()
	peersTable(&b, rs, "4 KiB", []string{toolsPostfix})
	for _, want := range []string{
		"| greyrelay | yes | 4000 | 3900 | – | – | 40% | 0.300 | 1.20× |",
		"| OpenSMTPD | no | 3000 | 150 | 1.33× | 26.00× | 30% |",
		"| load tools alone | – | 10000 | 10000 | – | – | 100% | 0.250 (the tools) | 1.00× |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
}

func TestRoundFits(t *testing.T) {
	tests := []struct {
		elapsed time.Duration
		done    int
		limit   time.Duration
		want    bool
	}{
		{0, 0, time.Minute, true},
		{10 * time.Minute, 2, 0, true},
		{10 * time.Minute, 2, 15 * time.Minute, true}, // 10 + 5
		{10 * time.Minute, 2, 14 * time.Minute, false},
		{20 * time.Minute, 1, 30 * time.Minute, false},
	}
	for _, tc := range tests {
		if got := roundFits(tc.elapsed, tc.done, tc.limit); got != tc.want {
			t.Errorf("roundFits(%v, %d, %v) = %v", tc.elapsed, tc.done, tc.limit, got)
		}
	}
}

// A root unpacked by an earlier run is reused as it is: no apt-get.
func TestDebRootReused(t *testing.T) {
	cache := t.TempDir()
	dir := filepath.Join(cache, "exim-root")
	if err := os.MkdirAll(filepath.Join(dir, "root", "usr", "sbin"), 0o755); err != nil {
		t.Fatal(err)
	}
	marker := "exim4-base 4.96-15+deb12u11\nexim4-daemon-light 4.96-15+deb12u11\nlibidn12 1.41-1\n"
	if err := os.WriteFile(filepath.Join(dir, "packages"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir()) // no apt-get, no dpkg-deb: any call would fail
	root, versions, err := debRoot(cache, "exim", []string{"exim4-base", "exim4-daemon-light", "libidn12"})
	if err != nil || root != filepath.Join(dir, "root") || versions != strings.TrimSpace(marker) {
		t.Fatalf("got %q, %q, %v", root, versions, err)
	}
	// A root whose marker lacks a package is made again, which here
	// fails for want of apt-get.
	if _, _, err := debRoot(cache, "exim", []string{"exim4-base", "exim4-config"}); err == nil {
		t.Fatal("incomplete root reused")
	}
}

// TestSaveGreylistJSON: -json on the greylist scenario appends a line per
// system run (none for one left out with -systems), with its figures.
func TestSaveGreylistJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g.json")
	f := greylistFlags{delay: 25 * time.Second, thrN: 5, thrWindow: 5 * time.Second, thrMessages: 100}
	greys := []greyResult{
		{system: "greyrelay", attempts: []int{2, 2}, took: []time.Duration{30300 * time.Millisecond, 26200 * time.Millisecond}, rcpts: 4},
		{system: "postfix", skipped: true},
	}
	thrs := []throttleResult{
		{system: "greyrelay", delivered: 100, submitted: 40 * time.Second, total: 112 * time.Second, refusals: 3, connections: 3},
		{system: "postfix", skipped: true},
	}
	saveGreylistJSON(path, f, greys, thrs)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1 (the skipped system writes none):\n%s", len(lines), b)
	}
	var r greylistRecord
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil {
		t.Fatal(err)
	}
	if r.System != "greyrelay" || r.Delay != 25 || !slices.Equal(r.Attempts, []int{2, 2}) ||
		!slices.Equal(r.Took, []float64{30.3, 26.2}) || r.Throttle.Delivered != 100 || r.Throttle.Refusals != 3 || r.Throttle.Total != 112 || r.Throttle.Submitted != 40 {
		t.Errorf("record %+v", r)
	}
}
