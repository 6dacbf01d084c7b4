//go:build unix

package queue

import (
	"os"
	"syscall"
)

// mapFile maps size octets of f read-only and shared: the pages stay in the
// page cache, counted in our resident memory only while mapped.
func mapFile(f *os.File, size int64) ([]byte, func([]byte) error, error) {
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, syscall.Munmap, nil
}

// lockFree reports whether no process holds f's lock (bbolt's flock): it
// takes the lock and lets it go at once.
func lockFree(f *os.File) bool {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return true
}

// copyOwner gives to the owner and group of from (when run as root, so
// that a queue salvaged by root stays the relay's), ignoring failures: an
// operator who is the relay's user owns both already.
func copyOwner(from, to string) {
	fi, err := os.Stat(from)
	if err != nil {
		return
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		os.Chown(to, int(st.Uid), int(st.Gid))
	}
}

// statfsFree is the space on dir's filesystem available to an
// unprivileged user, in octets.
func statfsFree(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}
