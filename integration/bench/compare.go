package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// compareFlags are the options of compare and sizes.
type compareFlags struct {
	common
	n, size, sessions, rounds, warm int
	reuse, pipelining               bool
	pacedSeconds                    float64
	only, tools, systemList         string
	peerCache                       string
	smoke                           bool
	maxDuration                     time.Duration
	toolSets                        []string
	systemNames                     []string
}

// allSystems is every system a comparison runs by default: greyrelay,
// Postfix, the other relays (mtas.go) and the load tools straight into
// their sink, the machine's own limit measured in the same run.
var allSystems = []string{"greyrelay", "postfix", "opensmtpd", "exim", "chasquid", "maddy", "sink"}

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
	fs.StringVar(&c.only, "only", "", "greyrelay, postfix, both (the two), or sink (the load generator straight into the sink: the machine's ceiling); overrides -systems")
	fs.StringVar(&c.systemList, "systems", strings.Join(allSystems, ","), "comma-separated systems to run each round: "+strings.Join(allSystems, ", "))
	fs.StringVar(&c.peerCache, "peer-cache", "", "where the other relays' unpacked packages and maddy's build are kept between runs (default ~/.cache/greyrelay-bench)")
	fs.DurationVar(&c.maxDuration, "max-duration", 0, "start no round that, at the average round's length so far, would end after this much time (0: no limit); the rounds run are whole")
	fs.BoolVar(&c.smoke, "smoke", false, "a quick check that every system runs and relays: -rounds 1 -n 500 -warmup 50 -paced-seconds 0 unless given")
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

// parseSystems checks a -systems list.
func parseSystems(list string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" || seen[s] {
			continue
		}
		if !slices.Contains(allSystems, s) {
			return nil, fmt.Errorf("-systems: unknown system %q (want some of %s)", s, strings.Join(allSystems, ", "))
		}
		seen[s] = true
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-systems: empty")
	}
	return out, nil
}

// resolveSystems applies -only (the older flag) over -systems.
func (c *compareFlags) resolveSystems() error {
	switch c.only {
	case "":
		var err error
		c.systemNames, err = parseSystems(c.systemList)
		return err
	case "both":
		c.systemNames = []string{"greyrelay", "postfix"}
	case "greyrelay", "postfix", "sink":
		c.systemNames = []string{c.only}
	default:
		return fmt.Errorf("-only: want greyrelay, postfix, both or sink, got %q", c.only)
	}
	return nil
}

// systems lists the systems of round r: every one, in an order that
// reverses every other round and moves on by one place every two rounds
// (A B C, C B A, B C A, A C B, …), so that drift on a shared machine and
// what a system leaves behind on the disk do not favour one.
func (c *compareFlags) systems(r int) []string {
	return roundOrder(c.systemNames, r)
}

// roundOrder is the order of names in round r (from 1).
func roundOrder(names []string, r int) []string {
	n := len(names)
	out := make([]string, 0, n)
	for i := range n {
		out = append(out, names[(i+(r-1)/2)%n])
	}
	if r%2 == 0 {
		slices.Reverse(out)
	}
	return out
}

// roundFits reports whether another round, as long as the average of
// the done ones so far, ends within limit (always, with no limit or
// before the first round).
func roundFits(elapsed time.Duration, done int, limit time.Duration) bool {
	if limit <= 0 || done == 0 {
		return true
	}
	return elapsed+elapsed/time.Duration(done) <= limit
}

