package simgpu

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/plugins/gpulink"
	"github.com/kubegpu/kubegpu/types"
)

// Name is the module's name; its options are given as simgpu.KEY=VALUE.
const Name = "simgpu"

// Vendor is the Device.Vendor of simulated GPUs. They stand in for NVIDIA
// GPUs (they serve nvidia.com/gpu requests) but are rated by this module.
const Vendor = "simgpu.kubegpu.io"

// CDIKind is the CDI vendor/class of simulated GPUs.
const CDIKind = "kubegpu.io/simgpu"

// Options the node side understands.
const (
	// OptionPreset names a built-in topology (see Presets).
	OptionPreset = "preset"
	// OptionTopology is the path of a topology file; excludes OptionPreset.
	OptionTopology = "topology"
	// OptionGPUs overrides the topology's GPU count (NVLinks beyond it are dropped).
	OptionGPUs = "gpus"
	// OptionUnhealthy lists GPU indexes that are unhealthy, e.g. "2,5".
	OptionUnhealthy = "unhealthy"
	// OptionHealthFile names a file re-read on every discovery that lists
	// unhealthy GPU indexes, comma- or line-separated; a missing file means
	// all healthy. Lets tests and demos fail a GPU at run time.
	OptionHealthFile = "health-file"
	// OptionEdits is "env" (NVIDIA_VISIBLE_DEVICES, the default) or "cdi"
	// (CDI device names kubegpu.io/simgpu=gpuN).
	OptionEdits = "edits"
	// OptionEnforcerRoot turns on the enforcer stand-in (see
	// EnforcerContainerDir): the directory the containers' limits files
	// are kept in. The GPUs then publish sliceEnforcer "simulated".
	OptionEnforcerRoot = "enforcer-root"
)

var nodeOptions = []string{OptionPreset, OptionTopology, OptionGPUs, OptionUnhealthy, OptionHealthFile, OptionEdits, OptionEnforcerRoot}

// NewModule returns the simulated-GPU module.
func NewModule() types.Module { return module{} }

type module struct{}

func (module) Name() string { return Name }

// SchedulerPlugin rates simulated GPUs as the NVIDIA module rates real ones.
// It takes no options.
func (module) SchedulerPlugin(_ context.Context, cfg types.PluginConfig) (types.SchedulerPlugin, error) {
	if err := cfg.CheckOptions(Name); err != nil {
		return nil, fmt.Errorf("simgpu: %w", err)
	}
	return scheduler{}, nil
}

// NodePlugin builds the node side from the topology the options name.
func (module) NodePlugin(ctx context.Context, cfg types.PluginConfig) (types.NodePlugin, error) {
	if err := cfg.CheckOptions(Name, nodeOptions...); err != nil {
		return nil, fmt.Errorf("simgpu: %w", err)
	}
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("simgpu: the node name is needed to give GPUs node-unique UUIDs")
	}
	opts := cfg.Options
	var (
		topo types.Inventory
		t    Topology
		err  error
	)
	switch {
	case opts[OptionPreset] != "" && opts[OptionTopology] != "":
		return nil, fmt.Errorf("simgpu: set %s.%s or %s.%s, not both", Name, OptionPreset, Name, OptionTopology)
	case opts[OptionPreset] != "":
		t, err = Preset(opts[OptionPreset])
	case opts[OptionTopology] != "":
		t, err = LoadTopology(opts[OptionTopology])
	default:
		return nil, fmt.Errorf("simgpu: set %s.%s=NAME (one of %s) or %s.%s=FILE", Name, OptionPreset, strings.Join(Presets(), ", "), Name, OptionTopology)
	}
	if err != nil {
		return nil, fmt.Errorf("simgpu: %w", err)
	}
	if s := opts[OptionGPUs]; s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxGPUs {
			return nil, fmt.Errorf("simgpu: %s must be 1..%d, got %q", OptionGPUs, MaxGPUs, s)
		}
		t = t.WithGPUs(n)
	}
	unhealthy, err := parseIndexes(opts[OptionUnhealthy], t.GPUs)
	if err != nil {
		return nil, fmt.Errorf("simgpu: %s: %w", OptionUnhealthy, err)
	}
	edits := opts[OptionEdits]
	switch edits {
	case "", "env":
		edits = "env"
	case "cdi":
	default:
		return nil, fmt.Errorf("simgpu: %s must be env or cdi, got %q", OptionEdits, edits)
	}
	topo = Inventory(t, cfg.NodeName)
	var enf *enforcer
	if root := opts[OptionEnforcerRoot]; root != "" {
		if enf, err = newEnforcer(root); err != nil {
			return nil, err
		}
		for i := range topo.Devices {
			topo.Devices[i].SliceEnforcer = types.EnforcerSimulated
		}
	}
	klog.FromContext(ctx).V(2).Info("Simulated GPUs ready", "topology", t.Name, "gpus", t.GPUs, "model", t.Model, "edits", edits, "enforcer", enf != nil)
	return &node{inv: topo, unhealthy: unhealthy, healthFile: opts[OptionHealthFile], cdi: edits == "cdi", enforcer: enf}, nil
}

