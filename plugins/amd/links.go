package amd

import "github.com/kubegpu/kubegpu/types"

// links are the links between the GPUs:
//   - XGMI where KFD lists an enabled XGMI io_link between two GPUs of one
//     hive (both with the same non-zero hive_id), hops from its weight;
//   - a host bridge where a peer-to-peer PCIe path runs through one CPU's
//     root (two PCIe links, weight 40 or less): the nearest the link kinds
//     come to nvidia-smi's NODE, which KFD does not tell from PHB;
//
// other pairs get none: a path across sockets. Links without peer-to-peer
// DMA do not count.
func links(nodes []kfdNode, byNode map[int]int, gpus []GPU) []types.Link {
	type pair struct{ a, b int }
	hive := map[int]uint64{}
	for _, n := range nodes {
		hive[n.id] = n.props["hive_id"]
	}
	found := map[pair]types.Link{}
	var order []pair
	add := func(from int, l properties, xgmiAllowed bool) {
		to := int(min(l["node_to"], 1<<30))
		a, okA := byNode[from]
		b, okB := byNode[to]
		flags, hasFlags := l["flags"]
		if !okA || !okB || a == b || (hasFlags && (flags&linkEnabled == 0 || flags&linkNoPeerToPeer != 0)) {
			return
		}
		var link types.Link
		switch w := l["weight"]; {
		case l["type"] == linkTypeXGMI && xgmiAllowed && hive[from] != 0 && hive[from] == hive[to]:
			link = types.Link{Kind: types.LinkXGMI, Hops: xgmiHops(w), BandwidthMBps: int64(min(l["max_bandwidth"], 1<<40))}
		case l["type"] == linkTypePCIe && w <= 2*kfdWeightPCIe:
			link = types.Link{Kind: types.LinkHostBridge}
		default:
			return
		}
		if a > b {
			a, b = b, a
		}
		link.A, link.B = gpus[a].ID, gpus[b].ID
		p := pair{a, b}
		prev, seen := found[p]
		if !seen {
			order = append(order, p)
		}
		if !seen || betterLink(link, prev) {
			found[p] = link
		}
	}
	for _, n := range nodes {
		if _, ok := byNode[n.id]; !ok {
			continue
		}
		for _, l := range n.ioLinks {
			add(n.id, l, true)
		}
		// Indirect paths: their type is copied from the node's first
		// io_link, XGMI on some parts, whatever the path is.
		for _, l := range n.p2pLinks {
			add(n.id, l, false)
		}
	}
	out := make([]types.Link, 0, len(order))
	for _, p := range order {
		out = append(out, found[p])
	}
	return out
}

// xgmiHops is the XGMI hops a KFD link weight stands for: 15 a hop between
// whole GPUs; between partitions, 13 on one socket and 13 more on each
// side of a hop to another socket (41 is one hop).
func xgmiHops(w uint64) int {
	hops := w / kfdWeightPerHop
	switch {
	case w%kfdWeightPerHop == 0:
	case w == kfdWeightIntraSock:
		hops = 1
	case w > 2*kfdWeightIntraSock && (w-2*kfdWeightIntraSock)%kfdWeightPerHop == 0:
		hops = (w - 2*kfdWeightIntraSock) / kfdWeightPerHop
	default:
		hops = (w + kfdWeightPerHop/2) / kfdWeightPerHop
	}
	return int(min(max(hops, 1), types.MaxLinkHops))
}

// betterLink reports whether a, seen from one end of a pair, says more
// than b, seen from the other: XGMI over PCIe, fewer hops, more bandwidth.
func betterLink(a, b types.Link) bool {
	if a.Kind != b.Kind {
		return a.Kind == types.LinkXGMI
	}
	if a.Hops != b.Hops {
		return a.Hops < b.Hops
	}
	return a.BandwidthMBps > b.BandwidthMBps
}
