package cluster

import (
	"hash/fnv"

	"github.com/greyrelay/greyrelay/queue"
)

// IDTag is the tag the node named name puts in the low bits of its queue
// IDs (queue.Options.Node): the low queue.NodeBits bits of the name's
// FNV-1a hash, never zero (which would mean no tag). Node names are
// unique in a cluster (the registry reports a second process with the
// same name), so their tags differ unless two hashes meet: about one
// chance in 10^5 for ten nodes, which `greyrelay cluster status` reports
// (every node registers its tag, Node.IDTag). Derived from the name rather than
// stored, it stays the same when the node's queue moves to another host
// with the node's name.
func IDTag(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	tag := h.Sum32() & (1<<queue.NodeBits - 1)
	if tag == 0 {
		tag = 1
	}
	return tag
}
