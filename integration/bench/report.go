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
		"peak RSS MB", "peak PSS MB", "CPU s/1000 msgs", "flushes/msg", "fsyncs/msg", "syscalls/msg", "switches/msg", "tools CPU ms/msg", "bench CPU s", "not accepted", "lost/dup/bad"}}
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
			f1(r.Usage.PeakRSSMB), f1(r.Usage.PeakPSSMB), f3(r.CPUPer1000), f2(r.FlushPerMsg), syncsCell(r.SyncsPerMsg), f1(r.SyscallsPerMsg), f1(r.SwitchesPerMsg),
			f3(r.ToolsCPUPer1000), f1(r.Usage.SelfCPU), fmt.Sprint(r.Failed), lost)
	}
	t.write(w)
	for _, r := range rs {
		if len(r.Codes) > 0 {
			fmt.Fprintf(w, "- %s round %d %s: not accepted: %v\n", r.SUT, r.Round, r.Label, r.Codes)
		}
	}
}

// orDash formats a count per message with format, or shows "–" when it
// was not measured (negative).
func orDash(format func(float64) string) func(float64) string {
	return func(v float64) string {
		if v < 0 {
			return "–"
		}
		return format(v)
	}
}

// syncsCell shows fsync calls per message; countCell a count of other
// calls per message, to one decimal.
var syncsCell, countCell = orDash(f2), orDash(f1)

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
	{"fsync + fdatasync calls per msg (perf stat)", func(r roundResult) float64 { return r.SyncsPerMsg }, syncsCell},
	{"syscalls per msg (perf stat)", func(r roundResult) float64 { return r.SyscallsPerMsg }, f1},
	{"… of them read and receive calls", func(r roundResult) float64 { return r.ReadsPerMsg }, countCell},
	{"… of them write and send calls", func(r roundResult) float64 { return r.WritesPerMsg }, countCell},
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
	appendJSON(path, func(enc *json.Encoder) {
		for _, r := range rs {
			_ = enc.Encode(struct {
				Command string    `json:"command"`
				At      time.Time `json:"at"`
				roundResult
			}{command, time.Now(), r})
		}
	})
}

// appendJSON opens path for appending (nothing happens if path is empty)
// and lets encode write its JSON lines there; a file that cannot be
// opened is reported on stderr, as the printed tables are the run's
// record.
func appendJSON(path string, encode func(*json.Encoder)) {
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return
	}
	defer f.Close()
	encode(json.NewEncoder(f))
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

// systemsIn lists the systems of rs in the report's order (allSystems).
func systemsIn(rs []roundResult) []string {
	seen := map[string]bool{}
	for _, r := range rs {
		seen[r.SUT] = true
	}
	var out []string
	for _, s := range allSystems {
		if seen[s] {
			out = append(out, s)
		}
	}
	return out
}

// saturating selects the saturating phases of one size and tool set.
func saturating(rs []roundResult, label, tool, system string) []roundResult {
	var out []roundResult
	for _, r := range rs {
		if r.Label == label && r.Rate == 0 && r.Tools == tool && r.SUT == system {
			out = append(out, r)
		}
	}
	return out
}

// medianOf is the median of f over a system's saturating phases, and
// whether there were any.
func medianOf(rs []roundResult, label, tool, system string, f func(roundResult) float64) (float64, bool) {
	sel := saturating(rs, label, tool, system)
	return median(sel, f), len(sel) > 0
}

func accRate(r roundResult) float64   { return r.AccRate }
func delivRate(r roundResult) float64 { return r.DelivRate }
func cpuMs(r roundResult) float64     { return r.CPUPer1000 }      // CPU s per 1000 = CPU ms per message
func toolsMs(r roundResult) float64   { return r.ToolsCPUPer1000 } // likewise, of the load tools

// toolsCost is the CPU milliseconds per message of smtp-source and
// smtp-sink straight into each other in this run: the yardstick of the
// CPU goal.
func toolsCost(rs []roundResult, label string) (float64, bool) {
	return medianOf(rs, label, toolsPostfix, "sink", toolsMs)
}

// bestSyncing is the peer (any system but greyrelay and the tools alone)
// with the highest median of f among those whose syncs match want.
func bestSyncing(rs []roundResult, label, tool string, f func(roundResult) float64, want string) (string, float64) {
	best, bestV := "", 0.0
	for _, s := range systemsIn(rs) {
		if s == "greyrelay" || s == "sink" || syncsBefore250(s) != want {
			continue
		}
		if v, ok := medianOf(rs, label, tool, s, f); ok && v > bestV {
			best, bestV = s, v
		}
	}
	return best, bestV
}

