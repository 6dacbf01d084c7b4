package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"
)

// compareFlags are the options of compare and sizes.
type compareFlags struct {
	common
	n, size, sessions, rounds, warm int
	reuse, pipelining               bool
	pacedSeconds                    float64
	only, tools                     string
	toolSets                        []string
}

func (c *compareFlags) register(fs *flag.FlagSet) {
	c.common.register(fs)
	fs.IntVar(&c.n, "n", 20000, "messages per measured phase")
	fs.IntVar(&c.size, "size", 4096, "message size in bytes (headers included)")
	fs.IntVar(&c.sessions, "c", 20, "concurrent SMTP sessions")
	fs.BoolVar(&c.reuse, "reuse", true, "send many messages per connection (false: a new connection per message)")
	fs.BoolVar(&c.pipelining, "pipelining", true, "pipeline MAIL/RCPT/DATA when the server offers PIPELINING")
	fs.IntVar(&c.rounds, "rounds", 2, "rounds; each runs greyrelay and Postfix, alternating which goes first")
	fs.IntVar(&c.warm, "warmup", 500, "messages sent and drained before each measured phase")
	fs.Float64Var(&c.pacedSeconds, "paced-seconds", 10, "after each saturating phase, a phase paced at half its accepted rate for this long (0: none)")
	fs.StringVar(&c.only, "only", "both", "greyrelay, postfix, both, or sink (the load generator straight into the sink: the harness's own ceiling)")
	fs.StringVar(&c.tools, "tools", toolsGo, "load generator and sink: go (this harness's), postfix (Postfix's smtp-source and smtp-sink) or both (each round runs each system with each)")
}

// tools lists the tool sets of round r, alternating their order too.
func (c *compareFlags) toolsOf(r int) []string {
	ts := append([]string(nil), c.toolSets...)
	if r%2 == 0 {
		slices.Reverse(ts)
	}
	return ts
}

// systems lists the systems of round r: both, alternating which goes
// first, so that drift on a shared machine does not favour one.
func (c *compareFlags) systems(r int) []string {
	switch c.only {
	case "greyrelay", "postfix", "sink":
		return []string{c.only}
	}
	if r%2 == 1 {
		return []string{"greyrelay", "postfix"}
	}
	return []string{"postfix", "greyrelay"}
}

// startSUT starts a fresh system (and its sink) for one round.
func startSUT(e *env, bin, name string, sk destination, maxSize int) (sut, error) {
	routes := map[string]string{domainHealthy: sk.addr()}
	switch name {
	case "sink":
		return direct{sk}, nil
	case "postfix":
		return startPostfix(e, routes, maxSize*2)
	}
	return startGreyrelay(e, bin, grOptions{Routes: routes})
}

// runCompare is `bench compare`: the same load against greyrelay and
// Postfix, alternated, each with a fresh queue and a fresh sink.
func runCompare(ctx context.Context, args []string) error {
	var c compareFlags
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	c.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return c.run(ctx, "compare "+fmt.Sprint(args), []int{c.size}, map[int]int{c.size: c.n})
}

// runSizes is `bench sizes`: compare at 1 KiB, 100 KiB and 10 MiB with
// message counts scaled so that each phase moves a similar, bounded volume.
func runSizes(ctx context.Context, args []string) error {
	var c compareFlags
	fs := flag.NewFlagSet("sizes", flag.ContinueOnError)
	c.register(fs)
	n1 := fs.Int("n1k", 20000, "messages of 1 KiB")
	n100 := fs.Int("n100k", 2000, "messages of 100 KiB")
	n10m := fs.Int("n10m", 60, "messages of 10 MiB")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c.pacedSeconds = 0
	counts := map[int]int{1 << 10: *n1, 100 << 10: *n100, 10 << 20: *n10m}
	return c.run(ctx, "sizes "+fmt.Sprint(args), []int{1 << 10, 100 << 10, 10 << 20}, counts)
}

