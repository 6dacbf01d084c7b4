package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/integration/peers"
)

// The greylist command runs two scenarios for four systems, greyrelay
// with its defaults (no retry key set), greyrelay compressed (the quick
// retries of -first-retry and -second-retry, -postfix-backoff as its
// initial_interval), Postfix with its defaults (minimal_backoff_time and
// queue_run_delay 300 s) and Postfix tuned (both -postfix-backoff), all at
// once on their own loopback addresses, and prints them side by side:
//
//   - greylisting: messages one after the other, each to a new recipient
//     (a new triplet), through a destination Postfix asking a real postgrey
//     (--auto-whitelist-clients=0, --lookup-by-host). Per message: attempts
//     (the destination's 450 replies plus the pass), time from the 250 at
//     intake to arrival; in all: RCPTs sent, source addresses seen; then
//     each system against the greylisting goals (greygoals.go).
//   - throttling: a burst of messages to a destination accepting N per
//     window (451 4.7.1 "rate limit exceeded" beyond), submitted by one
//     swaks process after another; total time, refusals, connections,
//     the share of the allowed rate used, and how long the submission
//     took (a slow one paces the run before the first refusal).

// The systems compared, in the order printed.
var greylistSystems = []string{"greyrelay", "greyrelay-compressed", "postfix", "postfix-tuned"}

// Addresses of the greylist scenarios (each party its own host): per
// system, in greylistSystems' order, the destination Postfix behind its
// postgrey and the throttling destination.
var (
	ipGreyDests = []string{"127.0.0.50", "127.0.0.55", "127.0.0.51", "127.0.0.56"}
	ipThrSinks  = []string{"127.0.0.53", "127.0.0.57", "127.0.0.54", "127.0.0.58"}
)

// greylistIndex is system's place in greylistSystems.
func greylistIndex(system string) int { return slices.Index(greylistSystems, system) }

// isPostfix reports whether system is one of the Postfix setups.
func isPostfix(system string) bool { return strings.HasPrefix(system, "postfix") }

type greylistFlags struct {
	delay                 time.Duration
	messages              int
	first, second         time.Duration
	thrN, thrMessages     int
	thrWindow, thrTimeout time.Duration
	greylistTimeoutPerMsg time.Duration
	postfixBackoff        time.Duration
	systems               string // comma-separated: greyrelay, postfix
}

// greyResult is one system's greylisting run.
type greyResult struct {
	system   string
	skipped  bool // not run (-systems)
	attempts []int
	took     []time.Duration
	rcpts    int
	sources  []string
	err      error
}

// throttleResult is one system's throttling run.
type throttleResult struct {
	system      string
	skipped     bool // not run (-systems)
	delivered   int
	submitted   time.Duration // from the first swaks to the last one's end
	total       time.Duration
	refusals    int
	connections int
	err         error
}

