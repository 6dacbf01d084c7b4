package queue

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Large bodies live in files, not in the database.
//
// A body of SpoolThreshold octets or more is written by the caller into a
// BodyFile in the spool directory next to the database (path + ".bodies")
// while the message is being read, and the database keeps only the file's
// name (bucket "spool"). Why not bbolt: it never gives space back to the
// filesystem, so one burst of large messages grows the file for good; a
// large value needs a run of contiguous pages, so the file also fragments;
// a commit copies every value into page buffers; and a value is read
// through the process's mapping of the whole file, so every large body that
// was ever read stays counted in the process's resident memory. Twenty
// concurrent 10 MiB messages took the relay to 2.5 GiB of mapped file and
// 4.9 GiB of RSS that way. Small bodies stay in the database: a file costs
// two more fsyncs per message (the file and its directory), which group
// commit spares the small ones.
//
// Order of writes, so that nothing acknowledged can be lost: the file is
// written, fsync'd and closed, the spool directory is fsync'd, and only then
// is the transaction that names it committed. A crash before that commit
// leaves a file nothing names; Open removes it. A message deleted by a commit
// has its file removed after the commit; a crash in between leaves an
// orphan, removed by the next Open too.

// SpoolThreshold is the body size from which a caller should stream the body
// into a BodyFile (Queue.CreateBody) instead of passing it in memory.
const SpoolThreshold = 256 << 10

// bodyFilePrefix starts every spool file name; Open removes only such files.
const bodyFilePrefix = "body-"

// BodyFile is a message body being written to the spool. Write to it, then
// pass it as NewMessage.File; Enqueue syncs and closes it. If the message
// is not enqueued (refused, or Enqueue failed), call Discard.
type BodyFile struct {
	f    *os.File
	name string // base name in the spool directory
	n    int64
	err  error // first write error; sticky
	// sum is the CRC-32C of what was written (seal.go); summed is false
	// only for a file named by a journal record of an older greyrelay.
	sum    uint32
	summed bool
}

// CreateBody creates an empty body file in the spool directory.
func (q *Queue) CreateBody() (*BodyFile, error) {
	f, err := os.CreateTemp(q.spoolDir(), bodyFilePrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("queue: spool: %w", err)
	}
	return &BodyFile{f: f, name: filepath.Base(f.Name()), summed: true}, nil
}

// Write appends p to the body. After a failed write every later one fails.
func (b *BodyFile) Write(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.f.Write(p)
	b.n += int64(n)
	b.sum = crc32.Update(b.sum, castagnoli, p[:n])
	if err != nil {
		b.err = fmt.Errorf("queue: spool: %w", err)
	}
	return n, b.err
}

// ReadAt reads what was written, at off (io.ReaderAt), before Enqueue
// closes the file. Intake uses it to sign a spooled body and to copy it
// behind the signature into a new BodyFile.
func (b *BodyFile) ReadAt(p []byte, off int64) (int, error) { return b.f.ReadAt(p, off) }

// Len is the number of octets written so far.
func (b *BodyFile) Len() int64 { return b.n }

// Discard closes and removes a body that will not be enqueued. Calling it
// after a successful Enqueue would remove the body of a queued message: do
// not.
func (b *BodyFile) Discard() error {
	b.f.Close() // may already be closed by a failed Enqueue
	if err := os.Remove(b.f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("queue: spool: %w", err)
	}
	return nil
}

// finish makes the file's content durable and closes it (before the commit
// that names it).
func (b *BodyFile) finish() error {
	if b.err != nil {
		return b.err
	}
	if err := b.f.Sync(); err != nil {
		b.f.Close()
		return fmt.Errorf("queue: spool: %w", err)
	}
	if err := b.f.Close(); err != nil {
		return fmt.Errorf("queue: spool: %w", err)
	}
	return nil
}

func (q *Queue) spoolDir() string { return SpoolDir(q.path) }

// finishFiles syncs and closes the spool files of ms, then the spool
// directory once, so that every name the coming commit stores exists.
func (q *Queue) finishFiles(ms []NewMessage) error {
	spooled := false
	for i := range ms {
		if f := ms[i].File; f != nil {
			if err := f.finish(); err != nil {
				return err
			}
			spooled = true
		}
	}
	if !spooled {
		return nil
	}
	if err := syncDir(q.spoolDir()); err != nil {
		return fmt.Errorf("queue: spool: %w", err)
	}
	return nil
}

// removeFiles deletes spool files after the commit that dropped their
// names. A failure only leaves an orphan for the next Open.
func (q *Queue) removeFiles(names []string) {
	for _, n := range names {
		os.Remove(filepath.Join(q.spoolDir(), n))
	}
}

// sweepSpool creates the spool directory if needed and removes the body
// files nothing names: bodies of messages whose commit never happened (a
// crash while they were read or enqueued) and of messages deleted just
// before a crash. Files named by a message or kept by the quarantine stay.
// It runs in Open, before any caller can create a file; it reads only the
// spool bucket, one short entry per large message.
func (q *Queue) sweepSpool() error {
	dir := q.spoolDir()
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("queue: spool: %w", err)
		}
		// The new directory's entry must be durable before a commit
		// names a file in it.
		if err := syncDir(filepath.Dir(dir)); err != nil {
			return fmt.Errorf("queue: spool: %w", err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("queue: spool: %w", err)
	}
	if len(ents) == 0 {
		return nil
	}
	named := map[string]bool{}
	err = q.view(func(tx *bolt.Tx) error {
		collect := func(b *bolt.Bucket) {
			if b == nil {
				return
			}
			b.ForEach(func(_, v []byte) error {
				named[string(v)] = true
				return nil
			})
		}
		collect(tx.Bucket(bSpool))
		if qb := tx.Bucket(bQuarantine); qb != nil {
			collect(qb.Bucket(bSpool))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("queue: spool: %w", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), bodyFilePrefix) && !named[e.Name()] {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// Content is a message body opened for reading: a copy from the database,
// or a spool file mapped read-only into memory while it is used, so a
// large body is never copied onto the heap. Close releases it; Bytes must
// not be used after Close.
type Content struct {
	b     []byte
	unmap func([]byte) error
}

// Bytes returns the body. The slice is read-only.
func (c *Content) Bytes() []byte { return c.b }

// Len is the body's size in octets.
func (c *Content) Len() int { return len(c.b) }

// Close releases the body (unmaps a spool file).
func (c *Content) Close() error {
	if c.unmap == nil || c.b == nil {
		return nil
	}
	b := c.b
	c.b = nil
	return c.unmap(b)
}

// openSpooled maps the spool file name.
func (q *Queue) openSpooled(name string) (*Content, error) {
	f, err := os.Open(filepath.Join(q.spoolDir(), name))
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping outlives the descriptor
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() == 0 {
		return &Content{b: []byte{}}, nil
	}
	b, unmap, err := mapFile(f, fi.Size())
	if err != nil {
		// No mapping (not supported here): read it whole instead.
		b, err = io.ReadAll(f)
		return &Content{b: b}, err
	}
	return &Content{b: b, unmap: unmap}, nil
}
