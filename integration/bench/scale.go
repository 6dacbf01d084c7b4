package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// runScale is `bench scale`: fill the relay's queue with recipients for a
// destination that answers 451 to every MAIL, let the first attempt of each
// fail, then measure the relay holding them: memory, database size, CPU
// while nothing is due, `greyrelay queue list` with filters, and the time
// a restart takes until the relay answers SMTP again.
func runScale(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	c.register(fs)
	total := fs.Int("recipients", 1000000, "recipients to queue for the deferring destination")
	per := fs.Int("per-message", 1000, "recipients per message (limits.max_recipients is 1000)")
	size := fs.Int("size", 1024, "message size")
	sessions := fs.Int("c", 10, "concurrent SMTP sessions for the fill")
	idle := fs.Duration("idle", 30*time.Second, "how long to measure CPU while nothing is due")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.jsonPath != "" {
		// Its figures are the printed report's; a -json that wrote
		// nothing would be taken for an empty run.
		return errors.New("scale: -json is not written by this scenario; its figures are the printed report")
	}
	e, bin, err := c.setup()
	if err != nil {
		return err
	}
	defer e.close()
	machine(os.Stdout, e.root)
	sc := &scaleRun{total: *total, per: *per, size: *size, sessions: *sessions, idle: *idle}
	if err := sc.run(ctx, e, bin); err != nil {
		sc.print()
		return err
	}
	sc.print()
	return nil
}

type scaleRun struct {
	total, per, size, sessions int
	idle                       time.Duration

	rows [][2]string // metric, value, in order
}

func (sc *scaleRun) note(metric, format string, a ...any) {
	v := fmt.Sprintf(format, a...)
	sc.rows = append(sc.rows, [2]string{metric, v})
	fmt.Fprintf(os.Stderr, "bench: scale: %s: %s\n", metric, v)
}

func (sc *scaleRun) print() {
	fmt.Printf("## scale -recipients %d -per-message %d\n\n", sc.total, sc.per)
	t := &table{head: []string{"metric", "value"}}
	for _, r := range sc.rows {
		t.add(r[0], r[1])
	}
	t.write(os.Stdout)
}

// otherDomain holds a small set of deferred recipients, so that a filtered
// listing has few matches among a million rows.
const otherDomain = "other.test"

func (sc *scaleRun) run(ctx context.Context, e *env, bin string) error {
	sk, err := startSink(ipSlowSink+":0", true)
	if err != nil {
		return err
	}
	defer sk.close()
	// Retries an hour away: after the first attempts nothing is due, which
	// is the state whose idle cost we measure.
	g, err := startGreyrelay(e, bin, grOptions{
		Routes: map[string]string{domainSlow: sk.Addr, otherDomain: sk.Addr},
		Extra: map[string]any{"retry": map[string]any{"initial_interval": "1h", "max_interval": "4h"},
			"log": map[string]any{"level": "warn"}},
	})
	if err != nil {
		return err
	}
	if err := sc.fill(ctx, g); err != nil {
		return err
	}
	if err := sc.waitDeferred(ctx, g, sk, sc.total+100); err != nil {
		return err
	}
	sc.measureHeld(ctx, g, "loaded")
	sc.listing(g)
	if err := sc.restart(ctx, g); err != nil {
		return err
	}
	sc.measureHeld(ctx, g, "after restart")
	sc.listing(g)
	return nil
}

// fill queues total recipients in messages of per recipients, plus 100
// recipients (10 messages) for otherDomain.
func (sc *scaleRun) fill(ctx context.Context, g *greyrelay) error {
	rcpts := make([]string, sc.per)
	for i := range rcpts {
		rcpts[i] = fmt.Sprintf("user%04d@%s", i, domainSlow)
	}
	msgs := (sc.total + sc.per - 1) / sc.per
	spec := loadSpec{Addr: g.SMTPAddr(), Messages: msgs, Size: sc.size, Sessions: sc.sessions, Reuse: true,
		Pipelining: true, Rcpts: rcpts, Timeout: 30 * time.Minute}
	t0 := time.Now()
	lr := runLoad(ctx, spec)
	d := time.Since(t0)
	sc.note("fill: messages accepted", "%d of %d (%d recipients each, %d not accepted %v)", lr.Accepted, msgs, sc.per, lr.Failed, lr.Codes)
	sc.note("fill: time to accept", "%.1f s (%.0f recipients/s)", d.Seconds(), float64(lr.Accepted*sc.per)/d.Seconds())
	other := make([]string, 10)
	for i := range other {
		other[i] = fmt.Sprintf("user%d@%s", i, otherDomain)
	}
	spec.Messages, spec.Rcpts, spec.FirstID = 10, other, msgs
	if lr := runLoad(ctx, spec); lr.Accepted != 10 {
		return fmt.Errorf("scale: %s messages: %d of 10 accepted: %v", otherDomain, lr.Accepted, lr.Codes)
	}
	if lr.Accepted < msgs {
		return fmt.Errorf("scale: fill: only %d of %d messages accepted", lr.Accepted, msgs)
	}
	return nil
}