func (c *compareFlags) run(ctx context.Context, command string, sizes []int, counts map[int]int) error {
	var err error
	if c.toolSets, err = toolList(c.tools); err != nil {
		return err
	}
	e, bin, err := c.setup()
	if err != nil {
		return err
	}
	defer e.close()
	machine(os.Stdout, e.root)
	var all []roundResult
phases:
	for _, size := range sizes {
		for r := 1; r <= c.rounds; r++ {
			for _, name := range c.systems(r) {
				for _, tool := range c.toolsOf(r) {
					rs, err := c.round(ctx, e, bin, name, tool, r, size, counts[size])
					all = append(all, rs...)
					if err != nil {
						fmt.Fprintf(os.Stderr, "bench: %s (%s tools) round %d: %v\n", name, tool, r, err)
					}
					if ctx.Err() != nil {
						break phases // interrupted: print what was measured
					}
				}
			}
		}
	}
	fmt.Printf("## %s\n\n", command)
	roundsTable(os.Stdout, all)
	for _, size := range sizes {
		label := sizeLabel(size)
		for _, tool := range c.toolSets {
			fmt.Printf("### %s, %d sessions, reuse %v, %s: saturating\n\n", label, c.sessions, c.reuse, toolsTitle(tool))
			summaryTable(os.Stdout, all, label, tool, false)
			if c.pacedSeconds > 0 && tool == toolsGo {
				fmt.Printf("### %s, %s: paced at half of each system's own saturating rate\n\n", label, toolsTitle(tool))
				summaryTable(os.Stdout, all, label, tool, true)
			}
		}
	}
	saveJSON(c.jsonPath, command, all)
	return ctx.Err()
}

// round runs one system once: start, warm up, a saturating phase and
// optionally a paced one, stop.
func (c *compareFlags) round(ctx context.Context, e *env, bin, name, tool string, r, size, n int) ([]roundResult, error) {
	sk, err := startDestination(tool)
	if err != nil {
		return nil, err
	}
	defer sk.close()
	s, err := startSUT(e, bin, name, sk, size)
	if err != nil {
		return nil, err
	}
	defer s.Stop()
	base := loadSpec{Size: size, Sessions: c.sessions, Reuse: c.reuse, Pipelining: c.pipelining, Timeout: 15 * time.Minute, Tool: tool}
	if err := warmup(ctx, s, sk, c.warm, base); err != nil {
		return nil, err
	}
	label := sizeLabel(size)
	spec := base
	spec.Messages, spec.FirstID = n, 0
	fmt.Fprintf(os.Stderr, "bench: %s round %d (%s tools): %d × %s over %d sessions\n", name, r, tool, n, label, c.sessions)
	res, err := measure(ctx, s, sk, roundSpec{Load: spec, Label: label, DrainTimeout: 10 * time.Minute})
	res.Round = r
	out := []roundResult{res}
	if err != nil || c.pacedSeconds <= 0 || res.AccRate <= 0 || tool != toolsGo {
		return out, err // smtp-source cannot pace
	}
	paced := base
	paced.Rate = res.AccRate / 2
	paced.Messages = max(100, int(paced.Rate*c.pacedSeconds))
	fmt.Fprintf(os.Stderr, "bench: %s round %d: paced %d at %.0f/s\n", name, r, paced.Messages, paced.Rate)
	pr, err := measure(ctx, s, sk, roundSpec{Load: paced, Label: label, DrainTimeout: 10 * time.Minute})
	pr.Round = r
	return append(out, pr), err
}

// startDestination starts the sink of a tool set.
func startDestination(tool string) (destination, error) {
	if tool == toolsPostfix {
		return startPSink(ipSink)
	}
	return startSink(ipSink+":0", false)
}

// toolsTitle names a tool set in a heading.
func toolsTitle(tool string) string {
	if tool == toolsPostfix {
		return "smtp-source → smtp-sink"
	}
	return "Go load generator → Go sink"
}

// direct is "no relay": the load generator talks to the sink itself, which
// shows the ceiling of the harness on this machine.
type direct struct{ sk destination }

func (d direct) Name() string              { return "sink" }
func (d direct) SMTPAddr() string          { return d.sk.addr() }
func (d direct) QueueDir() string          { return os.TempDir() }
func (d direct) Pids() []int               { return nil }
func (d direct) QueueEmpty() (bool, error) { return true, nil }
func (d direct) Stop() error               { return nil }
