package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// roundResult is one measured load phase against one system under test.
type roundResult struct {
	SUT      string
	Tools    string // load generator and sink: "go" (this harness) or "postfix" (smtp-source, smtp-sink)
	Round    int
	Label    string // what varied (size, paced...)
	Messages int
	Size     int
	Sessions int
	Reuse    bool
	Rate     float64 // offered rate for a paced run; 0 = saturating

	Accepted, Failed int
	Codes            map[string]int
	AccRate          float64       // accepted per second: accepted / (last 250 − start)
	DelivRate        float64       // delivered end to end per second: delivered / (last delivery − start)
	Drain            time.Duration // last 250 → queue empty
	P50, P99, Max    time.Duration // final dot → 250
	E2E50, E2E99     time.Duration // 250 → arrival at the sink
	Delivered        int64
	BadBody, Dups    int64
	Lost             int // accepted, not delivered when the wait ended
	Usage            usage
	CPUPer1000       float64 // CPU seconds of the system under test per 1000 accepted messages
	FlushPerMsg      float64
	SyscallsPerMsg   float64 // system calls of the system under test per accepted message (perf stat; 0: not measured)
	SwitchesPerMsg   float64 // its context switches per accepted message
	SyncsPerMsg      float64 // its fsync and fdatasync calls per accepted message (perf stat; -1: not measured)
	ReadsPerMsg      float64 // its read and receive calls per accepted message (perf stat; -1: not measured)
	WritesPerMsg     float64 // its write and send calls per accepted message (perf stat; -1: not measured)
	ToolsCPUPer1000  float64 // CPU seconds of the load tools per 1000 accepted messages: smtp-source and smtp-sink, or this harness process for the Go tools
}

// roundSpec says how to measure.
type roundSpec struct {
	Load         loadSpec
	Label        string
	DrainTimeout time.Duration // how long to wait for the queue to empty after the last 250
	Tools        *cgroup       // the cgroup of smtp-source and smtp-sink, when they are the tools (nil: not counted)
}

// measure runs one load phase against s, with sk as the destination, and
// waits until the sink has every accepted message and the queue is empty.
func measure(ctx context.Context, s sut, sk destination, rs roundSpec) (roundResult, error) {
	spec := rs.Load
	spec.Addr = s.SMTPAddr()
	msg := newMessage(spec.Size)
	sk.expect(spec.FirstID+spec.Messages, msg.body)
	if d := waitQuiet(); d > quietWindow+100*time.Millisecond {
		fmt.Fprintf(os.Stderr, "bench: %s: waited %.1f s for an idle machine\n", s.Name(), d.Seconds())
	}
	mon, err := startMonitor(s, rs.Tools)
	if err != nil {
		return roundResult{}, err
	}
	ps := startPerfStat(s)
	lr := runLoad(ctx, spec)
	tEmpty, werr := waitDrained(ctx, s, sk, lr.Accepted, rs.DrainTimeout)
	pc, perr := ps.finish()
	u := mon.finish()
	r := summarize(s.Name(), rs, lr, sk, tEmpty, u)
	r.SyncsPerMsg, r.ReadsPerMsg, r.WritesPerMsg = -1, -1, -1
	if perr == nil && lr.Accepted > 0 {
		r.SyscallsPerMsg = float64(pc.Syscalls) / float64(lr.Accepted)
		r.SwitchesPerMsg = float64(pc.Switches) / float64(lr.Accepted)
		if pc.SyncsCounted {
			r.SyncsPerMsg = float64(pc.Syncs) / float64(lr.Accepted)
		}
		if pc.IOCounted {
			r.ReadsPerMsg = float64(pc.Reads) / float64(lr.Accepted)
			r.WritesPerMsg = float64(pc.Writes) / float64(lr.Accepted)
		}
	}
	if werr != nil {
		return r, werr
	}
	return r, nil
}

