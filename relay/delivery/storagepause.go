package delivery

import "time"

// storagePause paces the scheduler while the queue cannot record an
// attempt's start (Begin fails: a full disk, in practice). Every due
// recipient would otherwise be claimed, fail its Begin and be found due
// again at once: a busy loop of failing commits and error lines, taking
// the CPU that the deliveries still under way need. After a failure the
// scheduler claims nothing new for storagePauseMin, doubled by each
// further failure up to storagePauseMax; a Begin that succeeds ends it.
// Outcomes are not paced (recording them frees space, and they are held
// and stored again by themselves: record.go). It is the loop's: workers
// report their Begin in a note (loop.go), which the loop applies.
type storagePause struct {
	until time.Time
	wait  time.Duration
}

const (
	storagePauseMin = time.Second
	storagePauseMax = 8 * time.Second // a queue that has room again is used within this
)

// failed notes a failed Begin at now.
func (p *storagePause) failed(now time.Time) {
	if now.Before(p.until) {
		return // workers claimed before the pause began fail with it
	}
	p.wait = min(max(2*p.wait, storagePauseMin), storagePauseMax)
	p.until = now.Add(p.wait)
}

// ok notes a Begin that succeeded.
func (p *storagePause) ok() {
	p.until, p.wait = time.Time{}, 0
}

// left reports how long the pause lasts from now, if it does.
func (p *storagePause) left(now time.Time) (time.Duration, bool) {
	if d := p.until.Sub(now); d > 0 {
		return d, true
	}
	return 0, false
}
