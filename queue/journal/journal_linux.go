package journal

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data, and its metadata only where needed to read
// the data back (the size): the journal overwrites allocated blocks, so
// that is one flush of the device's cache, as bbolt does for its file.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
