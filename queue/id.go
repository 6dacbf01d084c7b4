package queue

// NodeBits is the width of the node tag in the low bits of an ID handed
// out with Options.Node set. 24 bits of tag leave 40 for the count (10^12
// messages per database) and make two nodes with tags drawn from their
// names share one with a chance of about one in 10^5 for 10 nodes; the
// 16 hex digits of ID.String stay the same length as before.
const NodeBits = 24

const nodeMask = 1<<NodeBits - 1

// nextID is the ID after last for a node tagged node. With a tag, the
// count (the bits above the tag) goes up by one and the tag fills the low
// bits, so IDs still grow along the journal and past every ID in the
// database, whether last was a plain count written before tags, or
// carries another tag (a database moved to another node); without one,
// last+1 as before.
func nextID(last uint64, node uint32) ID {
	if node&nodeMask == 0 {
		return ID(last + 1)
	}
	return ID((last>>NodeBits+1)<<NodeBits | uint64(node&nodeMask))
}

// newID hands out the next message ID (safe for concurrent use).
func (q *Queue) newID() ID {
	for {
		last := q.lastID.Load()
		id := nextID(last, q.opt.Node)
		if q.lastID.CompareAndSwap(last, uint64(id)) {
			return id
		}
	}
}