// peersTable prints, per tool set, every system's medians side by side:
// rates, greyrelay's ratio to each, the share of the load tools' own
// rate, CPU, syncs and memory.
func peersTable(w io.Writer, rs []roundResult, label string, tools []string) {
	cost, haveCost := toolsCost(rs, label)
	for _, tool := range tools {
		fmt.Fprintf(w, "%s, saturating (medians of rounds):\n\n", toolsTitle(tool))
		t := &table{head: []string{"system", "syncs before 250", "accepted/s", "delivered/s", "greyrelay ÷ it, accepted", "greyrelay ÷ it, delivered",
			"accepted, share of the tools alone", "CPU ms/msg", "CPU ÷ smtp-source+smtp-sink", "fsync calls/msg", "disk flushes/msg", "peak PSS MB", "rounds"}}
		gAcc, gOK := medianOf(rs, label, tool, "greyrelay", accRate)
		gDel, _ := medianOf(rs, label, tool, "greyrelay", delivRate)
		ceiling, cOK := medianOf(rs, label, tool, "sink", accRate)
		for _, s := range systemsIn(rs) {
			sel := saturating(rs, label, tool, s)
			if len(sel) == 0 {
				continue
			}
			acc, del := median(sel, accRate), median(sel, delivRate)
			ratio := func(g, v float64) string {
				if !gOK || s == "greyrelay" || s == "sink" || v <= 0 {
					return "–"
				}
				return fmt.Sprintf("%.2f×", g/v)
			}
			share := "–"
			if cOK && ceiling > 0 {
				share = fmt.Sprintf("%.0f%%", acc/ceiling*100)
			}
			cpu := median(sel, cpuMs)
			cpuCell, vsTools := f3(cpu), "–"
			if s == "sink" {
				cpu = median(sel, toolsMs)
				cpuCell = f3(cpu) + " (the tools)"
			}
			if haveCost && cost > 0 {
				vsTools = fmt.Sprintf("%.2f×", cpu/cost)
			}
			syncs, flushes, pss, sy := "–", "–", "–", syncsBefore250(s)
			if s != "sink" {
				if v := median(sel, func(r roundResult) float64 { return r.SyncsPerMsg }); v >= 0 {
					syncs = f2(v)
				}
				flushes = f2(median(sel, func(r roundResult) float64 { return r.FlushPerMsg }))
				pss = f1(median(sel, func(r roundResult) float64 { return r.Usage.PeakPSSMB }))
			}
			if sy == "" {
				sy = "–"
			}
			t.add(titleOf(s), sy, f0(acc), f0(del), ratio(gAcc, acc), ratio(gDel, del), share, cpuCell, vsTools, syncs, flushes, pss, fmt.Sprint(len(sel)))
		}
		t.write(w)
	}
}

// goalsTable prints greyrelay's targets against this run's figures, per
// tool set.
func goalsTable(w io.Writer, rs []roundResult, label string, tools []string) {
	if len(saturating(rs, label, tools[0], "greyrelay")) == 0 && (len(tools) < 2 || len(saturating(rs, label, tools[1], "greyrelay")) == 0) {
		return
	}
	head := []string{"target (medians)"}
	for _, tool := range tools {
		head = append(head, toolsTitle(tool))
	}
	t := &table{head: head}
	cost, haveCost := toolsCost(rs, label)
	type goal struct {
		name string
		cell func(tool string) string
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**not met**"
	}
	vsPeer := func(f func(roundResult) float64, want string, min float64) func(string) string {
		return func(tool string) string {
			g, ok := medianOf(rs, label, tool, "greyrelay", f)
			peer, v := bestSyncing(rs, label, tool, f, want)
			if !ok || peer == "" || v <= 0 {
				return "–"
			}
			x := g / v
			if min == 0 {
				return fmt.Sprintf("%.2f× %s (%s vs %s/s)", x, titleOf(peer), f0(g), f0(v))
			}
			return fmt.Sprintf("%.2f× %s (%s vs %s/s): %s", x, titleOf(peer), f0(g), f0(v), verdict(x >= min))
		}
	}
	vsPostfix := func(f func(roundResult) float64) func(string) string {
		return func(tool string) string {
			g, ok1 := medianOf(rs, label, tool, "greyrelay", f)
			p, ok2 := medianOf(rs, label, tool, "postfix", f)
			if !ok1 || !ok2 || p <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.2f× (%s vs %s/s): %s", g/p, f0(g), f0(p), verdict(g/p >= 5))
		}
	}
	goals := []goal{
		{"accepted ≥ 2× the best peer that syncs before its 250", vsPeer(accRate, "yes", 2)},
		{"delivered ≥ 2× the best peer that syncs before its 250", vsPeer(delivRate, "yes", 2)},
		{"beside: accepted against the best peer that does not sync", vsPeer(accRate, "no", 0)},
		{"beside: delivered against the best peer that does not sync", vsPeer(delivRate, "no", 0)},
		{"accepted ≥ 5× Postfix", vsPostfix(accRate)},
		{"delivered ≥ 5× Postfix", vsPostfix(delivRate)},
		{"accepted ≥ 45% of the tools alone", func(tool string) string {
			g, ok1 := medianOf(rs, label, tool, "greyrelay", accRate)
			c, ok2 := medianOf(rs, label, tool, "sink", accRate)
			if !ok1 || !ok2 || c <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.0f%% (%s of %s/s): %s", g/c*100, f0(g), f0(c), verdict(g/c >= 0.45))
		}},
		{"CPU per message ≤ 1.5× smtp-source + smtp-sink", func(tool string) string {
			g, ok := medianOf(rs, label, tool, "greyrelay", cpuMs)
			if !ok || !haveCost || cost <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.2f× (%.3f vs %.3f ms): %s", g/cost, g, cost, verdict(g/cost <= 1.5))
		}},
	}
	for _, g := range goals {
		row := []string{g.name}
		for _, tool := range tools {
			row = append(row, g.cell(tool))
		}
		t.add(row...)
	}
	t.write(w)
}
