package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat. It
// is 100 on every Linux architecture Go runs on.
const clockTicks = 100

// procCPU returns the CPU time of one process in seconds: its own user and
// system time plus that of the children it has waited for (cutime,
// cstime). Counting reaped children matters for Postfix, whose master
// restarts smtpd, cleanup and smtp processes: their time moves into the
// master's cutime when they exit, so a before/after difference over "every
// live process of the instance" misses nothing.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads fields 14-17 of a /proc/PID/stat line. The command name
// (field 2) is in parentheses and may contain spaces, so fields are counted
// from the last ')'.
func parseStatCPU(line string) (float64, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no ')' in %q", line)
	}
	f := strings.Fields(line[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return 0, fmt.Errorf("stat: %d fields after the name", len(f))
	}
	var ticks int64
	for _, s := range f[11:15] { // fields 14..17: utime stime cutime cstime
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat: %w", err)
		}
		ticks += n
	}
	return float64(ticks) / clockTicks, nil
}

// memInfo is what we read about one process's memory, in KiB.
type memInfo struct {
	RSS, HWM, PSS int64
	Anon, File    int64 // RssAnon (heap, stacks) and RssFile (mapped files: bbolt's mmap of the queue)
}

// procMem reads VmRSS and VmHWM from /proc/PID/status and Pss from
// /proc/PID/smaps_rollup. PSS divides each shared page among the processes
// that map it, so Σ PSS over Postfix's dozen processes does not count libc
// twelve times, as Σ RSS would.
func procMem(pid int) (memInfo, error) {
	var m memInfo
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	m.RSS = kbField(string(b), "VmRSS:")
	m.HWM = kbField(string(b), "VmHWM:")
	m.Anon = kbField(string(b), "RssAnon:")
	m.File = kbField(string(b), "RssFile:")
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid)); err == nil {
		m.PSS = kbField(string(b), "Pss:")
	}
	return m, nil
}

// kbField finds "Name:   1234 kB" in a /proc text file.
func kbField(text, name string) int64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// diskDevice finds the /proc/diskstats line of the block device holding
// path, by its major:minor number.
func diskDevice(path string) (major, minor uint32, err error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, 0, err
	}
	dev := uint64(st.Dev)
	// Linux's encoding of dev_t (glibc's gnu_dev_major/minor).
	major = uint32((dev>>8)&0xfff) | uint32((dev>>32)&^0xfff)
	minor = uint32(dev&0xff) | uint32((dev>>12)&^0xff)
	return major, minor, nil
}

// diskFlushes is one reading of a device's counters in /proc/diskstats.
type diskFlushes struct {
	Name          string
	Flushes       int64 // "flushes completed" (field 18), or writes completed when the kernel has no flush fields
	Writes        int64 // "writes completed" (field 8)
	HasFlushField bool
}

// readDiskstats reads the counters of major:minor.
func readDiskstats(major, minor uint32) (diskFlushes, error) {
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return diskFlushes{}, err
	}
	return parseDiskstats(string(b), major, minor)
}

// parseDiskstats finds the device's line. Columns are major, minor, name
// and then the statistics the kernel's Documentation/admin-guide/iostats.rst
// numbers from 1: field 5 is writes completed (column 8) and field 16 flush
// requests completed (column 19, kernels ≥ 5.5). Without field 16 the write
// count stands in: on a journalling filesystem each fsync is at least one
// write.
func parseDiskstats(text string, major, minor uint32) (diskFlushes, error) {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[0] != strconv.Itoa(int(major)) || f[1] != strconv.Itoa(int(minor)) {
			continue
		}
		d := diskFlushes{Name: f[2]}
		d.Writes, _ = strconv.ParseInt(f[7], 10, 64)
		d.Flushes = d.Writes
		if len(f) >= 19 {
			d.Flushes, _ = strconv.ParseInt(f[18], 10, 64)
			d.HasFlushField = true
		}
		return d, nil
	}
	return diskFlushes{}, fmt.Errorf("diskstats: no device %d:%d", major, minor)
}

// monitor measures one system under test over one phase: CPU seconds (a
// before/after difference), disk flushes on the queue's device, and peak
// memory, sampled every 100 ms because Postfix's total is a sum over
// processes that come and go.
type monitor struct {
	pids         func() []int
	cpu          func() float64 // CPU seconds of the system so far
	tools        *cgroup        // the load tools' group (smtp-source and smtp-sink), or nil
	major, minor uint32
	t0           time.Time
	cpu0, self0  float64
	tools0       float64
	disk0        diskFlushes

	mu       sync.Mutex
	peakRSS  int64 // KiB, Σ VmRSS, max over samples
	peakPSS  int64 // KiB, Σ Pss, max over samples
	peakHWM  int64 // KiB, max VmHWM of one process
	stop     chan struct{}
	finished chan struct{}
}

