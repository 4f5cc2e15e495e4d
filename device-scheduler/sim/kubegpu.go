package sim

import (
	"context"
	"fmt"
	"slices"
	"strings"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// engineScheduler replays pods through the allocation engine: every node is
// an engine Node built from a simulated inventory, every pod an engine
// Request, and the pod goes to the node with the highest score. Equal
// placements are ordered by the experiment's node ranks, as for the
// baselines, so that policies are compared on the same order.
type engineScheduler struct {
	engine *devicescheduler.Engine
	// learn makes the engine learn the workload mix from the pods as they
	// arrive instead of being given the trace's.
	learn    bool
	nodes    []*devicescheduler.Node
	requests map[string]*devicescheduler.Request
	cur      devicescheduler.Placement
	best     devicescheduler.Placement
}

// newEngineScheduler builds the engine with the named built-in policy. With
// learn, the kubegpu policy learns the workload mix from the arriving pods,
// as it does in a cluster; otherwise it gets the trace's mix, as fgd does.
func newEngineScheduler(x *Experiment, policy string, learn bool) (Scheduler, error) {
	sp, err := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		return nil, err
	}
	cfg := devicescheduler.Config{Plugins: []types.SchedulerPlugin{sp}, Policy: policy}
	if policy == devicescheduler.PolicyKubegpu && !learn {
		w, err := workloadOf(typicalTypes(x.Original))
		if err != nil {
			return nil, err
		}
		cfg.Workload = w
	}
	e, err := devicescheduler.New(cfg)
	if err != nil {
		return nil, err
	}
	s := &engineScheduler{engine: e, learn: learn, requests: map[string]*devicescheduler.Request{}}
	for rank, spec := range x.Nodes {
		n, err := e.NewNode(spec.Name, simgpu.Inventory(Topology(spec), spec.Name), devicescheduler.Host{CPUMilli: spec.CPUMilli, MemoryMiB: spec.MemoryMiB})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", spec.Name, err)
		}
		n.SetPreference(uint32(len(x.Nodes) - rank))
		s.nodes = append(s.nodes, n)
	}
	return s, nil
}

// Topology is the simulated GPUs of a trace's node: simgpu's preset of its
// model if there is one, else GPUs of 16 GiB on two NUMA nodes.
func Topology(spec NodeSpec) simgpu.Topology {
	if preset, err := simgpu.Preset(strings.ToLower(spec.Model)); err == nil {
		return preset.WithGPUs(spec.GPUs)
	}
	return simgpu.Topology{Name: spec.Model, Model: spec.Model, GPUs: spec.GPUs, MemoryMiB: 16384, NUMANodes: min(2, spec.GPUs), GPUsPerPCIeSwitch: min(2, spec.GPUs)}
}

// workloadOf converts the trace's typical pods into the engine's mix.
func workloadOf(tts []taskType) (*devicescheduler.Workload, error) {
	out := make([]devicescheduler.TaskType, 0, len(tts))
	for _, t := range tts {
		out = append(out, devicescheduler.TaskType{
			Count: t.num, Exclusive: t.milli >= 1000, Milli: t.milli,
			Host:     devicescheduler.Host{CPUMilli: t.cpu, MemoryMiB: t.mem},
			Selector: types.Selector{IncludeModels: t.spec},
			Weight:   t.weight,
		})
	}
	return devicescheduler.NewWorkload(out)
}

// request compiles (and caches by shape) the engine request of a pod.
func (s *engineScheduler) request(p *PodSpec) *devicescheduler.Request {
	key := fmt.Sprintf("%d/%d/%d/%d/%s", p.CPUMilli, p.MemoryMiB, p.NumGPU, p.GPUMilli, strings.Join(p.GPUSpec, "|"))
	if r, ok := s.requests[key]; ok {
		return r
	}
	r := &devicescheduler.Request{Host: devicescheduler.Host{CPUMilli: p.CPUMilli, MemoryMiB: p.MemoryMiB}}
	if p.NumGPU > 0 {
		c := devicescheduler.Container{Name: "main", Count: p.NumGPU, Exclusive: p.GPUMilli >= 1000, Milli: p.GPUMilli, Topology: types.TopologyPreferred}
		c.SetSelector(types.Selector{IncludeModels: slices.Clone(p.GPUSpec)})
		r.Containers = []devicescheduler.Container{c}
	}
	s.requests[key] = r
	return r
}

func (s *engineScheduler) Schedule(p *PodSpec) bool {
	r := s.request(p)
	if s.learn {
		s.engine.Observe(r)
	}
	found := false
	for _, n := range s.nodes {
		if err := s.engine.Evaluate(n, r, &s.cur); err != nil {
			continue
		}
		if !found || s.cur.Score() > s.best.Score() {
			s.best, found = s.cur, true
		}
	}
	if !found {
		return false
	}
	if err := s.best.Node().AssumePlacement(p.Name, &s.best, r.Host); err != nil {
		panic(fmt.Sprintf("assume the engine's own placement: %v", err)) // a bug in the engine
	}
	return true
}
