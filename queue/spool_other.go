//go:build !unix

package queue

import (
	"errors"
	"math"
	"os"
)

// mapFile is not available here: openSpooled reads the file instead.
func mapFile(*os.File, int64) ([]byte, func([]byte) error, error) {
	return nil, nil, errors.New("no mmap")
}

// lockFree cannot tell here; queue/salvage relies on the operator.
func lockFree(*os.File) bool { return true }

// copyOwner has nothing to do here.
func copyOwner(from, to string) {}

// statfsFree is not available here: Options.Reserve is not kept.
func statfsFree(string) (uint64, error) { return math.MaxUint64, nil }
