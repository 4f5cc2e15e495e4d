package plugin

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"

	corev1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/claims"
)

// PreScore indexes the scores Filter found for a GPU pod, and skips scoring
// for pods without devices unless the plugin scores them
// (podsWithoutDevices: Score).
func (p *Plugin) PreScore(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if s := getState(cs); s != nil {
		s.scores.index()
		return nil
	}
	if getHostOnly(cs) == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score returns the engine's score of the node, which Filter computed in
// this cycle (the device cache's score of the node as it is, should Filter
// not have scored it: a node Filter passed for NodeResourcesFit to judge
// its CPU and memory ranks last). A node that filled up since is still
// ranked by Filter's score: Reserve checks again. For a pod without devices, nodes
// without devices come first, then GPU nodes by the engine's score.
func (p *Plugin) Score(ctx context.Context, cs fwk.CycleState, _ *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	s := getState(cs)
	if s == nil {
		if h := getHostOnly(cs); h != nil {
			return p.scoreHostOnly(h, ni), nil
		}
		return 0, nil
	}
	if score, ok := s.scores.get(ni.Node()); ok {
		return score, nil
	}
	capacity, free := nodeHost(ni)
	pl := placements.Get().(*devicescheduler.Placement)
	defer placements.Put(pl)
	score, v, _, err := p.tryVariants(ctx, s, ni.Node(), false, pl, func(in *devicecache.Input) (int64, error) {
		return p.cache.Evaluate(ni.Node(), in, capacity, free, pl)
	})
	if err != nil {
		// The node changed since Filter and the pod no longer fits:
		// rank it last; Reserve will check again.
		return math.MinInt64, nil
	}
	return claims.RankScore(score, v, len(s.others)+1), nil
}

// noDevices is the raw score, for a pod without devices, of a node without
// devices: above every engine score.
const noDevices = math.MaxInt64

// scoreHostOnly scores a node for a pod without devices.
func (p *Plugin) scoreHostOnly(h *hostOnlyState, ni fwk.NodeInfo) int64 {
	capacity, free := nodeHost(ni)
	pl := placements.Get().(*devicescheduler.Placement)
	defer placements.Put(pl)
	score, err := p.cache.EvaluateHostOnly(ni.Node(), &h.eval, capacity, free, pl)
	switch {
	case errors.Is(err, devicecache.ErrNoInventory):
		return noDevices
	case err != nil:
		// Devices published but unusable, or the pod's CPU or memory
		// does not fit: rank the node last.
		return math.MinInt64
	}
	return score
}

// ScoreExtensions returns the plugin itself: it normalises its scores.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore maps the engine's scores to 0..MaxNodeScore by rank: the
// best node alone gets MaxNodeScore, and the others less in the engine's
// order. Rescaling raw scores into 101 buckets instead would tie near-equal
// nodes, and the scheduler breaks ties at random on every decision, which
// spreads pods and strands GPUs (see kube-scheduler/README.md).
//
// For a pod without devices, nodes without devices get MaxNodeScore and GPU
// nodes at most half of it, in the engine's order, so that the pod goes to
// a GPU node only when the other scorers weigh strongly for it.
func (p *Plugin) NormalizeScore(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if getState(cs) == nil && getHostOnly(cs) != nil {
		normalizeHostOnly(scores)
		return nil
	}
	normalizeByRank(scores)
	return nil
}

// normalizeHostOnly normalises a pod without devices' scores: nodes without
// devices (noDevices) MaxNodeScore, the others by rank onto 0..MaxNodeScore/2.
func normalizeHostOnly(scores fwk.NodeScoreList) { normalizeRanks(scores, true) }

func normalizeByRank(scores fwk.NodeScoreList) { normalizeRanks(scores, false) }

// normalizeRanks maps scores onto 0..MaxNodeScore by rank (see
// NormalizeScore); with hostOnly, nodes without devices get MaxNodeScore
// and the others half of their rank's score. It allocates nothing: it runs
// once per cycle over every node scored.
func normalizeRanks(scores fwk.NodeScoreList, hostOnly bool) {
	buf := rankBuffers.Get().(*[]int64)
	distinct := (*buf)[:0]
	for i := range scores {
		if (!hostOnly || scores[i].Score != noDevices) && scores[i].Score != math.MinInt64 {
			distinct = append(distinct, scores[i].Score)
		}
	}
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	n := int64(len(distinct))
	for i := range scores {
		if hostOnly && scores[i].Score == noDevices {
			scores[i].Score = fwk.MaxScore
			continue
		}
		if scores[i].Score == math.MinInt64 {
			// Last whatever the others: a node DRA serves the pod on, or
			// one that no longer takes it (Reserve checks again).
			scores[i].Score = 0
			continue
		}
		r, _ := slices.BinarySearch(distinct, scores[i].Score)
		rank := n - 1 - int64(r) // 0 for the best
		score := fwk.MaxScore
		if rank > 0 {
			// 1..n-1 onto MaxNodeScore-1..0, keeping the order.
			score = (fwk.MaxScore - 1) - (rank-1)*(fwk.MaxScore-1)/max(n-2, 1)
		}
		if hostOnly {
			score /= 2
		}
		scores[i].Score = score
	}
	if cap(distinct) <= maxPooledRanks {
		*buf = distinct
		rankBuffers.Put(buf)
	}
}

// rankBuffers are normalizeRanks' scratch slices; one that grew past
// maxPooledRanks (a cycle over a very large cluster) is left to the
// garbage collector.
var rankBuffers = sync.Pool{New: func() any { b := make([]int64, 0, 1024); return &b }}

const maxPooledRanks = 1 << 14
