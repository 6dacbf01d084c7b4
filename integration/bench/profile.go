package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// profileFlags are the options of `bench profile`.
type profileFlags struct {
	common
	seconds, size, sessions, freq, top, traceSeconds int
}

// runProfile is `bench profile`: the compare load against greyrelay while
// perf(1) samples the relay's process with call graphs (Go keeps frame
// pointers, so perf unwinds Go stacks). It prints where CPU time goes by
// part of the relay, by package and by function, then how often and how
// long the relay waits in fdatasync: waiting is not CPU time and does not
// show in the samples.
func runProfile(ctx context.Context, args []string) error {
	var p profileFlags
	fs := flag.NewFlagSet("profile", flag.ContinueOnError)
	p.register(fs)
	fs.IntVar(&p.seconds, "seconds", 20, "how long perf records")
	fs.IntVar(&p.size, "size", 4096, "message size")
	fs.IntVar(&p.sessions, "c", 20, "concurrent sessions")
	fs.IntVar(&p.freq, "freq", 999, "perf sampling frequency (Hz)")
	fs.IntVar(&p.top, "top", 30, "functions to list")
	fs.IntVar(&p.traceSeconds, "trace-seconds", 5, "after the profile, how long perf trace counts fdatasync calls")
	if err := fs.Parse(args); err != nil {
		return err
	}
	perf, err := exec.LookPath("perf")
	if err != nil {
		return fmt.Errorf("profile needs perf(1) (apt-get install linux-perf): %w", err)
	}
	e, bin, err := p.setup()
	if err != nil {
		return err
	}
	defer e.close()
	machine(os.Stdout, e.root)
	sk, err := startSink(ipSink+":0", false)
	if err != nil {
		return err
	}
	defer sk.close()
	g, err := startGreyrelay(e, bin, grOptions{Routes: map[string]string{domainHealthy: sk.Addr}})
	if err != nil {
		return err
	}
	defer g.Stop()
	return p.record(ctx, perf, filepath.Join(e.root, "perf.data"), g, sk)
}

// record runs the load, perf record and perf trace against the running
// relay, then prints the reports.
func (p *profileFlags) record(ctx context.Context, perf, data string, g *greyrelay, sk *sink) error {
	base := loadSpec{Size: p.size, Sessions: p.sessions, Reuse: true, Pipelining: true, Timeout: 10 * time.Minute}
	if err := warmup(ctx, g, sk, 500, base); err != nil {
		return err
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	spec := base
	spec.Addr, spec.Messages = g.SMTPAddr(), 20000*(p.seconds+p.traceSeconds+5) // more than it can take; cancelled below
	sk.expect(0, nil)
	done := make(chan loadResult, 1)
	go func() { done <- runLoad(loadCtx, spec) }()
	time.Sleep(time.Second) // past the ramp-up
	pid := g.cmd.Process.Pid
	cpu0, t0 := cpuOf([]int{pid}), time.Now()
	rec := exec.CommandContext(ctx, perf, "record", "-F", strconv.Itoa(p.freq), "-g", "-p", strconv.Itoa(pid),
		"-o", data, "--", "sleep", strconv.Itoa(p.seconds))
	out, err := rec.CombinedOutput()
	cores := (cpuOf([]int{pid}) - cpu0) / time.Since(t0).Seconds()
	syncs, syncErr := syncSummary(ctx, perf, pid, p.traceSeconds)
	stopLoad()
	lr := <-done
	if err != nil {
		return fmt.Errorf("perf record: %v\n%s", err, out)
	}
	fmt.Printf("## profile: greyrelay under %d sessions × %s, %d s of perf at %d Hz\n\n", p.sessions, sizeLabel(p.size), p.seconds, p.freq)
	if d := lr.LastAck.Sub(lr.Start).Seconds(); d > 0 {
		fmt.Printf("load during the profile: %.0f msgs/s accepted; the relay used %.2f of the %d cores.\n\n", float64(lr.Accepted)/d, cores, numCPU())
	}
	if syncErr != nil {
		fmt.Printf("(no fdatasync summary: %v)\n\n", syncErr)
	} else {
		secs := float64(p.traceSeconds)
		fmt.Printf("fdatasync (perf trace, %d s, same load): %.0f calls/s, %.3f ms on average, busy %.0f%% of wall time"+
			" (the journal's, one per group of accepted messages, and bbolt's, two per commit).\n\n",
			p.traceSeconds, syncs.calls/secs, syncs.msec/max(syncs.calls, 1), syncs.msec/10/secs)
	}
	self, err := perfReport(perf, data, "--no-children")
	if err != nil {
		return err
	}
	incl, err := perfReport(perf, data, "--children")
	if err != nil {
		return err
	}
	printProfile(self, incl, p.top)
	return nil
}

// syncStats sums perf trace -s lines for fdatasync and fsync over threads.
type syncStats struct{ calls, msec float64 }

// syncSummary runs `perf trace -s` on the relay for a few seconds, counting
// only fdatasync and fsync: how often the relay waits for the disk and for
// how long. perf trace stops on SIGINT and then prints its summary.
func syncSummary(ctx context.Context, perf string, pid, seconds int) (syncStats, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(seconds+30)*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, perf, "trace", "-s", "-p", strconv.Itoa(pid), "-e", "fdatasync,fsync")
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return syncStats{}, err
	}
	time.Sleep(time.Duration(seconds) * time.Second)
	_ = cmd.Process.Signal(os.Interrupt)
	_ = cmd.Wait()
	return parseTraceSummary(buf.String())
}

