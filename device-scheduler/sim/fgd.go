package sim

import (
	"cmp"
	"math"
	"slices"
	"strings"
)

// taskType is one class of the workload mix: the "typical pods" of the FGD
// artifact.
type taskType struct {
	cpu    int64 // non-zero CPU (0 counts as 100m)
	mem    int64 // mean host memory of the type's pods, MiB (not used by fgd)
	milli  int32 // per GPU; 0 for CPU-only pods
	num    int
	spec   []string
	weight float64
}

// typicalTypes groups pods by (CPU, per-GPU share, GPU count, GPU models),
// keeps the most popular classes until they cover 95% of the pods, and
// normalises their weights, as the FGD artifact does.
func typicalTypes(pods []PodSpec) []taskType {
	type key struct {
		cpu   int64
		milli int32
		num   int
		spec  string
	}
	counts := map[key]int{}
	mems := map[key]int64{}
	for i := range pods {
		p := &pods[i]
		k := key{nonzeroCPU(p), p.GPUMilli, p.NumGPU, strings.Join(p.GPUSpec, "|")}
		counts[k]++
		mems[k] += p.MemoryMiB
	}
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	// Most popular first; ties to the larger key, as the artifact sorts.
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(
			cmp.Compare(counts[b], counts[a]),
			cmp.Compare(b.cpu, a.cpu), cmp.Compare(b.milli, a.milli),
			cmp.Compare(b.num, a.num), strings.Compare(b.spec, a.spec))
	})
	var out []taskType
	covered, total := 0, len(pods)
	for _, k := range keys {
		t := taskType{cpu: k.cpu, mem: mems[k] / int64(counts[k]), milli: k.milli, num: k.num, weight: float64(counts[k])}
		if k.spec != "" {
			t.spec = strings.Split(k.spec, "|")
		}
		out = append(out, t)
		covered += counts[k]
		if float64(covered) >= 0.95*float64(total) {
			break
		}
	}
	for i := range out {
		out[i].weight /= float64(covered)
	}
	return out
}

// fgd is Fragmentation Gradient Descent as the paper's artifact implements
// it: a node's fragmentation is the popularity-weighted GPU share that each
// typical task type could not use there; a pod goes where its placement
// lowers fragmentation most, scored int(sigmoid(-ΔF/1000)·100).
type fgd struct {
	types   []taskType
	allowed map[string][]bool // node model -> per type
	// scratch aggregates, per type
	cnt   []int
	under []int64
	host  []bool
}

func newFGD(x *Experiment) Scheduler {
	f := &fgd{types: typicalTypes(x.Original), allowed: map[string][]bool{}}
	f.cnt = make([]int, len(f.types))
	f.under = make([]int64, len(f.types))
	f.host = make([]bool, len(f.types))
	b := newBaseline(x, f)
	for _, n := range b.nodes {
		if _, ok := f.allowed[n.spec.Model]; !ok {
			a := make([]bool, len(f.types))
			for t := range f.types {
				a[t] = f.types[t].milli > 0 && allows(f.types[t].spec, n.spec.Model)
			}
			f.allowed[n.spec.Model] = a
		}
	}
	return b
}

// fragmentation of a node with cpuLeft CPU and idle GPU shares.
func (f *fgd) fragmentation(model string, cpuLeft int64, idle []int32) float64 {
	allowed := f.allowed[model]
	var total int64
	for _, v := range idle {
		total += int64(v)
	}
	var sum float64
	for t := range f.types {
		tt := &f.types[t]
		if !allowed[t] || cpuLeft < tt.cpu {
			sum += tt.weight * float64(total)
			continue
		}
		cnt, under := 0, int64(0)
		for _, v := range idle {
			if v >= tt.milli {
				cnt++
			}
			under += waste(v, tt)
		}
		if cnt >= tt.num {
			sum += tt.weight * float64(under)
		} else {
			sum += tt.weight * float64(total)
		}
	}
	return sum
}

func (f *fgd) current(n *cnode) float64 {
	if !n.fragOK {
		n.frag, n.fragOK = f.fragmentation(n.spec.Model, n.cpuLeft, n.idle), true
	}
	return n.frag
}

// waste is the share of a GPU with v free that type t cannot use.
func waste(v int32, t *taskType) int64 {
	if v < t.milli {
		return int64(v)
	}
	return 0
}

func sigmoidScore(delta float64) int64 {
	return int64(100 / (1 + math.Exp(-delta/1000)))
}

func (f *fgd) score(n *cnode, p *PodSpec) (int64, int) {
	before := f.current(n)
	cpuAfter := n.cpuLeft - nonzeroCPU(p)
	if p.NumGPU == 1 && p.GPUMilli < 1000 {
		return f.scoreSharing(n, p, before, cpuAfter)
	}
	// Whole GPUs or none: take the tightest fitting GPUs.
	idle := slices.Clone(n.idle)
	if p.GPUMilli > 0 {
		order := make([]int, len(idle))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(idle[a], idle[b]) })
		taken := 0
		for _, g := range order {
			if taken < p.NumGPU && idle[g] >= p.GPUMilli {
				idle[g] -= p.GPUMilli
				taken++
			}
		}
	}
	return sigmoidScore(before - f.fragmentation(n.spec.Model, cpuAfter, idle)), -1
}

// scoreSharing tries the pod on each GPU that fits. The node's state after
// the pod's CPU is taken is aggregated per type once; each GPU then only
// adjusts its own contribution.
func (f *fgd) scoreSharing(n *cnode, p *PodSpec, before float64, cpuAfter int64) (int64, int) {
	allowed := f.allowed[n.spec.Model]
	var total int64
	for _, v := range n.idle {
		total += int64(v)
	}
	for t := range f.types {
		tt := &f.types[t]
		f.host[t] = allowed[t] && cpuAfter >= tt.cpu
		cnt, under := 0, int64(0)
		for _, v := range n.idle {
			if v >= tt.milli {
				cnt++
			}
			under += waste(v, tt)
		}
		f.cnt[t], f.under[t] = cnt, under
	}
	best, bestGPU := int64(-1), -1
	for g, v := range n.idle {
		if v < p.GPUMilli {
			continue
		}
		w := v - p.GPUMilli
		var after float64
		for t := range f.types {
			tt := &f.types[t]
			if !f.host[t] {
				after += tt.weight * float64(total-int64(p.GPUMilli))
				continue
			}
			cnt, under := f.cnt[t], f.under[t]-waste(v, tt)+waste(w, tt)
			if v >= tt.milli {
				cnt--
			}
			if w >= tt.milli {
				cnt++
			}
			if cnt >= tt.num {
				after += tt.weight * float64(under)
			} else {
				after += tt.weight * float64(total-int64(p.GPUMilli))
			}
		}
		if s := sigmoidScore(before - after); s > best {
			best, bestGPU = s, g
		}
	}
	return best, bestGPU
}
