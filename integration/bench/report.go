package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// table is a Markdown table written row by row.
type table struct {
	head []string
	rows [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(t.head, " | "))
	seps := make([]string, len(t.head))
	for i := range seps {
		seps[i] = "---"
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(seps, "|"))
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintln(w)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }
func f0(v float64) string       { return fmt.Sprintf("%.0f", v) }
func f1(v float64) string       { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string       { return fmt.Sprintf("%.2f", v) }
func f3(v float64) string       { return fmt.Sprintf("%.3f", v) }

func sizeLabel(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// roundsTable lists every measured phase.
func roundsTable(w io.Writer, rs []roundResult) {
	t := &table{head: []string{"system", "tools", "round", "phase", "msgs", "size", "sessions", "reuse",
		"accepted/s", "delivered/s", "drain s", "p50 ms", "p99 ms", "max ms", "e2e p50 ms", "e2e p99 ms",
		"peak RSS MB", "peak PSS MB", "CPU s/1000 msgs", "flushes/msg", "syscalls/msg", "switches/msg", "bench CPU s", "not accepted", "lost/dup/bad"}}
	for _, r := range rs {
		phase := r.Label
		if r.Rate > 0 {
			phase = fmt.Sprintf("%s paced %.0f/s", phase, r.Rate)
		}
		lost := fmt.Sprintf("%d/%d/%d", r.Lost, r.Dups, r.BadBody)
		if r.Tools == toolsPostfix {
			lost = "–" // smtp-sink keeps nothing to check
		}
		t.add(r.SUT, r.Tools, fmt.Sprint(r.Round), phase, fmt.Sprint(r.Messages), sizeLabel(r.Size), fmt.Sprint(r.Sessions),
			fmt.Sprint(r.Reuse), f0(r.AccRate), f0(r.DelivRate), f2(r.Drain.Seconds()),
			ms(r.P50), ms(r.P99), ms(r.Max), ms(r.E2E50), ms(r.E2E99),
			f1(r.Usage.PeakRSSMB), f1(r.Usage.PeakPSSMB), f3(r.CPUPer1000), f2(r.FlushPerMsg), f1(r.SyscallsPerMsg), f1(r.SwitchesPerMsg),
			f1(r.Usage.SelfCPU), fmt.Sprint(r.Failed), lost)
	}
	t.write(w)
	for _, r := range rs {
		if len(r.Codes) > 0 {
			fmt.Fprintf(w, "- %s round %d %s: not accepted: %v\n", r.SUT, r.Round, r.Label, r.Codes)
		}
	}
}

// metric is one line of the side-by-side summary.
type metric struct {
	name   string
	f      func(roundResult) float64
	format func(float64) string
}

var compareMetrics = []metric{
	{"accepted msgs/s", func(r roundResult) float64 { return r.AccRate }, f0},
	{"delivered end to end msgs/s", func(r roundResult) float64 { return r.DelivRate }, f0},
	{"last 250 → empty queue, s", func(r roundResult) float64 { return r.Drain.Seconds() }, f2},
	{"final dot → 250 p50, ms", func(r roundResult) float64 { return r.P50.Seconds() * 1000 }, f2},
	{"final dot → 250 p99, ms", func(r roundResult) float64 { return r.P99.Seconds() * 1000 }, f2},
	{"final dot → 250 max, ms", func(r roundResult) float64 { return r.Max.Seconds() * 1000 }, f2},
	{"250 → sink p50, ms", func(r roundResult) float64 { return r.E2E50.Seconds() * 1000 }, f2},
	{"250 → sink p99, ms", func(r roundResult) float64 { return r.E2E99.Seconds() * 1000 }, f2},
	{"peak RSS, MB (Σ over processes)", func(r roundResult) float64 { return r.Usage.PeakRSSMB }, f1},
	{"peak PSS, MB (Σ over processes)", func(r roundResult) float64 { return r.Usage.PeakPSSMB }, f1},
	{"CPU s per 1000 msgs", func(r roundResult) float64 { return r.CPUPer1000 }, f3},
	{"disk flushes per msg", func(r roundResult) float64 { return r.FlushPerMsg }, f2},
	{"syscalls per msg (perf stat)", func(r roundResult) float64 { return r.SyscallsPerMsg }, f1},
	{"context switches per msg (perf stat)", func(r roundResult) float64 { return r.SwitchesPerMsg }, f1},
}

// latencyMetric reports whether m needs per-message times, which
// smtp-source and smtp-sink do not give.
func latencyMetric(m metric) bool {
	return strings.Contains(m.name, "→ 250") || strings.Contains(m.name, "250 →")
}

// summaryTable prints the median of each metric per system and the ratio
// greyrelay/Postfix.
func summaryTable(w io.Writer, rs []roundResult, label, tools string, paced bool) {
	var g, p []roundResult
	for _, r := range rs {
		if r.Label != label || (r.Rate > 0) != paced || (tools != "" && r.Tools != tools) {
			continue
		}
		switch r.SUT {
		case "greyrelay":
			g = append(g, r)
		case "postfix":
			p = append(p, r)
		}
	}
	t := &table{head: []string{"metric (median of rounds)", "greyrelay", "Postfix", "greyrelay / Postfix"}}
	for _, m := range compareMetrics {
		if tools == toolsPostfix && latencyMetric(m) {
			continue
		}
		gv, pv := median(g, m.f), median(p, m.f)
		ratio := "–"
		if len(g) > 0 && len(p) > 0 && pv != 0 {
			ratio = fmt.Sprintf("%.2f×", gv/pv)
		}
		gs, ps := "–", "–"
		if len(g) > 0 {
			gs = m.format(gv)
		}
		if len(p) > 0 {
			ps = m.format(pv)
		}
		t.add(m.name, gs, ps, ratio)
	}
	t.write(w)
}

// saveJSON appends the results as JSON lines (one object per phase) when
// path is set, so that runs can be compared later.
func saveJSON(path, command string, rs []roundResult) {
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, r := range rs {
		_ = enc.Encode(struct {
			Command string    `json:"command"`
			At      time.Time `json:"at"`
			roundResult
		}{command, time.Now(), r})
	}
}

// machine describes where the numbers were taken.
func machine(w io.Writer, queueDir string) {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	kern, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = fmt.Sprintf("%.1f GiB", float64(kbField(string(b), "MemTotal:"))/1024/1024)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	dev := "?"
	if maj, min, err := diskDevice(queueDir); err == nil {
		if d, err := readDiskstats(maj, min); err == nil {
			dev = d.Name
			if !d.HasFlushField {
				dev += " (no flush counters: writes completed stand in)"
			}
		}
	}
	fmt.Fprintf(w, "machine: %d CPUs (%s), %s RAM, kernel %s, queue disk %s, load average at start %s\n\n",
		numCPU(), cpu, mem, strings.TrimSpace(string(kern)), dev, strings.Join(strings.Fields(string(load))[:3], " "))
}
