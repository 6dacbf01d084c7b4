// Command bench measures greyrelay side by side with Postfix and the
// other relays a user could pick instead (OpenSMTPD, Exim, chasquid,
// maddy: mtas.go) on this machine, beside the load tools' own rate, and
// prints the results as Markdown tables (BENCHMARKS.md publishes them
// with the commands that produced them).
//
//	go run ./integration/bench compare -smoke -tools both   # every system once, 500 messages: does it all run?
//	go run ./integration/bench compare -n 20000 -size 4096 -c 20 -reuse=true -rounds 2
//	go run ./integration/bench sizes
//	go run ./integration/bench storm -storm 100000
//	go run ./integration/bench scale -recipients 1000000
//	go run ./integration/bench profile -seconds 20
//	go run ./integration/bench disk
//	go run ./integration/bench greylist
//	go run ./integration/bench cluster -n 20000 -rounds 2
//
// Design notes:
//
//   - Every party is a real process or server on its own loopback address:
//     the load generator (raw SMTP, so nothing sits between the wire and
//     the clock), the system under test (the greyrelay binary built from
//     this tree, or a private Postfix instance from integration/peers in
//     its own directory) and a sink (go-smtp, counting and hashing, keeping
//     nothing). The load generator and the sink run in this process and
//     share the CPUs with the system under test, as they would for Postfix.
//   - A comparison alternates the systems round by round (A B, then B A) on
//     fresh queues in the same temporary directory, hence on the same disk,
//     so that drift on a shared machine and the disk's state hit both.
//   - Every system runs in a cgroup of its own, so its CPU time is that of
//     every process it ran during a phase (cpu.stat), and `perf stat -G`
//     counts its system calls and fsync/fdatasync calls. Without cgroup2,
//     CPU comes from /proc: utime+stime (plus reaped children: Postfix's
//     master collects its daemons' time when they exit) as a before/after
//     difference. Memory is sampled every 100 ms as Σ
//     VmRSS and Σ Pss over the system's processes (Postfix's are found by
//     working directory: every daemon chdirs to its queue); disk flushes
//     are the "flushes completed" counter of /proc/diskstats for the
//     queue's device, or writes completed on kernels without it.
//   - Nothing is unbounded: every phase has a message count and a timeout,
//     every process started is stopped on exit (also after Ctrl-C or an
//     error), and only loopback addresses are used.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
)

const usageText = `usage: go run ./integration/bench COMMAND [flags]

commands:
  compare   greyrelay vs Postfix, OpenSMTPD, Exim, chasquid, maddy and the load tools alone:
            N messages of S bytes over C sessions, alternating rounds
  sizes     compare at 1 KiB, 100 KiB and 10 MiB
  storm     deferral-storm isolation: a healthy stream with and without a black-holed backlog
  scale     a big deferred queue: RSS, database size, restart time, idle CPU, queue list
  profile   CPU profile of greyrelay under the compare load (perf)
  disk      fsync latency of the disk holding the temporary directory
  greylist  greyrelay vs Postfix through a real postgrey and a throttling destination
  cluster   1 node vs 3 nodes behind HAProxy, without and with Redis sharing

Run "go run ./integration/bench COMMAND -h" for a command's flags. Needs root
(Postfix switches users) and the postfix package for Postfix rounds; the
other relays are fetched into -peer-cache on first use (apt-get download,
go mod download).
`

// common are the flags of every command.
type common struct {
	binary   string
	keep     bool
	jsonPath string
	sets     setFlags
	cpuProf  string
}

// setFlags collects repeated -set path=value flags.
type setFlags []string

func (s *setFlags) String() string { return strings.Join(*s, ",") }
func (s *setFlags) Set(v string) error {
	if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
		return fmt.Errorf("want section.key=value, got %q", v)
	}
	*s = append(*s, v)
	return nil
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.binary, "binary", "", "greyrelay binary to run (default: build ./cmd/greyrelay)")
	fs.BoolVar(&c.keep, "keep", false, "keep the workspace (queues, configs, logs) under $TMPDIR")
	fs.StringVar(&c.jsonPath, "json", "", "append every phase's results to this file as JSON lines")
	fs.StringVar(&c.cpuProf, "cpuprofile", "", "write a CPU profile of the harness itself (load generator and sink) to this file")
	fs.Var(&c.sets, "set", "override a greyrelay config key for every relay started, e.g. -set delivery.max_per_destination=20 (repeatable; the value is YAML)")
}

// setup creates the workspace and the relay binary.
func (c *common) setup() (*env, string, error) {
	e, err := newEnv("", c.keep)
	if err != nil {
		return nil, "", err
	}
	e.sets = c.sets
	bin, err := buildRelay(e, c.binary)
	if err == nil && c.cpuProf != "" {
		err = e.profileHarness(c.cpuProf)
	}
	if err != nil {
		e.close()
		return nil, "", err
	}
	return e, bin, nil
}

func numCPU() int { return runtime.NumCPU() }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usageText)
		os.Exit(2)
	}
	// The peers' helpers ask testing.Short (peers.SkipShort), which
	// panics unless the testing flags are registered and parsed; the
	// commands parse their own flag sets, so these stay at their defaults.
	testing.Init()
	if err := flag.CommandLine.Parse(nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// The harness shares the machine with the system under test, so it
	// should take as little CPU as it can: its heap is small and GOGC=100
	// made it collect several times a second. The relay and Postfix it
	// starts are not affected (the relay sets its own; see tuneGC).
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(400)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cmds := map[string]func(context.Context, []string) error{
		"compare": runCompare, "sizes": runSizes, "storm": runStorm,
		"scale": runScale, "profile": runProfile, "disk": runDisk, "greylist": runGreylist,
		"cluster": runCluster,
	}
	f, ok := cmds[os.Args[1]]
	if !ok {
		fmt.Fprint(os.Stderr, usageText)
		os.Exit(2)
	}
	if err := protect(func() error { return f(ctx, os.Args[2:]) }); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// protect turns a tb.Fatalf panic into an error. The panic unwinds
// through the command's deferred env.close, so every process is stopped
// before we get here.
func protect(f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			ft, ok := v.(fatal)
			if !ok {
				panic(v)
			}
			err = errors.New(ft.msg)
		}
	}()
	return f()
}
