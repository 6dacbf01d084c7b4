package smtpd

import (
	"sync"
	"time"
)

// Free space is checked where the queue lives at every MAIL (as Postfix's
// smtpd does) and again after the final dot (checkDisk): a statfs, that is
// a path lookup, each time; at full intake the two were about 3% of the
// relay's CPU, and one system call in about 35 per message under a client
// that does not pipeline. Both checks may reuse a measurement (after the
// dot only for a body held in memory, not for a spooled one), only while
// it is young and far above what the check needs (a gigabyte more than
// one and a half of the largest message), so near the limit every check
// measures again and the 452 comes as soon as it would without reuse. A
// disk that fills faster than that still cannot cost a message: the
// queue's own write failure is answered 451/452 (never 250).
const (
	roomFresh  = 100 * time.Millisecond // how long a measurement is reused
	roomMargin = 1 << 30                // how far above the need it must be
)

// room is the last free-space measurement.
type room struct {
	mu   sync.Mutex
	at   time.Time
	free uint64
}

// freeSpace returns the bytes available to the queue: measured now, or,
// if reuse allows, the last measurement when it is young (roomFresh) and
// leaves need with roomMargin to spare.
func (s *Server) freeSpace(need uint64, reuse bool) (uint64, error) {
	now := s.now()
	s.room.mu.Lock()
	at, free := s.room.at, s.room.free
	s.room.mu.Unlock()
	if age := now.Sub(at); reuse && age >= 0 && age < roomFresh && free >= need+roomMargin {
		return free, nil
	}
	free, err := s.diskFree(s.queueDir())
	if err != nil {
		return 0, err // measured again next time
	}
	s.room.mu.Lock()
	s.room.at, s.room.free = now, free
	s.room.mu.Unlock()
	return free, nil
}
