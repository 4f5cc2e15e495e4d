package sim

import (
	"math"
	"math/rand"
	"slices"
)

// The baseline policies of the FGD paper, as its simulator scores them: a
// node filter, a per-node integer score (higher wins, ties go to the first
// node in rank order), and a GPU choice inside the chosen node.

// cnode is a node's state for the baselines.
type cnode struct {
	spec    NodeSpec
	cpuLeft int64
	memLeft int64
	idle    []int32 // per GPU, milli
	// tags are the GPU-request classes of the pods on the node, for
	// gpuclustering: bit 0 = shared slice, bit k = k whole GPUs.
	tags uint64
	// frag caches the node's fragmentation for fgd; fragOK says it is valid.
	frag   float64
	fragOK bool
}

func (n *cnode) idleTotal() int64 {
	var s int64
	for _, v := range n.idle {
		s += int64(v)
	}
	return s
}

// allows reports whether the pod's gpu_spec admits the node's model.
func allows(spec []string, model string) bool {
	return len(spec) == 0 || slices.Contains(spec, model)
}

// fits is the artifact's filter: model, CPU and memory by actual request,
// and the GPUs.
func (n *cnode) fits(p *PodSpec) bool {
	if n.cpuLeft < p.CPUMilli || n.memLeft < p.MemoryMiB {
		return false
	}
	if p.GPUMilli == 0 {
		return true
	}
	if !allows(p.GPUSpec, n.spec.Model) {
		return false
	}
	free := 0
	for _, v := range n.idle {
		if v >= p.GPUMilli {
			free++
		}
	}
	return free >= p.NumGPU
}

// nonzeroCPU is the CPU the artifact's scores count for a pod: 100m for
// a pod that asks for none.
func nonzeroCPU(p *PodSpec) int64 {
	if p.CPUMilli == 0 {
		return 100
	}
	return p.CPUMilli
}

// bind takes the pod's resources; gpus are the GPU indexes for a sharing
// pod (one) or whole pods (NumGPU).
func (n *cnode) bind(p *PodSpec, gpus []int) {
	n.cpuLeft -= p.CPUMilli
	n.memLeft -= p.MemoryMiB
	for _, g := range gpus {
		n.idle[g] -= p.GPUMilli
	}
	switch {
	case p.GPUMilli == 0:
	case p.GPUMilli < 1000:
		n.tags |= 1
	default:
		n.tags |= 1 << min(p.NumGPU, 63)
	}
	n.fragOK = false
}

// bestFitGPU is the artifact's "best" GPU choice for a sharing pod: the
// fitting GPU with the least idle share, lowest index on ties.
func (n *cnode) bestFitGPU(milli int32) int {
	best := -1
	for g, v := range n.idle {
		if v >= milli && (best < 0 || v < n.idle[best]) {
			best = g
		}
	}
	return best
}

// wholeGPUs is the artifact's choice for whole-GPU pods: the lowest-index
// fully free GPUs.
func (n *cnode) wholeGPUs(count int) []int {
	var out []int
	for g, v := range n.idle {
		if v == 1000 && len(out) < count {
			out = append(out, g)
		}
	}
	return out
}

// scorer rates a node for a pod (higher is better) and, for sharing pods,
// may choose the GPU; gpu < 0 leaves the choice to the default.
type scorer interface {
	score(n *cnode, p *PodSpec) (score int64, gpu int)
}

// baseline is a Scheduler over cnodes with a scorer.
type baseline struct {
	nodes []*cnode
	score scorer
	// chooseGPU picks a sharing pod's GPU when the scorer leaves it.
	chooseGPU func(n *cnode, milli int32) int
	// normalize, if set, rescales the feasible nodes' scores (bestfit).
	normalize bool
	feasible  []*cnode
	scores    []int64
	gpus      []int
}

func newBaseline(x *Experiment, s scorer) *baseline {
	b := &baseline{score: s, chooseGPU: (*cnode).bestFitGPU}
	for _, spec := range x.Nodes {
		n := &cnode{spec: spec, cpuLeft: spec.CPUMilli, memLeft: spec.MemoryMiB, idle: make([]int32, spec.GPUs)}
		for g := range n.idle {
			n.idle[g] = 1000
		}
		b.nodes = append(b.nodes, n)
	}
	return b
}

func (b *baseline) Schedule(p *PodSpec) bool {
	b.feasible, b.scores, b.gpus = b.feasible[:0], b.scores[:0], b.gpus[:0]
	for _, n := range b.nodes {
		if n.fits(p) {
			b.feasible = append(b.feasible, n)
		}
	}
	if len(b.feasible) == 0 {
		return false
	}
	for _, n := range b.feasible {
		s, g := b.score.score(n, p)
		if s == math.MinInt64 { // the scorer failed: the pod fails, as in the artifact
			return false
		}
		b.scores = append(b.scores, s)
		b.gpus = append(b.gpus, g)
	}
	if b.normalize {
		normalizeMinMax(b.scores)
	}
	best := 0
	if len(b.feasible) > 1 {
		for i, s := range b.scores {
			if s > b.scores[best] {
				best = i
			}
		}
	}
	n := b.feasible[best]
	switch {
	case p.GPUMilli == 0:
		n.bind(p, nil)
	case p.NumGPU == 1 && p.GPUMilli < 1000:
		g := b.gpus[best]
		if g < 0 {
			g = b.chooseGPU(n, p.GPUMilli)
		}
		n.bind(p, []int{g})
	default:
		n.bind(p, n.wholeGPUs(p.NumGPU))
	}
	return true
}

