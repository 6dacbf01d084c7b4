package queue

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/greyrelay/greyrelay/queue/boltfile"
)

// A damaged file stops the queue, not the process.
//
// bbolt does not check its data pages: a damaged branch or leaf page
// makes its cursor index out of range (a panic) or read outside the
// mapped file (a fault). Every way into bbolt (Open and every
// transaction) runs under guard, which turns either into a
// *DamagedError that names the file and the remedy, and from then on the
// queue refuses every call with it: intake answers 451, nothing is
// delivered from a file that can no longer be trusted, and the caller
// (serve) stops on Damaged. Before bbolt's Open walks the pages of a file
// left by an unclean stop (to rebuild its freelist, in a goroutine of its
// own where no recover reaches), they are walked first with a
// bounds-checked reader of our own (queue/boltfile).
//
// A panic in the queue's own code inside a transaction is caught the same
// way; its text is kept in the error.

// DamagedError is the error every call returns once the queue file was
// found damaged.
type DamagedError struct {
	Path  string // the database file, absolute
	Cause string
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("queue file %s is damaged (%s); stop greyrelay and run "+
		"`greyrelay queue salvage -config FILE`: it keeps the damaged file as %s.damaged-TIMESTAMP "+
		"and copies every intact message into a fresh queue", e.Path, e.Cause, e.Path)
}

func (q *Queue) damage(cause string) *DamagedError {
	d := &DamagedError{Path: absPath(q.path), Cause: cause}
	if q.damaged.CompareAndSwap(nil, d) {
		close(q.damagedCh)
		return d
	}
	return q.damaged.Load()
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// Damaged is closed when the queue finds its file damaged; Err then
// returns the *DamagedError.
func (q *Queue) Damaged() <-chan struct{} { return q.damagedCh }

// Err returns the *DamagedError once the file was found damaged, or nil.
func (q *Queue) Err() error {
	if d := q.damaged.Load(); d != nil {
		return d
	}
	return nil
}

// guard runs fn, which reaches into bbolt, and turns a panic or a memory
// fault in it into a *DamagedError. Once damaged, fn is not run.
func (q *Queue) guard(fn func() error) (err error) {
	if d := q.damaged.Load(); d != nil {
		return d
	}
	defer func() {
		if r := recover(); r != nil {
			err = q.damage(fmt.Sprint(r))
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return fn()
}

// openBolt opens the file with bbolt, after boltfile.Check when bbolt would
// walk the pages itself (no freelist stored: an unclean stop), and under
// the same recover as guard.
func openBolt(path string, opts *bolt.Options) (db *bolt.DB, err error) {
	if err := precheck(path); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, &DamagedError{Path: absPath(path), Cause: fmt.Sprint(r)}
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	db, err = bolt.Open(path, 0o600, opts)
	if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch) {
		return nil, &DamagedError{Path: absPath(path), Cause: err.Error()}
	}
	return db, err
}

// precheck refuses a file whose pages bbolt's Open could not walk safely.
func precheck(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil // bbolt creates it, or reports why not
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return nil
	}
	b, unmap, err := mapFile(f, fi.Size())
	if err != nil {
		return nil // no mapping here: bbolt's own checks, under recover, only
	}
	defer unmap(b)
	pf := boltfile.New(b, os.Getpagesize())
	if !pf.Valid() {
		return &DamagedError{Path: absPath(path), Cause: "no valid meta page"}
	}
	if m := pf.Meta(); m.Freelist != boltfile.NoFreelist && m.Freelist < m.PGID {
		if _, err := pf.Page(m.Freelist); err == nil {
			return nil // a clean stop: bbolt reads the stored freelist and walks nothing
		}
	}
	if err := boltfile.Check(b, os.Getpagesize()); err != nil {
		return &DamagedError{Path: absPath(path), Cause: err.Error()}
	}
	return nil
}