// usage is what a monitor measured.
type usage struct {
	Seconds    float64 // wall time of the phase
	CPU        float64 // CPU seconds of the system under test
	SelfCPU    float64 // CPU seconds of this benchmark process (load generator and sink)
	ToolsCPU   float64 // CPU seconds of smtp-source and smtp-sink when they are the tools (their cgroup)
	Flushes    int64   // disk flushes (or writes, see diskFlushes) on the queue's device
	Writes     int64
	FlushField bool
	PeakRSSMB  float64
	PeakPSSMB  float64
	PeakHWMMB  float64
	Device     string
}

// startMonitor takes the "before" readings of s and starts the memory
// sampler. Its queue directory locates the disk device. A system in a
// cgroup is counted there (every process it ran, also those gone by the
// end); otherwise over its processes' /proc entries. tools, if not nil,
// is the cgroup of Postfix's load tools, counted beside.
func startMonitor(s sut, tools *cgroup) (*monitor, error) {
	m := &monitor{pids: s.Pids, tools: tools, stop: make(chan struct{}), finished: make(chan struct{})}
	m.cpu = func() float64 { return cpuOf(m.pids()) }
	if gs, ok := s.(grouped); ok && gs.group() != nil {
		g := gs.group()
		m.cpu = func() float64 { v, _ := g.cpuSeconds(); return v }
	}
	var err error
	if m.major, m.minor, err = diskDevice(s.QueueDir()); err != nil {
		return nil, err
	}
	if m.disk0, err = readDiskstats(m.major, m.minor); err != nil {
		return nil, err
	}
	m.cpu0 = m.cpu()
	m.self0 = selfCPU()
	if tools != nil {
		m.tools0, _ = tools.cpuSeconds()
	}
	m.t0 = time.Now()
	m.sample()
	go m.sampler()
	return m, nil
}

func cpuOf(pids []int) float64 {
	var sum float64
	for _, p := range pids {
		if c, err := procCPU(p); err == nil {
			sum += c
		}
	}
	return sum
}

func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func (m *monitor) sampler() {
	defer close(m.finished)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.sample()
		}
	}
}

func (m *monitor) sample() {
	var rss, pss, hwm int64
	for _, p := range m.pids() {
		mi, err := procMem(p)
		if err != nil {
			continue
		}
		rss += mi.RSS
		pss += mi.PSS
		hwm = max(hwm, mi.HWM)
	}
	m.mu.Lock()
	m.peakRSS, m.peakPSS, m.peakHWM = max(m.peakRSS, rss), max(m.peakPSS, pss), max(m.peakHWM, hwm)
	m.mu.Unlock()
}

// finish takes the "after" readings. The processes must still be running.
func (m *monitor) finish() usage {
	close(m.stop)
	<-m.finished
	m.sample()
	d1, _ := readDiskstats(m.major, m.minor)
	u := usage{
		Seconds: time.Since(m.t0).Seconds(),
		CPU:     m.cpu() - m.cpu0,
		SelfCPU: selfCPU() - m.self0,
		Flushes: d1.Flushes - m.disk0.Flushes, Writes: d1.Writes - m.disk0.Writes,
		FlushField: d1.HasFlushField, Device: d1.Name,
	}
	if m.tools != nil {
		t1, _ := m.tools.cpuSeconds()
		u.ToolsCPU = t1 - m.tools0
	}
	m.mu.Lock()
	u.PeakRSSMB, u.PeakPSSMB, u.PeakHWMMB = float64(m.peakRSS)/1024, float64(m.peakPSS)/1024, float64(m.peakHWM)/1024
	m.mu.Unlock()
	return u
}

// quietIdle is the share of the machine's CPU time that must be idle over
// quietWindow before a measured phase starts, and quietMax how long to wait
// for it. A system stopped just before (Postfix's processes winding down,
// the kernel writing back what they left) otherwise takes CPU from the
// next round, whichever system that is.
const (
	quietIdle   = 0.90
	quietWindow = 500 * time.Millisecond
	quietMax    = 20 * time.Second
)

// waitQuiet waits until the machine has been mostly idle for quietWindow,
// or quietMax has passed, and returns how long it waited.
func waitQuiet() time.Duration {
	start := time.Now()
	for time.Since(start) < quietMax {
		a, errA := cpuTimes()
		time.Sleep(quietWindow)
		b, errB := cpuTimes()
		if errA != nil || errB != nil {
			break
		}
		if total := b.total - a.total; total > 0 && float64(b.idle-a.idle)/float64(total) >= quietIdle {
			break
		}
	}
	return time.Since(start)
}

type cpuSample struct{ idle, total uint64 }

// cpuTimes reads the machine's first line of /proc/stat: idle (idle +
// iowait) and total jiffies.
func cpuTimes() (cpuSample, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return cpuSample{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var s cpuSample
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return cpuSample{}, err
		}
		s.total += n
		if i == 3 || i == 4 { // idle, iowait
			s.idle += n
		}
	}
	return s, nil
}
