package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// perfStat counts the system calls, context switches and fsync and
// fdatasync calls of the system under test over a phase with `perf stat`
// (linux-perf). The first two are less sensitive to a busy shared machine
// than rates or CPU time: a change that saves a write per reply shows in
// them whatever else runs. The syncs tell how often a system asks the
// disk to make its queue durable, whatever the device does with that.
// A system in a cgroup is counted there (`perf stat -a -G`: every
// process, also those forked during the phase); otherwise perf attaches
// to the processes that exist when the phase starts (and their threads),
// which for Postfix without a cgroup misses daemons started during the
// phase.
type perfStat struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// perfCounts is what perfStat measured.
type perfCounts struct {
	Syscalls, Switches int64
	Syncs              int64 // fsync + fdatasync calls
	SyncsCounted       bool  // the syscall tracepoints were available
	// Reads and Writes count the calls that move data through a file
	// descriptor (readCalls, writeCalls): a socket's or a file's, a log
	// line's or a pipe's. They tell the protocol's own exchanges from
	// the rest of the system calls (waits, wakeups, disk).
	Reads, Writes int64
	IOCounted     bool
}

// readCalls and writeCalls are the system calls counted as Reads and
// Writes (pread64 and pwrite64, a database's page I/O, are not).
var (
	readCalls  = []string{"read", "readv", "recvfrom", "recvmsg"}
	writeCalls = []string{"write", "writev", "sendto", "sendmsg"}
)

// perfEvents are the events counted, in order.
var perfEvents = append([]string{"raw_syscalls:sys_enter", "context-switches", "syscalls:sys_enter_fsync", "syscalls:sys_enter_fdatasync"},
	append(tracepoints(readCalls), tracepoints(writeCalls)...)...)

// tracepoints names the entry tracepoints of calls.
func tracepoints(calls []string) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = "syscalls:sys_enter_" + c
	}
	return out
}

// perfArgs renders perf's arguments: per cgroup (-a, and -G repeating
// the group once per event, as perf pairs them) or per process.
func perfArgs(group string, pids []int) []string {
	args := []string{"stat", "-x,", "-e", strings.Join(perfEvents, ",")}
	if group != "" {
		gs := make([]string, len(perfEvents))
		for i := range gs {
			gs[i] = group
		}
		return append(args, "-a", "-G", strings.Join(gs, ","))
	}
	ps := make([]string, len(pids))
	for i, p := range pids {
		ps[i] = strconv.Itoa(p)
	}
	return append(args, "-p", strings.Join(ps, ","))
}

// startPerfStat starts counting for s; it returns nil (and counts
// nothing) when perf is missing or there is nothing to attach to.
func startPerfStat(s sut) *perfStat {
	path, err := exec.LookPath("perf")
	if err != nil {
		return nil
	}
	var args []string
	if gs, ok := s.(grouped); ok && gs.group() != nil {
		args = perfArgs(gs.group().rel, nil)
	} else if pids := s.Pids(); len(pids) > 0 {
		args = perfArgs("", pids)
	} else {
		return nil
	}
	p := &perfStat{}
	p.cmd = exec.Command(path, args...)
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
		case "syscalls:sys_enter_fsync", "syscalls:sys_enter_fdatasync":
			c.Syncs += n
			c.SyncsCounted = true
		default:
			call, ok := strings.CutPrefix(f[2], "syscalls:sys_enter_")
			switch {
			case ok && slices.Contains(readCalls, call):
				c.Reads += n
				c.IOCounted = true
			case ok && slices.Contains(writeCalls, call):
				c.Writes += n
				c.IOCounted = true
			}
		}
	}
	if found < 2 {
		return c, fmt.Errorf("perf stat: no counts in %q", text)
	}
	return c, nil
}
