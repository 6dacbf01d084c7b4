package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// perfStat counts the system calls and context switches of the system
// under test over a phase with `perf stat` (linux-perf). Both are less
// sensitive to a busy shared machine than rates or CPU time: a change that
// saves a write per reply shows in them whatever else runs. perf attaches
// to the processes that exist when the phase starts (and their threads);
// for Postfix, daemons started during the phase are not counted, so its
// figures are a lower bound.
type perfStat struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// perfCounts is what perfStat measured.
type perfCounts struct {
	Syscalls, Switches int64
}

// startPerfStat starts counting for pids; it returns nil (and counts
// nothing) when perf is missing or there is nothing to attach to.
func startPerfStat(pids []int) *perfStat {
	path, err := exec.LookPath("perf")
	if err != nil || len(pids) == 0 {
		return nil
	}
	ps := make([]string, len(pids))
	for i, p := range pids {
		ps[i] = strconv.Itoa(p)
	}
	p := &perfStat{}
	p.cmd = exec.Command(path, "stat", "-x,", "-e", "raw_syscalls:sys_enter,context-switches", "-p", strings.Join(ps, ","))
	p.cmd.Stderr = &p.out
	if err := p.cmd.Start(); err != nil {
		return nil
	}
	return p
}

// finish stops perf (SIGINT makes it print its counts) and reads them.
func (p *perfStat) finish() (perfCounts, error) {
	if p == nil {
		return perfCounts{}, fmt.Errorf("perf stat not running")
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	_ = p.cmd.Wait()
	return parsePerfStat(p.out.String())
}

// parsePerfStat reads `perf stat -x,` output: "value,unit,event,...".
func parsePerfStat(text string) (perfCounts, error) {
	var c perfCounts
	found := 0
	for _, line := range strings.Split(text, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch f[2] {
		case "raw_syscalls:sys_enter":
			c.Syscalls, found = n, found+1
		case "context-switches":
			c.Switches, found = n, found+1
		}
	}
	if found < 2 {
		return c, fmt.Errorf("perf stat: no counts in %q", text)
	}
	return c, nil
}