// parseTraceSummary reads the per-thread tables of perf trace -s:
// "   fdatasync   937   0   395.328   0.092   0.422   4.542   3.90%".
func parseTraceSummary(out string) (syncStats, error) {
	var st syncStats
	seen := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || (f[0] != "fdatasync" && f[0] != "fsync") {
			continue
		}
		calls, err1 := strconv.ParseFloat(f[1], 64)
		msec, err2 := strconv.ParseFloat(f[3], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		st.calls += calls
		st.msec += msec
		seen = true
	}
	if !seen {
		return st, fmt.Errorf("perf trace printed no fdatasync line: %s", tailString(out, 300))
	}
	return st, nil
}

// sample is one line of perf report: a symbol and its share.
type sample struct {
	pct    float64
	kernel bool
	sym    string
}

// perfReport runs perf report without call graphs and parses its lines
// "  12.34%  [.] symbol" (or "  40.00%   1.23%  [k] symbol" with
// --children: the first number is inclusive).
func perfReport(perf, data, mode string) ([]sample, error) {
	cmd := exec.Command(perf, "report", "-i", data, "--stdio", mode, "--sort", "symbol", "-g", "none", "--percent-limit", "0.05")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("perf report: %w", err)
	}
	var s []sample
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if smp, ok := parsePerfLine(sc.Text()); ok {
			s = append(s, smp)
		}
	}
	return s, nil
}

func parsePerfLine(line string) (sample, bool) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return sample{}, false
	}
	f := strings.Fields(line)
	if len(f) < 3 || !strings.HasSuffix(f[0], "%") {
		return sample{}, false
	}
	pct, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
	if err != nil {
		return sample{}, false
	}
	i := 1
	for i < len(f) && strings.HasSuffix(f[i], "%") {
		i++
	}
	if i+1 >= len(f) {
		return sample{}, false
	}
	sym := strings.TrimSuffix(strings.Join(f[i+1:], " "), " - -") // perf appends " - -" (no source line)
	return sample{pct: pct, kernel: f[i] == "[k]", sym: sym}, true
}

// pkgOf returns a Go symbol's package path ("go.etcd.io/bbolt" for
// "go.etcd.io/bbolt.(*Tx).Commit"), or "kernel" / "other".
func pkgOf(s sample) string {
	if s.kernel {
		return "kernel"
	}
	sym := s.sym
	slash := strings.LastIndexByte(sym, '/')
	dot := strings.IndexByte(sym[slash+1:], '.')
	if dot < 0 {
		return "other (" + sym + ")"
	}
	return sym[:slash+1+dot]
}

func printProfile(self, incl []sample, top int) {
	section("by part", partsTable(incl))
	section("by package", packageTable(self, top))
	section("hottest functions (self)", selfTable(self, top))
	section("where the relay's own code spends it (inclusive: a function and what it calls)", ownTable(incl, top))
}

func section(title string, t *table) {
	fmt.Printf("### %s\n\n", title)
	t.write(os.Stdout)
}

// partsTable gives each part of the relay (a goroutine root) its
// inclusive share.
func partsTable(incl []sample) *table {
	t := &table{head: []string{"part of the relay (a goroutine's root function, inclusive)", "% of relay CPU"}}
	for _, r := range subsystems {
		for _, s := range incl {
			if strings.HasSuffix(s.sym, r.root) {
				t.add(r.name+" (`"+r.root+"`)", f1(s.pct))
				break
			}
		}
	}
	return t
}

// packageTable sums self time by Go package (kernel symbols together).
func packageTable(self []sample, top int) *table {
	byPkg := map[string]float64{}
	for _, s := range self {
		byPkg[pkgOf(s)] += s.pct
	}
	var pkgs []string
	for p := range byPkg {
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool { return byPkg[pkgs[i]] > byPkg[pkgs[j]] })
	t := &table{head: []string{"package (self time)", "% of relay CPU"}}
	for _, p := range pkgs[:min(top, len(pkgs))] {
		t.add(p, f1(byPkg[p]))
	}
	return t
}

func selfTable(self []sample, top int) *table {
	t := &table{head: []string{"function (self)", "%"}}
	for _, s := range self[:min(top, len(self))] {
		t.add(symCell(s), f2(s.pct))
	}
	return t
}

// ownTable lists the inclusive shares of the relay's code and of what it
// calls into directly (bbolt, go-smtp, syscalls, the GC).
func ownTable(incl []sample, top int) *table {
	t := &table{head: []string{"greyrelay / bbolt / go-smtp function (inclusive)", "%"}}
	for _, s := range incl {
		if len(t.rows) >= top {
			break
		}
		if strings.Contains(s.sym, "greyrelay/") || strings.Contains(s.sym, "bbolt") || strings.Contains(s.sym, "go-smtp") ||
			strings.HasPrefix(s.sym, "syscall.") || strings.HasPrefix(s.sym, "runtime.gcBgMarkWorker") || strings.HasPrefix(s.sym, "internal/poll.") {
			t.add(symCell(s), f2(s.pct))
		}
	}
	return t
}

// subsystems are the roots of the relay's goroutines: each inclusive share
// is the CPU of one part of the relay.
var subsystems = []struct{ name, root string }{
	{"SMTP intake sessions", "go-smtp.(*Server).handleConn"},
	{"queue group-commit writer", "greyrelay/queue.(*Queue).writer"},
	{"delivery scheduler", "relay/delivery.(*Engine).Run"},
	{"delivery workers", "relay/delivery.(*Engine).work"},
	{"garbage collector", "runtime.gcBgMarkWorker"},
	{"admin HTTP server", "net/http.(*conn).serve"},
}

func symCell(s sample) string {
	sym := strings.ReplaceAll(s.sym, "|", `\|`)
	if s.kernel {
		return "[kernel] " + sym
	}
	return "`" + sym + "`"
}
