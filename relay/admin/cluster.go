package admin

import (
	"context"
	"sync"
	"time"
)

// ClusterNode is another node of the cluster as the registry knows it
// (relay/cluster), for the status page's cluster section.
type ClusterNode struct {
	Name     string
	AdminURL string
	Version  string
	Seen     time.Time
	// ConflictWith is the admin URL of another running process with the
	// same node name, as the entry's writer saw it; empty: none.
	ConflictWith string
}

// pageNode is one node's row on the status page: its queue as its own
// admin API reports it, or why it did not answer.
type pageNode struct {
	ClusterNode
	Stats Stats
	Err   string
}

// nodeTimeout bounds each node's answer: the page must render with a node
// down.
const nodeTimeout = 2 * time.Second

// clusterNodes asks every registered node's admin API for its queue
// counters, all at once, with this node's token (the nodes share one).
func (s *Server) clusterNodes(ctx context.Context) []pageNode {
	if s.opt.Nodes == nil || s.opt.NodeStats == nil {
		return nil
	}
	nodes, err := s.opt.Nodes(ctx)
	if err != nil {
		return []pageNode{{ClusterNode: ClusterNode{Name: "(registry)"}, Err: err.Error()}}
	}
	out := make([]pageNode, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		out[i].ClusterNode = n
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, nodeTimeout)
			defer cancel()
			st, err := s.opt.NodeStats(ctx, n)
			if err != nil {
				out[i].Err = Clean(err.Error())
				return
			}
			out[i].Stats = st
		})
	}
	wg.Wait()
	return out
}
