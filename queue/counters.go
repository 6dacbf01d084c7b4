package queue

// counts are the in-memory Stats counters. Open fills them with one scan of
// the recipient bucket; every write transaction accumulates a delta of the
// same shape (see wtx) that is added only after its commit succeeded, so the
// counters always describe committed state and Stats never scans.
type counts struct {
	byStatus map[Status]int
	byReason map[string]int // live (non-final) recipients with a Reason
	msgs     int
	rcpts    int
}

func newCounts() counts {
	return counts{byStatus: map[Status]int{}, byReason: map[string]int{}}
}

// rcpt adds (sign=+1) or removes (sign=-1) one recipient.
func (c *counts) rcpt(r *Recipient, sign int) {
	c.rcpts += sign
	c.byStatus[r.Status] += sign
	if !r.Status.Final() && r.Reason != "" {
		c.byReason[r.Reason] += sign
	}
}

// add merges d into c and drops zero entries so the maps stay small.
func (c *counts) add(d counts) {
	c.msgs += d.msgs
	c.rcpts += d.rcpts
	for k, v := range d.byStatus {
		if c.byStatus[k] += v; c.byStatus[k] == 0 {
			delete(c.byStatus, k)
		}
	}
	for k, v := range d.byReason {
		if c.byReason[k] += v; c.byReason[k] == 0 {
			delete(c.byReason, k)
		}
	}
}

func (c *counts) stats() Stats {
	s := Stats{ByStatus: make(map[Status]int, len(c.byStatus)),
		ByReason: make(map[string]int, len(c.byReason)), Messages: c.msgs, Recipients: c.rcpts}
	for k, v := range c.byStatus {
		s.ByStatus[k] = v
	}
	for k, v := range c.byReason {
		s.ByReason[k] = v
	}
	return s
}
