package main

import (
	"bytes"
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
