package sim

import (
	"fmt"
	"math"
	"math/rand" // the trace artifact's random sequence is math/rand's; v2 would change every workload
	"slices"
	"strings"
)

// Experiment is one replay of a trace: the cluster, the inflated workload in
// arrival order, and the node order that breaks score ties. It is built once
// per seed and shared, read-only, by every policy's Run.
type Experiment struct {
	Seed int64
	// Nodes are the GPU nodes, in tie-break order.
	Nodes []NodeSpec
	// Pods are the arriving pods, in order.
	Pods []PodSpec
	// TotalGPUs is the cluster's GPU count.
	TotalGPUs int
	// Original is the pod list as given, for policies that learn the
	// workload mix from it (fgd).
	Original []PodSpec
}

// NewExperiment builds the workload of one seed as the FGD paper's
// simulator does (Weng et al., USENIX ATC 2023, artifact
// kubernetes-scheduler-simulator): GPU nodes only; pods sorted by name and
// shuffled; pods drawn at random from the original list and appended until
// the arrived GPU request would pass inflate × the cluster's GPU capacity;
// nodes ranked by a random permutation, which breaks score ties.
func NewExperiment(nodes []NodeSpec, pods []PodSpec, seed int64, inflate float64) (*Experiment, error) {
	if inflate <= 0 || math.IsNaN(inflate) || math.IsInf(inflate, 0) {
		return nil, fmt.Errorf("inflate must be a positive number, got %v", inflate)
	}
	var gpuNodes []NodeSpec
	total := 0
	for _, n := range nodes {
		if n.GPUs > 0 {
			gpuNodes = append(gpuNodes, n)
			total += n.GPUs
		}
	}
	if total == 0 {
		return nil, fmt.Errorf("the node list has no GPU nodes")
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("the pod list is empty")
	}
	slices.SortFunc(gpuNodes, func(a, b NodeSpec) int { return strings.Compare(a.Name, b.Name) })
	orig := slices.Clone(pods)
	slices.SortStableFunc(orig, func(a, b PodSpec) int { return strings.Compare(a.Name, b.Name) })

	rng := rand.New(rand.NewSource(seed))
	rng.Int() // the artifact draws once before shuffling
	arrival := slices.Clone(orig)
	rng.Shuffle(len(arrival), func(i, j int) { arrival[i], arrival[j] = arrival[j], arrival[i] })

	var podTotal int64
	for _, p := range arrival {
		podTotal += p.TotalGPUMilli()
	}
	target := int64(inflate * float64(total) * 1000)
	if podTotal < target {
		for i := 0; ; i++ {
			c := orig[rng.Intn(len(orig))]
			// The artifact compares the per-GPU share, not the pod's total,
			// with the target; kept so that workloads match its figures.
			if podTotal+int64(c.GPUMilli) > target {
				break
			}
			podTotal += c.TotalGPUMilli()
			c.Name = fmt.Sprintf("%s-tuned-%d", c.Name, i)
			arrival = append(arrival, c)
		}
	} else {
		for podTotal > target && len(arrival) > 0 {
			j := rng.Intn(len(arrival))
			podTotal -= arrival[j].TotalGPUMilli()
			arrival = slices.Delete(arrival, j, j+1)
		}
	}
	perm := rng.Perm(len(gpuNodes))
	ranked := make([]NodeSpec, len(gpuNodes))
	for i, n := range gpuNodes {
		ranked[perm[i]] = n
	}
	return &Experiment{Seed: seed, Nodes: ranked, Pods: arrival, TotalGPUs: total, Original: pods}, nil
}

// Run is the outcome of one policy on one experiment.
type Run struct {
	Policy string
	Seed   int64
	// Curve[a] is the GPU allocation (% of capacity) when a% of the
	// capacity had arrived, for a = 0..len(Curve)-1.
	Curve []float64
	// Placed and Failed count pods.
	Placed, Failed int
}

// AllocAt returns the allocation at a% arrived, or NaN if the run did not
// get that far.
func (r Run) AllocAt(a int) float64 {
	if a < 0 || a >= len(r.Curve) {
		return math.NaN()
	}
	return r.Curve[a]
}

// Scheduler places pods of one experiment; policies implement it.
type Scheduler interface {
	// Schedule places pod p or reports that it fits nowhere.
	Schedule(p *PodSpec) bool
}

// Replay schedules the experiment's pods in order and measures the
// allocation curve as the artifact's analysis does: after every pod the
// arrived and allocated GPU shares are recorded; the curve's value at a%
// arrived is the mean allocation over the records whose arrived share rounds
// (half to even) to a%, or to a±1% when none does. progress, if not nil, is
// called after every pod.
func Replay(x *Experiment, policy string, s Scheduler, progress func()) Run {
	run := Run{Policy: policy, Seed: x.Seed}
	unit := float64(x.TotalGPUs) * 10 // milli per percent of capacity
	type rec struct {
		arrived int
		alloc   float64
	}
	recs := make([]rec, 0, len(x.Pods))
	var arrived, used int64
	for i := range x.Pods {
		p := &x.Pods[i]
		arrived += p.TotalGPUMilli()
		if s.Schedule(p) {
			used += p.TotalGPUMilli()
			run.Placed++
		} else {
			run.Failed++
		}
		recs = append(recs, rec{
			arrived: int(math.RoundToEven(float64(arrived) / unit)),
			alloc:   math.Round(float64(used)/unit*100) / 100,
		})
		if progress != nil {
			progress()
		}
	}
	top := 0
	for _, r := range recs {
		top = max(top, r.arrived)
	}
	sum := make([]float64, top+2)
	cnt := make([]int, top+2)
	for _, r := range recs {
		sum[r.arrived] += r.alloc
		cnt[r.arrived]++
	}
	run.Curve = make([]float64, top+1)
	for a := 0; a <= top; a++ {
		if cnt[a] > 0 {
			run.Curve[a] = sum[a] / float64(cnt[a])
			continue
		}
		var s float64
		var c int
		for _, b := range []int{a - 1, a, a + 1} {
			if b >= 0 && b <= top {
				s += sum[b]
				c += cnt[b]
			}
		}
		if c > 0 {
			run.Curve[a] = s / float64(c)
		} else {
			run.Curve[a] = math.NaN()
		}
	}
	return run
}
