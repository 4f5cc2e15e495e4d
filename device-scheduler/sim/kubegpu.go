package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// Devices are what the kubegpu policies run the allocation engine with; the
// caller gives them, as kubegpu-scheduler gives the engine the modules it
// loaded. The baselines need none.
type Devices struct {
	// Plugins are the scheduler sides of the device modules that rate the
	// nodes' devices.
	Plugins []types.SchedulerPlugin
	// Inventory returns the devices of a trace's node: its name, GPU model
	// and GPU count (NodeSpec). It is called once per node and run.
	Inventory func(node, model string, gpus int) types.Inventory
}

func (d Devices) check() error {
	if len(d.Plugins) == 0 || d.Inventory == nil {
		return errors.New("the allocation engine needs device modules: set Devices' Plugins and Inventory")
	}
	return nil
}

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

// newEngineScheduler builds the engine with the named built-in policy over
// devs. With learn, the kubegpu policy learns the workload mix from the
// arriving pods, as it does in a cluster; otherwise it gets the trace's mix,
// as fgd does.
func newEngineScheduler(x *Experiment, devs Devices, policy string, learn bool) (Scheduler, error) {
	if err := devs.check(); err != nil {
		return nil, err
	}
	cfg := devicescheduler.Config{Plugins: devs.Plugins, Policy: policy}
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
		n, err := e.NewNode(spec.Name, devs.Inventory(spec.Name, spec.Model, spec.GPUs), devicescheduler.Host{CPUMilli: spec.CPUMilli, MemoryMiB: spec.MemoryMiB})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", spec.Name, err)
		}
		n.SetPreference(uint32(len(x.Nodes) - rank))
		s.nodes = append(s.nodes, n)
	}
	return s, nil
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