// WithGPUs returns the topology cut or grown to n GPUs.
func (t Topology) WithGPUs(n int) Topology {
	t.GPUs = n
	t.NUMANodes = min(t.NUMANodes, n)
	t.GPUsPerPCIeSwitch = min(t.GPUsPerPCIeSwitch, n)
	t.NVLinks = slices.DeleteFunc(slices.Clone(t.NVLinks), func(l NVLink) bool { return l.A >= n || l.B >= n })
	return t
}

// Inventory is the inventory a node with topology t reports. UUIDs are
// derived from the node name, so they are stable and unique across nodes.
func Inventory(t Topology, nodeName string) types.Inventory {
	var inv types.Inventory
	for i := 0; i < t.GPUs; i++ {
		inv.Devices = append(inv.Devices, types.Device{
			ID:                fmt.Sprintf("gpu%d", i),
			Index:             i,
			UUID:              uuid(nodeName, i),
			Vendor:            Vendor,
			Model:             t.Model,
			MemoryMiB:         t.MemoryMiB,
			ComputeUnits:      t.ComputeUnits,
			ComputeCapability: t.ComputeCapability,
			NUMANode:          t.numaNode(i),
			PCIBusID:          fmt.Sprintf("0000:%02x:00.0", 0x10+i),
			Health:            types.Healthy,
		})
	}
	nvlink := map[[2]int]int{}
	for _, l := range t.NVLinks {
		nvlink[[2]int{min(l.A, l.B), max(l.A, l.B)}] = l.Count
	}
	for i := 0; i < t.GPUs; i++ {
		for j := i + 1; j < t.GPUs; j++ {
			l := types.Link{A: inv.Devices[i].ID, B: inv.Devices[j].ID}
			switch count, ok := nvlink[[2]int{i, j}]; {
			case t.NVSwitch:
				l.Kind = types.LinkNVSwitch
			case ok:
				l.Kind, l.Count = types.LinkNVLink, count
			case t.pcieSwitch(i) == t.pcieSwitch(j):
				l.Kind = types.LinkPCIeSwitch
			case t.numaNode(i) == t.numaNode(j):
				l.Kind = types.LinkHostBridge
			default:
				l.Kind = types.LinkCrossSocket
			}
			inv.Links = append(inv.Links, l)
		}
	}
	return inv
}

// uuid makes a GPU UUID in NVIDIA's format from the node name and index.
func uuid(nodeName string, i int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("simgpu/%s/%d", nodeName, i)))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// parseIndexes parses a comma- or newline-separated list of GPU indexes.
func parseIndexes(s string, gpus int) (map[int]bool, error) {
	out := map[int]bool{}
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' || r == ' ' || r == '\t' || r == '\r' }) {
		i, err := strconv.Atoi(f)
		if err != nil || i < 0 || i >= gpus {
			return nil, fmt.Errorf("want GPU indexes 0..%d, got %q", gpus-1, f)
		}
		out[i] = true
	}
	return out, nil
}

// readHealthFile returns the unhealthy indexes listed in path; a missing
// file lists none.
func readHealthFile(path string, gpus int) (map[int]bool, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read health file: %w", err)
	}
	m, err := parseIndexes(string(b), gpus)
	if err != nil {
		return nil, fmt.Errorf("health file %s: %w", path, err)
	}
	return m, nil
}

// scheduler is the scheduler side.
type scheduler struct{}

func (scheduler) Vendor() string                                   { return Vendor }
func (scheduler) LinkWeight(l types.Link) int                      { return gpulink.Weight(l) }
func (scheduler) Admit(types.Device, types.ContainerRequest) error { return nil }
