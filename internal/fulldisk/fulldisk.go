// Package fulldisk lets a test stand a full disk in without root or a
// small filesystem: a file size limit (RLIMIT_FSIZE) makes every write
// past it fail with EFBIG, as ENOSPC would, while files already allocated
// below it (the queue's journal) still take writes. It is for tests only.
//
// The limit is the whole process's, and go test itself writes a log of
// the files a test opens (for its cache) that could meet it; a test that
// sets one therefore runs alone in a child process of the test binary
// (RunAlone), or at least never in parallel with another.
package fulldisk

import (
	"bytes"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
)

// childEnv marks the child process RunAlone starts.
const childEnv = "GREYRELAY_TEST_FULLDISK_CHILD"

// RunAlone reports whether the calling test should go on: in the test
// binary's own process it runs that test (a top-level one) alone in a
// child process, fails t unless it passed there, and returns false; in
// the child it returns true.
func RunAlone(t *testing.T) bool {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
		t.Fatalf("%s in a child process: %v\n%s", t.Name(), err, out)
	}
	return false
}

// Limit stops every file of this process from growing past limit octets,
// with SIGXFSZ ignored so that such a write fails with EFBIG instead of
// killing the process. The function it returns lifts the limit again; it
// may be called more than once, and runs when the test ends anyway.
func Limit(t testing.TB, limit uint64) (restore func()) {
	t.Helper()
	restore, err := Set(limit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restore)
	return restore
}

// Set is Limit for a goroutine other than the test's (a peer's script),
// where a test may not stop: it returns the error instead, and the caller
// lifts the limit itself (restore may be called more than once).
func Set(limit uint64) (restore func(), err error) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		return nil, err
	}
	signal.Ignore(syscall.SIGXFSZ)
	lim := old
	lim.Cur = min(limit, old.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		signal.Reset(syscall.SIGXFSZ)
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old)
			signal.Reset(syscall.SIGXFSZ)
		})
	}, nil
}
