package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Postfix's own test tools as load generator and sink (-tools postfix):
// smtp-source and smtp-sink from Debian's postfix package. They are what
// Postfix's authors measure with, and they behave differently from this
// harness's client: smtp-source never pipelines (MAIL, RCPT, DATA and the
// message each wait for their reply: four round trips per message
// instead of two), and smtp-sink offers no CHUNKING, so a relay sends it
// DATA with dot-stuffing rather than BDAT. A relay that gains only under
// the harness's own client gains from how that client talks, not from
// what it does itself.
//
// What they cannot tell: smtp-source reports no per-message times, so a
// phase has no final dot → 250 latency, and smtp-sink keeps nothing, so
// there is no 250 → next hop time and no check of bodies, duplicates or
// losses (only its count of messages received). Those come from the Go
// tools, which run in the same rounds when -tools both.

const (
	toolsGo      = "go"
	toolsPostfix = "postfix"
	smtpSource   = "/usr/sbin/smtp-source"
	smtpSinkBin  = "/usr/sbin/smtp-sink"
	// sourceHeader is about what smtp-source adds before its -l payload
	// (From, To, Date, Message-Id and the blank line), so that a phase of
	// -size S moves messages of about S bytes with either tool set.
	sourceHeader = 150
)

// toolList expands -tools into the tool sets to run, in order.
func toolList(flag string) ([]string, error) {
	switch flag {
	case toolsGo:
		return []string{toolsGo}, nil
	case toolsPostfix:
		return []string{toolsPostfix}, nil
	case "both":
		return []string{toolsGo, toolsPostfix}, nil
	}
	return nil, fmt.Errorf("-tools: want go, postfix or both, got %q", flag)
}