func runGreylist(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("greylist", flag.ContinueOnError)
	var c common
	c.register(fs)
	var f greylistFlags
	fs.DurationVar(&f.delay, "delay", 25*time.Second, "postgrey --delay")
	fs.IntVar(&f.messages, "messages", 10, "messages through the greylister, one after the other")
	fs.DurationVar(&f.first, "first-retry", 20*time.Second, "greyrelay-compressed's retry.greylist_first_retry")
	fs.DurationVar(&f.second, "second-retry", 10*time.Second, "greyrelay-compressed's retry.greylist_second_retry")
	fs.IntVar(&f.thrN, "throttle-n", 5, "the throttling destination accepts this many messages per window")
	fs.DurationVar(&f.thrWindow, "throttle-window", 5*time.Second, "its window")
	fs.IntVar(&f.thrMessages, "throttle-messages", 100, "messages sent to it in one burst")
	fs.DurationVar(&f.thrTimeout, "throttle-timeout", 15*time.Minute, "give up waiting for the throttled burst after this long")
	fs.DurationVar(&f.postfixBackoff, "postfix-backoff", 10*time.Second, "postfix-tuned's minimal_backoff_time and queue_run_delay (greyrelay-compressed's initial_interval)")
	fs.StringVar(&f.systems, "systems", strings.Join(greylistSystems, ","), "systems to run, comma-separated, of "+strings.Join(greylistSystems, ", ")+" (the Postfix throttling runs take 30 min and more)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f.greylistTimeoutPerMsg = max(10*f.delay+time.Minute, 11*time.Minute) // Postfix's defaults: up to 600 s
	e, bin, err := c.setup()
	if err != nil {
		return err
	}
	defer e.close()
	var wg sync.WaitGroup
	greys := make([]greyResult, len(greylistSystems))
	thrs := make([]throttleResult, len(greylistSystems))
	for i, sys := range greylistSystems {
		greys[i].system, thrs[i].system = sys, sys
		if !slices.Contains(strings.Split(f.systems, ","), sys) {
			greys[i].skipped, thrs[i].skipped = true, true
			continue
		}
		wg.Add(2)
		go func() { defer wg.Done(); greys[i] = greylistRun(ctx, e, bin, sys, f) }()
		go func() { defer wg.Done(); thrs[i] = throttleRun(ctx, e, bin, sys, f) }()
	}
	wg.Wait()
	printGreylist(f, greys, thrs)
	saveGreylistJSON(c.jsonPath, f, greys, thrs)
	for _, g := range greys {
		if g.err != nil {
			return g.err
		}
	}
	for _, t := range thrs {
		if t.err != nil {
			return t.err
		}
	}
	return nil
}

// sutFor starts the system under test relaying domain to dest, from src.
func sutFor(e *env, bin, system, domain, dest, src string, f greylistFlags) (string, error) {
	if !isPostfix(system) {
		extra := map[string]any{"delivery": map[string]any{"source_ipv4": src}}
		if system == "greyrelay-compressed" {
			extra["retry"] = map[string]any{"greylist_first_retry": f.first.String(), "greylist_second_retry": f.second.String(),
				"hint_min": "1s", "initial_interval": f.postfixBackoff.String()}
		}
		g, err := startGreyrelay(e, bin, grOptions{Routes: map[string]string{domain: dest}, Extra: extra})
		if err != nil {
			return "", err
		}
		return g.SMTPAddr(), nil
	}
	listen, err := freeAddr(ipPostfix)
	if err != nil {
		return "", err
	}
	h, p, _ := strings.Cut(dest, ":")
	b := "300s" // Postfix's defaults
	if system == "postfix-tuned" {
		b = f.postfixBackoff.String()
	}
	px := peers.StartPostfix(e.tb(system+"-"+domain), peers.PostfixConfig{Listen: listen, Hostname: "postfix.bench.test",
		RelayDomains: []string{domain}, BindAddress: src, Main: map[string]string{
			"transport_maps":       fmt.Sprintf("inline:{%s=smtp:[%s]:%s}", domain, h, p),
			"minimal_backoff_time": b, "queue_run_delay": b, "maximal_backoff_time": "4000s",
		}})
	return px.Listen, nil
}

// sourceOf is the pinned source address of each system.
func sourceOf(system string) string {
	if !isPostfix(system) {
		return ipGreyrelay
	}
	return ipPostfix
}

var rcptFrom = regexp.MustCompile(`RCPT from [^\[]*\[([0-9a-f.:]+)\]: 450 4\.2\.0 <([^>]+)>`)

func greylistRun(ctx context.Context, e *env, bin, system string, f greylistFlags) (res greyResult) {
	res.system = system
	defer func() {
		if v := recover(); v != nil {
			ft, ok := v.(fatal)
			if !ok {
				panic(v)
			}
			res.err = fmt.Errorf("%s", ft.msg)
		}
	}()
	destIP := ipGreyDests[greylistIndex(system)]
	tb := e.tb("greylist-" + system)
	sink := peers.StartSink(tb, destIP+":0", peers.SinkOptions{})
	pg := peers.StartPostgrey(tb, "", f.delay)
	destAddr, err := freeAddr(destIP)
	if err != nil {
		res.err = err
		return res
	}
	dest := peers.StartPostfix(e.tb("dest-"+system), peers.PostfixConfig{Listen: destAddr, Hostname: "mx.dest.test",
		RelayDomains: []string{"dest.test"}, DeliverTo: sink.Addr, Postgrey: pg})
	sutAddr, err := sutFor(e, bin, system, "dest.test", destAddr, sourceOf(system), f)
	if err != nil {
		res.err = err
		return res
	}
	for k := 1; k <= f.messages && ctx.Err() == nil; k++ {
		rcpt := fmt.Sprintf("b%d@dest.test", k)
		if _, code := (peers.SwaksMessage{Server: sutAddr, From: "a@src.test", To: []string{rcpt}}).Send(tb); code != 0 {
			res.err = fmt.Errorf("%s: swaks exited %d", system, code)
			return res
		}
		accepted := time.Now()
		if !waitMessages(ctx, sink, k, f.greylistTimeoutPerMsg) {
			res.err = fmt.Errorf("%s: message %d not delivered within %v", system, k, f.greylistTimeoutPerMsg)
			return res
		}
		res.took = append(res.took, time.Since(accepted))
	}
	log := dest.Log()
	refused := map[string]int{}
	var sources []string
	for _, m := range rcptFrom.FindAllStringSubmatch(log, -1) {
		refused[m[2]]++
		sources = append(sources, m[1])
	}
	for _, m := range sink.Messages() {
		sources = append(sources, m.ClientIP) // the destination Postfix's address: not the SUT's
	}
	for k := 1; k <= len(res.took); k++ {
		res.attempts = append(res.attempts, refused[fmt.Sprintf("b%d@dest.test", k)]+1)
		res.rcpts += refused[fmt.Sprintf("b%d@dest.test", k)] + 1
	}
	slices.Sort(sources)
	res.sources = slices.Compact(slices.DeleteFunc(sources, func(s string) bool { return s == destIP }))
	return res
}

func waitMessages(ctx context.Context, s *peers.Sink, n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for len(s.Messages()) < n {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// windowLimit accepts n RCPTs per fixed window and refuses the rest.
type windowLimit struct {
	mu       sync.Mutex
	n        int
	window   time.Duration
	start    time.Time
	count    int
	refusals int
}

func (w *windowLimit) rcpt(string, int) *smtp.SMTPError {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if now.Sub(w.start) >= w.window {
		w.start, w.count = now, 0
	}
	if w.count >= w.n {
		w.refusals++
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 7, 1}, Message: "rate limit exceeded, slow down"}
	}
	w.count++
	return nil
}

func throttleRun(ctx context.Context, e *env, bin, system string, f greylistFlags) (res throttleResult) {
	res.system = system
	defer func() {
		if v := recover(); v != nil {
			ft, ok := v.(fatal)
			if !ok {
				panic(v)
			}
			res.err = fmt.Errorf("%s", ft.msg)
		}
	}()
	ip := ipThrSinks[greylistIndex(system)]
	tb := e.tb("throttle-" + system)
	lim := &windowLimit{n: f.thrN, window: f.thrWindow}
	sink := peers.StartSink(tb, ip+":0", peers.SinkOptions{Rcpt: lim.rcpt})
	sutAddr, err := sutFor(e, bin, system, "slow.test", sink.Addr, sourceOf(system), f)
	if err != nil {
		res.err = err
		return res
	}
	start := time.Now()
	for k := 1; k <= f.thrMessages; k++ {
		if _, code := (peers.SwaksMessage{Server: sutAddr, From: "a@src.test", To: []string{fmt.Sprintf("t%d@slow.test", k)}}).Send(tb); code != 0 {
			res.err = fmt.Errorf("%s: swaks exited %d", system, code)
			return res
		}
	}
	res.submitted = time.Since(start)
	waitMessages(ctx, sink, f.thrMessages, f.thrTimeout)
	res.total = time.Since(start)
	res.delivered = len(sink.Messages())
	lim.mu.Lock()
	res.refusals = lim.refusals
	lim.mu.Unlock()
	res.connections = sink.Connections()
	return res
}

func printGreylist(f greylistFlags, greys []greyResult, thrs []throttleResult) {
	fmt.Printf("### Greylisting: postgrey --delay=%v, %d messages one after the other to new recipients\n\n", f.delay, f.messages)
	fmt.Printf("greyrelay: its defaults; greyrelay compressed: retry.greylist_first_retry %v, greylist_second_retry %v, initial_interval %v; "+
		"Postfix: its defaults (minimal_backoff_time = queue_run_delay = 300s); Postfix tuned: both %v.\n",
		f.first, f.second, f.postfixBackoff, f.postfixBackoff)
	fmt.Printf("Each cell: attempts / time from the 250 at intake to arrival. Goals below the table.\n\n")
	head, rule := "| message |", "|---:|"
	for _, g := range greys {
		head += " " + systemTitle(g.system) + " |"
		rule += "---:|"
	}
	fmt.Println(head)
	fmt.Println(rule)
	for k := 0; k < f.messages; k++ {
		row := fmt.Sprintf("| %d |", k+1)
		for _, g := range greys {
			if g.skipped {
				row += " not run |"
				continue
			}
			if k < len(g.took) {
				row += fmt.Sprintf(" %d / %.1f s |", g.attempts[k], g.took[k].Seconds())
			} else {
				row += " — |"
			}
		}
		fmt.Println(row)
	}
	row1, row2 := "| RCPTs sent |", "| source addresses |"
	for _, g := range greys {
		if g.skipped {
			row1 += " not run |"
			row2 += " not run |"
			continue
		}
		row1 += fmt.Sprintf(" %d |", g.rcpts)
		row2 += fmt.Sprintf(" %s |", strings.Join(g.sources, ", "))
	}
	fmt.Println(row1)
	fmt.Println(row2)
	printGreyGoals(os.Stdout, f.delay, f.messages, greys)
	allowed := float64(f.thrN) / f.thrWindow.Seconds()
	fmt.Printf("\n### Throttling: %d messages in one burst to a destination accepting %d per %v (451 4.7.1 beyond)\n\n", f.thrMessages, f.thrN, f.thrWindow)
	head, rule = "| |", "|---|"
	for _, t := range thrs {
		head += " " + systemTitle(t.system) + " |"
		rule += "---:|"
	}
	fmt.Println(head)
	fmt.Println(rule)
	rows := []string{"| delivered |", "| total time |", "| share of the allowed rate |", "| refusals (share of attempts) |", "| connections |", "| burst submitted in (one swaks after another) |"}
	for _, t := range thrs {
		if t.skipped {
			for i := range rows {
				rows[i] += " not run |"
			}
			continue
		}
		rate := float64(t.delivered) / t.total.Seconds()
		rows[0] += fmt.Sprintf(" %d |", t.delivered)
		rows[1] += fmt.Sprintf(" %.0f s |", t.total.Seconds())
		rows[2] += fmt.Sprintf(" %.0f%% |", 100*rate/allowed)
		rows[3] += fmt.Sprintf(" %d (%.1f%%) |", t.refusals, 100*float64(t.refusals)/float64(max(t.refusals+t.delivered, 1)))
		rows[4] += fmt.Sprintf(" %d |", t.connections)
		rows[5] += fmt.Sprintf(" %.1f s |", t.submitted.Seconds())
	}
	for _, r := range rows {
		fmt.Println(r)
	}
	for _, g := range greys {
		if g.err != nil {
			fmt.Printf("\n%s greylisting: %v\n", g.system, g.err)
		}
	}
	for _, t := range thrs {
		if t.err != nil {
			fmt.Printf("\n%s throttling: %v\n", t.system, t.err)
		}
	}
}

// greylistRecord is one system's greylisting and throttling figures, as
// -json writes them: a line per system, next to the printed tables.
type greylistRecord struct {
	Command  string    `json:"command"`
	At       time.Time `json:"at"`
	System   string    `json:"system"`
	Delay    float64   `json:"postgrey_delay_seconds"`
	Attempts []int     `json:"attempts,omitempty"`     // per message, in order
	Took     []float64 `json:"took_seconds,omitempty"` // per message: the 250 at intake to arrival
	RCPTs    int       `json:"rcpts_sent"`
	Throttle struct {
		N           int     `json:"n"`
		Window      float64 `json:"window_seconds"`
		Messages    int     `json:"messages"`
		Submitted   float64 `json:"submitted_seconds"` // the burst's submission, one swaks after another
		Delivered   int     `json:"delivered"`
		Total       float64 `json:"total_seconds"`
		Refusals    int     `json:"refusals"`
		Connections int     `json:"connections"`
	} `json:"throttle"`
	Error string `json:"error,omitempty"`
}

// saveGreylistJSON appends a greylistRecord per system run to path (none
// if path is empty), as saveJSON does for the load scenarios.
func saveGreylistJSON(path string, f greylistFlags, greys []greyResult, thrs []throttleResult) {
	appendJSON(path, func(enc *json.Encoder) {
		for i, g := range greys {
			if !g.skipped {
				_ = enc.Encode(greylistRecordOf(f, g, thrs[i]))
			}
		}
	})
}

// greylistRecordOf is the record of one system's two runs.
func greylistRecordOf(f greylistFlags, g greyResult, t throttleResult) greylistRecord {
	r := greylistRecord{Command: "greylist", At: time.Now(), System: g.system, Delay: f.delay.Seconds(), Attempts: g.attempts, RCPTs: g.rcpts}
	for _, d := range g.took {
		r.Took = append(r.Took, d.Seconds())
	}
	r.Throttle.N, r.Throttle.Window, r.Throttle.Messages = f.thrN, f.thrWindow.Seconds(), f.thrMessages
	r.Throttle.Submitted, r.Throttle.Delivered, r.Throttle.Total = t.submitted.Seconds(), t.delivered, t.total.Seconds()
	r.Throttle.Refusals, r.Throttle.Connections = t.refusals, t.connections
	if err := errors.Join(g.err, t.err); err != nil {
		r.Error = err.Error()
	}
	return r
}
