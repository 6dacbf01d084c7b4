package smtpd

import "github.com/greyrelay/greyrelay/queue"

// Spooling large bodies while they are read (see readBody and
// queue.SpoolThreshold).

// readResult is a body read in full: in memory (body) or, when it grew
// past queue.SpoolThreshold, in a spool file (file).
type readResult struct {
	body     []byte          // the Received header and the normalised body; nil if spooled
	file     *queue.BodyFile // the same, spooled; nil if in memory
	size     int64
	eightBit bool
	received int // Received headers in the message (not counting ours)
	// tlsOptional: the message has "TLS-Required: No" (RFC 8689 §5).
	tlsOptional bool
}

// discard removes the spool file of a body that will not be queued.
func (rb readResult) discard() {
	if rb.file != nil {
		rb.file.Discard()
	}
}

// Spooler is the optional part of Queue that takes large bodies as files
// (queue.Queue has it). Without it every body is held in memory.
type Spooler interface {
	CreateBody() (*queue.BodyFile, error)
}

// spillAt is how much normalised body readBody holds in memory before it
// moves it to the spool file, once the body is known to be large.
const spillAt = 64 << 10

// bodySpill moves a large body from the normalizer's buffer to a spool
// file as it is read. After a failure it keeps the first error and drops
// the data (the body is still read to its end, to stay in sync).
type bodySpill struct {
	q    Queue
	file *queue.BodyFile
	err  error
	head headerFacts // of the part held before spooling
}

// maybeSpill starts spooling once the body reaches queue.SpoolThreshold,
// and then writes it out whenever spillAt octets are held.
func (sp *bodySpill) maybeSpill(n *normalizer) {
	if n.fault != "" {
		return
	}
	if sp.err != nil {
		// The message will be refused: read on to stay in sync, but hold
		// nothing (the size limit still counts what was dropped).
		n.spilled += int64(len(n.out))
		n.out = n.out[:0]
		return
	}
	if sp.file == nil {
		spooler, ok := sp.q.(Spooler)
		if !ok || len(n.out) < queue.SpoolThreshold {
			return
		}
		// The header section is in this first part for any real message:
		// loop detection counts it here.
		sp.head = scanHeader(n.out[n.base:])
		if sp.file, sp.err = spooler.CreateBody(); sp.err != nil {
			return
		}
	}
	if len(n.out) >= spillAt {
		sp.flush(n)
	}
}

// flush writes what the normalizer holds to the file, if spooling.
func (sp *bodySpill) flush(n *normalizer) {
	if sp.file == nil || sp.err != nil || n.fault != "" {
		return
	}
	if _, err := sp.file.Write(n.out); err != nil {
		sp.err = err
	}
	n.spilled += int64(len(n.out))
	n.out = n.out[:0]
}

func (sp *bodySpill) discard() {
	if sp.file != nil {
		sp.file.Discard()
	}
}
