package main

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// queueReserve is queue.reserve_percent of the filesystem that holds the
// queue at path, in octets (queue.Options.Reserve). The directory is
// created here (as queue.Open would) so that it can be measured.
func queueReserve(path string, percent int) (int64, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("queue directory: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("queue.reserve_percent: measuring %s: %w", dir, err)
	}
	return int64(st.Blocks) * int64(st.Bsize) * int64(percent) / 100, nil
}