// runSource runs smtp-source for spec: Sessions parallel sessions, each
// reusing its connection when spec.Reuse (-d), Messages in all. It never
// pipelines and has no rate option, so spec.Pipelining and spec.Rate do
// not apply. Accepted is its own count of completed DATA commands, which
// it writes after every message: to a file, read once it has exited,
// because through a pipe each count would wake this process while the
// systems it measures need the CPU.
func runSource(ctx context.Context, spec loadSpec) loadResult {
	ctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	args := []string{"-c", "-s", fmt.Sprint(spec.Sessions), "-m", fmt.Sprint(spec.Messages),
		"-l", fmt.Sprint(max(spec.Size-sourceHeader, 1)), "-M", "load.bench.test",
		"-f", "bench@load.bench.test", "-t", spec.Rcpts[0]}
	if len(spec.Rcpts) > 1 {
		args = append(args, "-r", fmt.Sprint(len(spec.Rcpts)))
	}
	if spec.Reuse {
		args = append(args, "-d")
	}
	res := loadResult{Codes: map[string]int{}}
	out, err := os.CreateTemp("", "smtp-source-*.out")
	if err != nil {
		res.Failed = spec.Messages
		res.Codes[errKey(err)] = res.Failed
		return res
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.CommandContext(ctx, smtpSource, append(args, spec.Addr)...)
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, &errb
	release := func() {}
	if spec.ToolGroup != nil {
		if cmd.SysProcAttr, release, err = spec.ToolGroup.procAttr(); err != nil {
			res.Failed = spec.Messages
			res.Codes[errKey(err)] = res.Failed
			return res
		}
	}
	res.Start = time.Now()
	if err = cmd.Start(); err == nil {
		release()
		err = cmd.Wait()
	} else {
		release()
	}
	res.LastAck = time.Now()
	counts, rerr := os.ReadFile(out.Name())
	res.Accepted = min(lastCount(counts), spec.Messages)
	res.Failed = spec.Messages - res.Accepted
	if err == nil {
		err = rerr
	}
	if err != nil {
		res.Codes[errKey(fmt.Errorf("smtp-source: %v: %s", err, strings.TrimSpace(errb.String())))] = res.Failed
	}
	return res
}

// lastCount is the last number of a "-c" counter: numbers separated by
// carriage returns (smtp-source: "1\r2\r3\r\n").
func lastCount(b []byte) int {
	fields := strings.FieldsFunc(string(b), func(r rune) bool { return r == '\r' || r == '\n' })
	for i := len(fields) - 1; i >= 0; i-- {
		if n, err := strconv.Atoi(strings.TrimSpace(fields[i])); err == nil {
			return n
		}
	}
	return 0
}

// psink is a running smtp-sink: it counts the messages it receives (its
// "-c" counter, "sess=N quit=N mesg=N" after each final dot) and keeps
// nothing. The counter goes to a file that watch reads every
// sinkPoll: read through a pipe, each message would wake this process
// while the systems it measures need the CPU.
type psink struct {
	address string
	cmd     *exec.Cmd
	out     *os.File
	stop    chan struct{}
	done    chan struct{}

	mu   sync.Mutex
	msgs int64 // messages received since start
	base int64 // msgs when expect was last called
	last time.Time
}

// sinkPoll is how often the sink's counter file is read: the error of a
// phase's last delivery time, against phases of seconds.
const sinkPoll = 5 * time.Millisecond

// startPSink starts smtp-sink on a free port of ip as user nobody (it
// refuses to run as root), in group g when not nil, and waits until it
// greets.
func startPSink(ip string, g *cgroup) (*psink, error) {
	addr, err := freeAddr(ip)
	if err != nil {
		return nil, err
	}
	out, err := os.CreateTemp("", "smtp-sink-*.out")
	if err != nil {
		return nil, err
	}
	os.Remove(out.Name()) // open, it stays readable; nothing is left behind
	cmd := exec.Command(smtpSinkBin, "-c", "-u", "nobody", "-h", "sink.bench.test", addr, "256")
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	release := func() {}
	if g != nil {
		if cmd.SysProcAttr, release, err = g.procAttr(); err != nil {
			out.Close()
			return nil, err
		}
	}
	err = cmd.Start()
	release()
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("smtp-sink: %w", err)
	}
	p := &psink{address: addr, cmd: cmd, out: out, stop: make(chan struct{}), done: make(chan struct{})}
	go p.watch()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return p, nil
		}
		if time.Now().After(deadline) {
			p.close()
			return nil, fmt.Errorf("smtp-sink on %s: %w", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// watch reads what the counter file gained every sinkPoll and notes when
// the count last grew.
func (p *psink) watch() {
	defer close(p.done)
	t := time.NewTicker(sinkPoll)
	defer t.Stop()
	var off int64
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		for {
			n, _ := p.out.ReadAt(buf, off)
			// Only whole counter lines count: the last one may be half
			// written.
			end := bytes.LastIndexAny(buf[:n], "\r\n")
			if end < 0 {
				break
			}
			p.note(lastLine(buf[:end]), time.Now())
			off += int64(end + 1)
			if n < len(buf) {
				break
			}
		}
	}
}

// lastLine is what follows the last CR or LF of b.
func lastLine(b []byte) string {
	return string(b[bytes.LastIndexAny(b, "\r\n")+1:])
}

// note records a counter line read at now.
func (p *psink) note(line string, now time.Time) {
	n, ok := msgCount(line)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > p.msgs {
		p.msgs, p.last = n, now
	}
}

// msgCount reads N from a counter line "sess=… quit=… mesg=N".
func msgCount(line string) (int64, bool) {
	const key = "mesg="
	i := strings.LastIndex(line, key)
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(line[i+len(key):]), 10, 64)
	return n, err == nil
}

func (p *psink) addr() string { return p.address }

func (p *psink) expect(int, []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.base, p.last = p.msgs, time.Time{}
}

func (p *psink) counts() sinkCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	return sinkCounts{Good: p.msgs - p.base, Last: p.last}
}

func (p *psink) arrivals() []int64 { return nil }

func (p *psink) close() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	close(p.stop)
	<-p.done
	p.out.Close()
}