// waitDrained polls until the sink has n good messages and the queue is
// empty; it returns when the queue was first seen empty.
func waitDrained(ctx context.Context, s sut, sk destination, n int, timeout time.Duration) (time.Time, error) {
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	deadline := time.Now().Add(timeout)
	for {
		if int(sk.counts().Good) >= n {
			empty, err := s.QueueEmpty()
			if err == nil && empty {
				return time.Now(), nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c := sk.counts()
			return time.Now(), fmt.Errorf("%s: after %v: sink has %d of %d, queue not empty", s.Name(), timeout, c.Good, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func summarize(name string, rs roundSpec, lr loadResult, sk destination, tEmpty time.Time, u usage) roundResult {
	spec := rs.Load
	c := sk.counts()
	r := roundResult{SUT: name, Tools: spec.toolName(), Label: rs.Label, Messages: spec.Messages, Size: spec.Size, Sessions: spec.Sessions,
		Reuse: spec.Reuse, Rate: spec.Rate, Accepted: lr.Accepted, Failed: lr.Failed, Codes: lr.Codes,
		Delivered: c.Good, BadBody: c.Bad, Dups: c.Dups, Usage: u}
	if d := lr.LastAck.Sub(lr.Start).Seconds(); d > 0 {
		r.AccRate = float64(lr.Accepted) / d
	}
	if d := c.Last.Sub(lr.Start).Seconds(); d > 0 {
		r.DelivRate = float64(c.Good) / d
	}
	if !lr.LastAck.IsZero() {
		r.Drain = tEmpty.Sub(lr.LastAck)
	}
	lat := sortDurations(lr.Latency)
	r.P50, r.P99 = percentile(lat, 50), percentile(lat, 99)
	if len(lat) > 0 {
		r.Max = lat[len(lat)-1]
	}
	arr := sk.arrivals()
	var e2e []time.Duration
	if arr == nil {
		lr.AckAt = nil // smtp-sink keeps no per-message times: no e2e, no loss count
	}
	for i, ack := range lr.AckAt {
		id := spec.FirstID + i
		switch {
		case ack == 0:
		case id < len(arr) && arr[id] != 0:
			e2e = append(e2e, time.Duration(max(0, arr[id]-ack)))
		default:
			r.Lost++
		}
	}
	e2e = sortDurations(e2e)
	r.E2E50, r.E2E99 = percentile(e2e, 50), percentile(e2e, 99)
	if lr.Accepted > 0 {
		r.CPUPer1000 = u.CPU / float64(lr.Accepted) * 1000
		tools := u.SelfCPU
		if spec.toolName() == toolsPostfix {
			tools = u.ToolsCPU
		}
		r.ToolsCPUPer1000 = tools / float64(lr.Accepted) * 1000
		r.FlushPerMsg = float64(u.Flushes) / float64(lr.Accepted)
	}
	return r
}

// warmup sends a few messages and waits for them to drain, so that the
// measured phase sees a running system (Postfix spawns its daemons on
// first use).
func warmup(ctx context.Context, s sut, sk destination, n int, base loadSpec) error {
	if n <= 0 {
		return nil
	}
	spec := base
	spec.Addr, spec.Messages, spec.Rate, spec.FirstID = s.SMTPAddr(), n, 0, 0
	sk.expect(n, newMessage(spec.Size).body)
	lr := runLoad(ctx, spec)
	if lr.Accepted < n {
		return fmt.Errorf("%s: warmup: %d of %d accepted: %v", s.Name(), lr.Accepted, n, lr.Codes)
	}
	_, err := waitDrained(ctx, s, sk, n, 2*time.Minute)
	return err
}

// buildRelay compiles cmd/greyrelay into the workspace (unless -binary
// names one), so that a concurrent `go build` elsewhere cannot swap the
// binary between rounds.
func buildRelay(e *env, given string) (string, error) {
	if given != "" {
		return filepath.Abs(given)
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(e.root, "greyrelay")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/greyrelay")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/greyrelay: %w\n%s", err, b)
	}
	return out, nil
}

// moduleRoot walks up from the working directory to greyrelay's go.mod.
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/greyrelay/greyrelay\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("run from inside the greyrelay module (no go.mod above %s)", wd)
		}
	}
}

// median of a metric over rounds.
func median(rs []roundResult, f func(roundResult) float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