// applySmoke sets the smoke test's small counts for the flags not given.
func (c *compareFlags) applySmoke(fs *flag.FlagSet) {
	if !c.smoke {
		return
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["rounds"] {
		c.rounds = 1
	}
	if !given["n"] {
		c.n = 500
	}
	if !given["warmup"] {
		c.warm = 50
	}
	if !given["paced-seconds"] {
		c.pacedSeconds = 0
	}
}

// startSUT starts a fresh system (and its sink) for one round.
func (c *compareFlags) startSUT(e *env, bin, name string, sk destination, maxSize int) (sut, error) {
	routes := map[string]string{domainHealthy: sk.addr()}
	switch name {
	case "sink":
		return direct{sk}, nil
	case "postfix":
		return startPostfix(e, routes, maxSize*2)
	case "greyrelay":
		return startGreyrelay(e, bin, grOptions{Routes: routes})
	}
	return startPeer(e, c.peerCache, name, sk.addr())
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
	c.applySmoke(fs)
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
	c.applySmoke(fs)
	c.pacedSeconds = 0
	counts := map[int]int{1 << 10: *n1, 100 << 10: *n100, 10 << 20: *n10m}
	return c.run(ctx, "sizes "+fmt.Sprint(args), []int{1 << 10, 100 << 10, 10 << 20}, counts)
}

func (c *compareFlags) run(ctx context.Context, command string, sizes []int, counts map[int]int) error {
	var err error
	if c.toolSets, err = toolList(c.tools); err != nil {
		return err
	}
	if err := c.resolveSystems(); err != nil {
		return err
	}
	e, bin, err := c.setup()
	if err != nil {
		return err
	}
	defer e.close()
	machine(os.Stdout, e.root)
	var all []roundResult
	start, stopped := time.Now(), ""
phases:
	for _, size := range sizes {
		for r := 1; r <= c.rounds; r++ {
			if !roundFits(time.Since(start), r-1, c.maxDuration) {
				stopped = fmt.Sprintf("**Stopped after %d of %d rounds: another would have passed -max-duration %v.**\n\n", r-1, c.rounds, c.maxDuration)
				fmt.Fprintf(os.Stderr, "bench: stopping after round %d of %d (-max-duration %v)\n", r-1, c.rounds, c.maxDuration)
				break phases
			}
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
	if c.smoke {
		fmt.Printf("**Smoke test: %d round(s) of %d messages. These figures check that every system runs; they are not measurements.**\n\n", c.rounds, c.n)
	}
	fmt.Print(stopped)
	if d := e.peers.describe(); d != "" {
		fmt.Printf("Peers:\n\n%s\n", d)
	}
	roundsTable(os.Stdout, all)
	for _, size := range sizes {
		label := sizeLabel(size)
		fmt.Printf("### %s, %d sessions, reuse %v: every system\n\n", label, c.sessions, c.reuse)
		peersTable(os.Stdout, all, label, c.toolSets)
		goalsTable(os.Stdout, all, label, c.toolSets)
		for _, tool := range c.toolSets {
			fmt.Printf("### %s, %d sessions, reuse %v, %s: saturating, greyrelay and Postfix in detail\n\n", label, c.sessions, c.reuse, toolsTitle(tool))
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
	var tg *cgroup
	if tool == toolsPostfix {
		// smtp-source and smtp-sink run in a group of their own, so that
		// what they cost is counted beside each system.
		tg, _ = e.group(fmt.Sprintf("tools-%s-%d", name, r))
	}
	sk, err := startDestination(tool, tg)
	if err != nil {
		return nil, err
	}
	defer sk.close()
	s, err := c.startSUT(e, bin, name, sk, size)
	if err != nil {
		return nil, err
	}
	defer s.Stop()
	base := loadSpec{Size: size, Sessions: c.sessions, Reuse: c.reuse, Pipelining: c.pipelining, Timeout: 15 * time.Minute, Tool: tool, ToolGroup: tg}
	if err := warmup(ctx, s, sk, c.warm, base); err != nil {
		return nil, err
	}
	label := sizeLabel(size)
	spec := base
	spec.Messages, spec.FirstID = n, 0
	fmt.Fprintf(os.Stderr, "bench: %s round %d (%s tools): %d × %s over %d sessions\n", name, r, tool, n, label, c.sessions)
	res, err := measure(ctx, s, sk, roundSpec{Load: spec, Label: label, DrainTimeout: 10 * time.Minute, Tools: tg})
	res.Round = r
	out := []roundResult{res}
	if err != nil || c.pacedSeconds <= 0 || res.AccRate <= 0 || tool != toolsGo {
		return out, err // smtp-source cannot pace
	}
	paced := base
	paced.Rate = res.AccRate / 2
	paced.Messages = max(100, int(paced.Rate*c.pacedSeconds))
	fmt.Fprintf(os.Stderr, "bench: %s round %d: paced %d at %.0f/s\n", name, r, paced.Messages, paced.Rate)
	pr, err := measure(ctx, s, sk, roundSpec{Load: paced, Label: label, DrainTimeout: 10 * time.Minute, Tools: tg})
	pr.Round = r
	return append(out, pr), err
}

// startDestination starts the sink of a tool set; smtp-sink runs in
// group g when not nil.
func startDestination(tool string, g *cgroup) (destination, error) {
	if tool == toolsPostfix {
		return startPSink(ipSink, g)
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
