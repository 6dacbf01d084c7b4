package events

import (
	"context"
	"os"
	"sync"
)

// fileSink appends events as JSON lines to a file, synced before the
// events leave the queue. Reopen (SIGHUP) makes the next write open the
// path again, for logrotate's rename-and-signal.
type fileSink struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func newFileSink(e *Events, path string) *sink {
	fs := &fileSink{path: path}
	e.file = fs
	return &sink{name: "file", label: "file", wake: make(chan struct{}, 1),
		send: func(_ context.Context, batch [][]byte) error { return fs.write(batch) }}
}

func (fs *fileSink) write(batch [][]byte) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.f == nil {
		f, err := os.OpenFile(fs.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return err
		}
		fs.f = f
	}
	var buf []byte
	for _, js := range batch {
		buf = append(append(buf, js...), '\n')
	}
	if _, err := fs.f.Write(buf); err != nil {
		fs.closeLocked() // opened afresh next time
		return err
	}
	return fs.f.Sync()
}

func (fs *fileSink) closeLocked() {
	if fs.f != nil {
		fs.f.Close()
		fs.f = nil
	}
}

// Reopen makes the event file be opened again at its next write (after
// logrotate moved it away). A no-op without an event file.
func (e *Events) Reopen() {
	if e == nil || e.file == nil {
		return
	}
	e.file.mu.Lock()
	e.file.closeLocked()
	e.file.mu.Unlock()
}

// Close closes the event file.
func (e *Events) Close() { e.Reopen() }
