package integration

// How the package's tests are scheduled: most run in parallel, many at
// a time, and a few long real-time cases (the long set) run only when
// asked for, as CI does in a step of its own.

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// waitingParallel is how many of this package's parallel tests run at
// once when the command line does not say (-parallel N). go test's
// default, GOMAXPROCS, suits tests that compute; these mostly wait: for a
// greylisting delay, a retry schedule, a peer's start or a lease to run
// out, each using a small part of a core. On a 2-core machine, two at a
// time left the cores mostly idle and the package took over 10 minutes;
// docs/development.md has the timings at eight.
const waitingParallel = 8

// longEnv is the variable that runs the long set: tests that take
// several minutes of real time whatever the machine (postgrey's delay of
// 60 s, seven messages in a row). Without it they skip with a message;
// .ci/run sets it for one step that runs only them (the tests that call
// longSet), in the background while the other steps run.
const longEnv = "GREYRELAY_LONG"

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		n := max(waitingParallel, runtime.GOMAXPROCS(0))
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			fmt.Fprintln(os.Stderr, "integration:", err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// longSet skips a test of the long set unless GREYRELAY_LONG is set.
// Call it on the first line of a top-level test: .ci/run finds the long
// set by that line (a Test function whose body starts with longSet(t))
// and runs it with GREYRELAY_LONG=1.
func longSet(t *testing.T) {
	t.Helper()
	if os.Getenv(longEnv) == "" {
		t.Skipf("in the long set (minutes of real-time waiting): the full suite leaves it to CI's long-set step; set %s=1 to run it", longEnv)
	}
}
