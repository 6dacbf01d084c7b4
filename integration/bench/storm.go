package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

// sinkOnly makes a measured phase end when the sink has every accepted
// message, whatever else is queued: during a storm the queue never empties.
type sinkOnly struct{ sut }

func (sinkOnly) QueueEmpty() (bool, error) { return true, nil }

// runStorm is `bench storm`: a healthy stream measured on a fresh relay,
// then on a relay holding a backlog of messages for a black-holed
// destination (a server that accepts TCP and never greets, so each of the
// relay's connections to it waits out delivery.greeting_timeout).
func runStorm(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	c.register(fs)
	storm := fs.Int("storm", 100000, "messages queued for the black-holed destination")
	stormSize := fs.Int("storm-size", 4096, "size of each storm message")
	n := fs.Int("n", 20000, "messages in the healthy stream")
	size := fs.Int("size", 4096, "size of each healthy message")
	sessions := fs.Int("c", 20, "concurrent SMTP sessions")
	rounds := fs.Int("rounds", 1, "baseline/storm pairs")
	withPostfix := fs.Bool("postfix", false, "also run the same storm against Postfix")
	if err := fs.Parse(args); err != nil {
		return err
	}
	e, bin, err := c.setup()
	if err != nil {
		return err
	}
	defer e.close()
	machine(os.Stdout, e.root)
	systems := []string{"greyrelay"}
	if *withPostfix {
		systems = append(systems, "postfix")
	}
	st := stormRun{bin: bin, storm: *storm, stormSize: *stormSize,
		healthy: loadSpec{Messages: *n, Size: *size, Sessions: *sessions, Reuse: true, Pipelining: true, Timeout: 15 * time.Minute}}
	var all []roundResult
	var notes []string
phases:
	for r := 1; r <= *rounds; r++ {
		for _, name := range systems {
			for _, withStorm := range []bool{false, true} {
				res, note, err := st.once(ctx, e, name, withStorm)
				res.Round = r
				all = append(all, res)
				if note != "" {
					notes = append(notes, note)
				}
				if err != nil {
					fmt.Fprintf(os.Stderr, "bench: storm %s (storm %v): %v\n", name, withStorm, err)
				}
				if ctx.Err() != nil {
					break phases // interrupted: print what was measured
				}
			}
		}
	}
	fmt.Printf("## storm %v\n\n", args)
	for _, note := range notes {
		fmt.Printf("- %s\n", note)
	}
	fmt.Println()
	roundsTable(os.Stdout, all)
	stormSummary(all, systems)
	saveJSON(c.jsonPath, "storm", all)
	return ctx.Err()
}

type stormRun struct {
	bin              string
	storm, stormSize int
	healthy          loadSpec
}

// once measures the healthy stream on a fresh system, after queueing the
// storm first when withStorm is set.
func (st *stormRun) once(ctx context.Context, e *env, name string, withStorm bool) (roundResult, string, error) {
	label := "no storm"
	if withStorm {
		label = fmt.Sprintf("storm %d queued", st.storm)
	}
	fail := roundResult{SUT: name, Label: label}
	sk, err := startSink(ipSink+":0", false)
	if err != nil {
		return fail, "", err
	}
	defer sk.close()
	bh, err := startBlackhole(ipSlowSink + ":0")
	if err != nil {
		return fail, "", err
	}
	defer bh.close()
	routes := map[string]string{domainHealthy: sk.Addr, domainSlow: bh.Addr}
	var s sut
	if name == "postfix" {
		s, err = startPostfix(e, routes, 0)
	} else {
		s, err = startGreyrelay(e, st.bin, grOptions{Routes: routes})
	}
	if err != nil {
		return fail, "", err
	}
	defer s.Stop()
	if err := warmup(ctx, s, sk, 500, st.healthy); err != nil {
		return fail, "", err
	}
	note := ""
	if withStorm {
		spec := loadSpec{Addr: s.SMTPAddr(), Messages: st.storm, Size: st.stormSize, Sessions: st.healthy.Sessions,
			Reuse: true, Pipelining: true, Rcpts: []string{"victim@" + domainSlow}, FirstID: 0, Timeout: 20 * time.Minute}
		fmt.Fprintf(os.Stderr, "bench: %s: queueing %d storm messages\n", name, st.storm)
		lr := runLoad(ctx, spec)
		d := lr.LastAck.Sub(lr.Start).Seconds()
		time.Sleep(2 * time.Second) // let the workers reach the black hole
		note = fmt.Sprintf("%s: storm of %d × %s queued at %.0f msgs/s (%d not accepted); %d connections held by the black hole when the healthy stream starts",
			name, lr.Accepted, sizeLabel(st.stormSize), float64(lr.Accepted)/max(d, 1e-9), lr.Failed, bh.seen.Load())
	}
	fmt.Fprintf(os.Stderr, "bench: %s (%s): healthy stream of %d\n", name, label, st.healthy.Messages)
	res, err := measure(ctx, sinkOnly{s}, sk, roundSpec{Load: st.healthy, Label: label, DrainTimeout: 10 * time.Minute})
	res.SUT = name
	return res, note, err
}

func stormSummary(all []roundResult, systems []string) {
	t := &table{head: []string{"system", "metric (median)", "no storm", "with storm", "with / without"}}
	for _, name := range systems {
		var base, storm []roundResult
		for _, r := range all {
			if r.SUT != name {
				continue
			}
			if r.Label == "no storm" {
				base = append(base, r)
			} else {
				storm = append(storm, r)
			}
		}
		for _, m := range compareMetrics[:8] {
			b, s := median(base, m.f), median(storm, m.f)
			ratio := "–"
			if b != 0 {
				ratio = fmt.Sprintf("%.2f", s/b)
			}
			t.add(name, m.name, m.format(b), m.format(s), ratio)
		}
	}
	fmt.Println("### healthy stream with and without the storm")
	fmt.Println()
	fmt.Println("(\"last 250 → empty queue\" here is last 250 → the sink has every healthy message: the storm never drains.)")
	fmt.Println()
	t.write(os.Stdout)
}
