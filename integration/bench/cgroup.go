package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A cgroup (version 2) per system under test counts what /proc cannot:
// the CPU time of every process the system ever ran during a phase,
// including those that forked and exited in between (Exim forks a
// process per connection and per delivery, and a delivery process may
// be re-parented to init, whose reaped-children time we cannot read),
// and it lets `perf stat -G` count the system calls of all of them. Each
// system is started inside its cgroup (clone3 with CLONE_INTO_CGROUP),
// so none of its processes escapes; Postfix, which daemonizes, is moved
// in right after it starts and its master's later children follow.

// cgroupRoot is where this harness makes its cgroups: one directory per
// benchmark process below the cgroup2 mount.
type cgroupRoot struct {
	mount string // the cgroup2 mount point
	rel   string // this process's directory, relative to mount
}

// cgroup is one system's (or the load tools') group.
type cgroup struct {
	path string // absolute directory
	rel  string // relative to the cgroup2 mount, as perf -G names it
}

// cgroup2Mount finds the cgroup2 filesystem in a /proc/mounts text:
// /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified in hybrid
// mode.
func cgroup2Mount(mounts string) (string, error) {
	sc := bufio.NewScanner(strings.NewReader(mounts))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[2] == "cgroup2" {
			return f[1], nil
		}
	}
	return "", errors.New("no cgroup2 filesystem mounted")
}

// newCgroupRoot makes this process's directory below the cgroup2 mount.
func newCgroupRoot() (*cgroupRoot, error) {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return nil, err
	}
	mount, err := cgroup2Mount(string(b))
	if err != nil {
		return nil, err
	}
	rel := fmt.Sprintf("greyrelay-bench-%d", os.Getpid())
	if err := os.Mkdir(filepath.Join(mount, rel), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return &cgroupRoot{mount: mount, rel: rel}, nil
}

// group makes a fresh child group; a leftover of the same name (an
// earlier round's) is emptied and removed first.
func (r *cgroupRoot) group(name string) (*cgroup, error) {
	rel := r.rel + "/" + name
	g := &cgroup{path: filepath.Join(r.mount, rel), rel: rel}
	if _, err := os.Stat(g.path); err == nil {
		g.remove()
	}
	if err := os.Mkdir(g.path, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return g, nil
}

// remove removes the harness's directory (its groups must be gone).
func (r *cgroupRoot) remove() { _ = os.Remove(filepath.Join(r.mount, r.rel)) }

// procs lists the processes in the group now.
func (g *cgroup) procs() []int {
	b, err := os.ReadFile(filepath.Join(g.path, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// add moves a running process into the group; its later children are
// born there.
func (g *cgroup) add(pid int) error {
	return os.WriteFile(filepath.Join(g.path, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// cpuSeconds is the CPU time of every process that has run in the group.
func (g *cgroup) cpuSeconds() (float64, error) {
	b, err := os.ReadFile(filepath.Join(g.path, "cpu.stat"))
	if err != nil {
		return 0, err
	}
	us, err := parseCPUStat(string(b))
	return float64(us) / 1e6, err
}

// parseCPUStat reads usage_usec from a cgroup2 cpu.stat file.
func parseCPUStat(text string) (int64, error) {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("cpu.stat: no usage_usec")
}

// procAttr starts a command inside the group. The returned function
// closes the directory handle once the command has started.
func (g *cgroup) procAttr() (*syscall.SysProcAttr, func(), error) {
	fd, err := unix.Open(g.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("cgroup: %w", err)
	}
	return &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}, func() { _ = unix.Close(fd) }, nil
}

// remove kills whatever is left in the group and removes it.
func (g *cgroup) remove() {
	kill := filepath.Join(g.path, "cgroup.kill")
	for range 100 {
		pids := g.procs()
		if len(pids) == 0 {
			break
		}
		if os.WriteFile(kill, []byte("1"), 0o644) != nil {
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = os.Remove(g.path)
}
