package smtpd

import (
	"net"
	"sync"
	"time"
)

// Reply batching.
//
// go-smtp flushes every reply line to the socket: a pipelined
// MAIL/RCPT/DATA group costs three write(2) calls and three wakeups of the
// client, and an EHLO reply one per line. RFC 2920 §3.2 has a pipelining
// server "store responses to grouped ... commands in an internal buffer so
// they can [be] sent as a unit", and "send all pending responses
// immediately whenever the local TCP input buffer is emptied": it must
// never wait for input with replies unsent, or the client, waiting for
// them, deadlocks with it.
//
// So replies are kept in a small buffer and written when the server is
// about to read from the socket (go-smtp's own reader has run dry), when
// the connection closes, when the write deadline is brought forward, and
// when the buffer passes batchLimit. Every wait for the client is a read,
// so nothing the server said is held back while it waits. TLS records
// (STARTTLS, implicit TLS) are batched the same way: the buffer sits under
// the *tls.Conn, which go-smtp still sees where it looks for one.

// batchLimit bounds the buffer: a few replies, or one TLS record.
const batchLimit = 4096

// batchWriter buffers writes to a socket. It is safe for concurrent use
// (a shutdown goodbye comes from another goroutine). The first write error
// is sticky: after part of a batch is lost, nothing more may follow it.
type batchWriter struct {
	nc net.Conn

	mu       sync.Mutex
	buf      []byte
	err      error
	deadline time.Time // the write deadline, as last set
	applied  time.Time // the socket's: deadline is passed on at the next write
	cut      time.Time // set by cutDeadline: no later deadline may replace it
}

// write buffers b, or writes it at once when it is too large to buffer.
func (w *batchWriter) write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	if len(w.buf)+len(b) > batchLimit {
		if err := w.flushLocked(); err != nil {
			return 0, err
		}
		if len(b) >= batchLimit {
			return w.writeLocked(b)
		}
	}
	if w.buf == nil {
		w.buf = make([]byte, 0, 512)
	}
	w.buf = append(w.buf, b...)
	return len(b), nil
}

// flush writes what is buffered, under the current write deadline.
func (w *batchWriter) flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flushLocked()
}

func (w *batchWriter) flushLocked() error {
	if w.err != nil || len(w.buf) == 0 {
		return w.err
	}
	_, err := w.writeLocked(w.buf)
	w.buf = w.buf[:0]
	return err
}

// writeLocked writes b to the socket under the current deadline. go-smtp
// sets a deadline before every reply; passing it on only here saves the
// runtime's timer work for the replies that share a write.
func (w *batchWriter) writeLocked(b []byte) (int, error) {
	if !w.deadline.Equal(w.applied) {
		if err := w.nc.SetWriteDeadline(w.deadline); err != nil {
			w.err = err
			return 0, err
		}
		w.applied = w.deadline
	}
	n, err := w.nc.Write(b)
	w.err = err
	return n, err
}

// setDeadline sets the write deadline, passed on to the socket at its
// next write (writeLocked). Buffered data was written, as far as its
// writer knows, under the deadline then in force: if the new one is
// earlier (crypto/tls sets "now" after its close_notify alert, so that
// nothing more is written) the buffer is flushed first. A later deadline
// (go-smtp sets now+WriteTimeout before every reply) only gives the
// buffer more time, so it stays.
func (w *batchWriter) setDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.cut.IsZero() && !earlier(t, w.cut) {
		t = w.cut // a goodbye's bound stands against the session's own deadlines
	}
	if len(w.buf) > 0 && earlier(t, w.deadline) {
		w.flushLocked() // a failure is kept in w.err
	}
	w.deadline = t
	return nil
}

// cutDeadline sets the write deadline without flushing first and without
// waiting for a write in progress, which it bounds too: for a goodbye that
// must not take longer than t, whatever is buffered.
func (w *batchWriter) cutDeadline(t time.Time) {
	w.nc.SetWriteDeadline(t)
	w.mu.Lock()
	w.deadline, w.applied, w.cut = t, t, t
	w.mu.Unlock()
}

// close flushes and drops the buffer; later writes fail with err.
func (w *batchWriter) close(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
	if w.err == nil {
		w.err = err
	}
	w.buf = nil
}

// earlier reports whether deadline t comes before u; the zero time is no
// deadline, later than any other.
func earlier(t, u time.Time) bool {
	return !t.IsZero() && (u.IsZero() || t.Before(u))
}