// normalizeMinMax is the artifact's integer min-max rescaling to 0..100.
func normalizeMinMax(s []int64) {
	lo, hi := s[0], s[0]
	for _, v := range s {
		lo, hi = min(lo, v), max(hi, v)
	}
	for i, v := range s {
		if hi == lo {
			s[i] = 0
		} else {
			s[i] = (v - lo) * 100 / (hi - lo)
		}
	}
}

// randomPolicy picks a feasible node and a fitting GPU uniformly at random.
type randomPolicy struct {
	b   *baseline
	rng *rand.Rand
}

func newRandom(x *Experiment) Scheduler {
	r := &randomPolicy{rng: rand.New(rand.NewSource(x.Seed))}
	r.b = newBaseline(x, r)
	r.b.chooseGPU = func(n *cnode, milli int32) int {
		pick, seen := -1, 0
		for g, v := range n.idle {
			if v >= milli {
				seen++
				if r.rng.Intn(seen) == 0 {
					pick = g
				}
			}
		}
		return pick
	}
	return r
}

func (r *randomPolicy) Schedule(p *PodSpec) bool { return r.b.Schedule(p) }

// score draws a random score per node: the highest is a uniform pick among
// the feasible nodes.
func (r *randomPolicy) score(*cnode, *PodSpec) (int64, int) { return r.rng.Int63(), -1 }

// dotProduct (Tetris-like, as the artifact implements it) prefers the node
// whose free CPU and GPU vector has the smallest dot product with the pod's
// request, both normalised by a 128-core, 8-GPU node.
type dotProduct struct{}

func (dotProduct) score(n *cnode, p *PodSpec) (int64, int) {
	cpu := nonzeroCPU(p)
	if n.cpuLeft < cpu {
		return 0, -1
	}
	dot := float64(n.cpuLeft)/128000*float64(cpu)/128000 + float64(n.idleTotal())/8000*float64(p.TotalGPUMilli())/8000
	return int64(100 * (1 - dot/2)), -1
}

// gpuClustering packs pods of the same GPU-request class together.
type gpuClustering struct{}

func (gpuClustering) score(n *cnode, p *PodSpec) (int64, int) {
	if p.GPUMilli == 0 {
		return 0, -1
	}
	tag := uint64(1)
	if p.GPUMilli >= 1000 {
		tag = 1 << min(p.NumGPU, 63)
	}
	s := 25 * (8000 - n.idleTotal()) / 8000
	switch {
	case n.tags == tag:
		s += 75
	case n.tags&tag != 0:
		s += 50
	case n.tags == 0:
		s += 25
	}
	return s, -1
}

// gpuPacking prefers occupied GPUs, then idle GPUs on occupied nodes, then
// idle nodes.
type gpuPacking struct{}

func (gpuPacking) score(n *cnode, p *PodSpec) (int64, int) {
	if p.GPUMilli == 0 {
		return 0, -1
	}
	nFree := 0
	for _, v := range n.idle {
		if v == 1000 {
			nFree++
		}
	}
	if nFree == len(n.idle) {
		return int64(max(33-nFree, nFree)), -1
	}
	// The GPUs the pod would take, tightest first.
	idle := slices.Clone(n.idle)
	slices.Sort(idle)
	var picked []int32
	for _, v := range idle {
		if v >= p.GPUMilli && len(picked) < p.NumGPU {
			picked = append(picked, v)
		}
	}
	freeUsed, idleSum := 0, int64(0)
	for _, v := range picked {
		if v == 1000 {
			freeUsed++
		}
		idleSum += int64(v)
	}
	if freeUsed > 0 {
		return int64(max(50-freeUsed, 33)), -1
	}
	return max(100-(idleSum*100/1000)/10, 50), -1
}

// bestFit prefers the node with the least CPU and GPU left after the pod.
type bestFit struct{}

func (bestFit) score(n *cnode, p *PodSpec) (int64, int) {
	cpu := nonzeroCPU(p)
	cpuAfter, gpuAfter := n.cpuLeft-cpu, n.idleTotal()-p.TotalGPUMilli()
	if cpuAfter < 0 || gpuAfter < 0 {
		return math.MinInt64, -1
	}
	s := 0.5*float64(cpuAfter)/128000 + 0.5*float64(gpuAfter)/8000
	return int64((1 - s) * 100), -1
}
