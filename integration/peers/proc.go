package peers

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// proc is one run of a child process whose output goes to a log file. A
// goroutine waits for it, so exit is noticed at once (done closes) and the
// child never lingers as a zombie.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result; valid after done is closed
}

// startProc starts cmd with stdout and stderr appended to logPath. The
// caller sets cmd.Dir and cmd.Env.
func startProc(cmd *exec.Cmd, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	f.Close() // the child holds its own copy
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, with Wait's error. A nil
// proc (never started) counts as ended.
func (p *proc) exited() (bool, error) {
	if p == nil {
		return true, nil
	}
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// wait waits up to d for the process to end.
func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs and waits. It returns
// the process's exit error (nil for a clean exit after SIGTERM) or an error
// saying that it had to be killed.
func (p *proc) stop(grace time.Duration) error {
	if done, err := p.exited(); done {
		return err
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if p.wait(grace) {
		return p.err
	}
	// A Go program dumps every goroutine's stack to stderr on SIGQUIT:
	// what it was waiting for is the one thing a hung shutdown's test
	// needs to show.
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	p.wait(3 * time.Second)
	p.kill()
	return fmt.Errorf("%s did not exit within %v of SIGTERM; SIGQUIT (goroutine dump in its log), then killed", p.cmd.Path, grace)
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	if done, _ := p.exited(); done {
		return
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return
	}
	<-p.done
}