// waitDeferred waits until every recipient has had its first attempt.
func (sc *scaleRun) waitDeferred(ctx context.Context, g *greyrelay, sk *sink, want int) error {
	t0 := time.Now()
	deadline := t0.Add(60 * time.Minute)
	for {
		st, err := g.stats()
		if err == nil && st.ByStatus["deferred"] >= want && st.ByStatus["queued"] == 0 && st.ByStatus["active"] == 0 {
			sc.note("first attempts: all deferred after the fill", "%.1f s (%d recipients deferred, %d MAIL commands at the sink)",
				time.Since(t0).Seconds(), st.ByStatus["deferred"], sk.mails.Load())
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("scale: not all deferred after %v: %+v (%v)", time.Since(t0), st.ByStatus, err)
		}
		time.Sleep(time.Second)
	}
}

// measureHeld records memory, database size and idle CPU.
func (sc *scaleRun) measureHeld(ctx context.Context, g *greyrelay, when string) {
	pid := g.Pids()
	if len(pid) == 0 {
		sc.note(when+": relay", "not running")
		return
	}
	if fi, err := os.Stat(filepath.Join(g.QueueDir(), "queue.db")); err == nil {
		sc.note(when+": queue.db size", "%.1f MB", float64(fi.Size())/(1<<20))
	}
	if st, err := g.stats(); err == nil {
		sc.note(when+": queue", "%d messages, %d recipients, by status %v", st.Messages, st.Recipients, st.ByStatus)
	}
	c0, _ := procCPU(pid[0])
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return
	case <-time.After(sc.idle):
	}
	c1, _ := procCPU(pid[0])
	el := time.Since(t0).Seconds()
	sc.note(when+": CPU while nothing is due", "%.3f s over %.0f s (%.2f%% of one core)", c1-c0, el, (c1-c0)/el*100)
	if m, err := procMem(pid[0]); err == nil {
		sc.note(when+": memory", "RSS %.1f MB (anonymous %.1f MB, mapped files %.1f MB: the bbolt mmap), peak RSS (VmHWM) %.1f MB",
			mb(m.RSS), mb(m.Anon), mb(m.File), mb(m.HWM))
	}
}

// listing times `greyrelay queue list` with filters, as an operator runs
// it: a new process each time, through the admin API.
func (sc *scaleRun) listing(g *greyrelay) {
	all := fmt.Sprint(sc.total + 100)
	cases := []struct {
		name string
		args []string
	}{
		{"-domain " + otherDomain + " (100 of " + all + " match)", []string{"-domain", otherDomain}},
		{"-domain " + domainSlow + " (first page of " + fmt.Sprint(sc.total) + " matches)", []string{"-domain", domainSlow}},
		{"-status deferred -limit 100 (all " + all + " match)", []string{"-status", "deferred", "-limit", "100"}},
		{"-sender nobody@nowhere.test (no match)", []string{"-sender", "nobody@nowhere.test"}},
	}
	for _, c := range cases {
		var times []time.Duration
		var lastErr error
		for range 3 {
			args := append([]string{"queue", "-config", g.cfgPath, "list"}, c.args...)
			cmd := exec.Command(g.bin, args...)
			cmd.Env = peers.CleanEnv()
			t0 := time.Now()
			out, err := cmd.CombinedOutput()
			times = append(times, time.Since(t0))
			if err != nil {
				lastErr = fmt.Errorf("%v: %s", err, tailString(string(out), 300))
			}
		}
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		v := fmt.Sprintf("median %s ms (min %s, max %s)", ms(times[1]), ms(times[0]), ms(times[2]))
		if lastErr != nil {
			v += fmt.Sprintf(" — error: %v", lastErr)
		}
		sc.note("queue list "+c.name, "%s", v)
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// restart stops the relay with SIGTERM and starts it again, timing both.
func (sc *scaleRun) restart(ctx context.Context, g *greyrelay) error {
	t0 := time.Now()
	if err := g.Stop(); err != nil {
		return err
	}
	sc.note("restart: SIGTERM to exit", "%.2f s", time.Since(t0).Seconds())
	t1 := time.Now()
	greeted, err := g.start(5 * time.Minute)
	if err != nil {
		return err
	}
	sc.note("restart: start to first SMTP 220", "%.2f s", greeted.Seconds())
	sc.note("restart: start to /readyz 200", "%.2f s", time.Since(t1).Seconds())
	return nil
}

// mb converts KiB to MiB, the unit every memory figure here uses.
func mb(kib int64) float64 { return float64(kib) / 1024 }
