package simgpu

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// MaxGPUs bounds the GPUs of one simulated node.
const MaxGPUs = 64

// Topology describes a simulated node's GPUs. It is read from a YAML (or
// JSON) file or taken from a preset:
//
//	name: dgx1
//	model: Tesla V100-SXM2-16GB
//	gpus: 8
//	memoryMiB: 16160
//	computeUnits: 80
//	computeCapability: "7.0"
//	numaNodes: 2          # GPUs are split evenly over the NUMA nodes, in index order
//	gpusPerPCIeSwitch: 2  # consecutive GPUs sharing a PCIe switch
//	nvlinks:              # direct NVLink connections; other pairs use PCIe
//	  - {a: 0, b: 3, count: 2}
//	nvswitch: false       # true: every pair is connected through NVSwitch
type Topology struct {
	Name              string   `json:"name"`
	Model             string   `json:"model"`
	GPUs              int      `json:"gpus"`
	MemoryMiB         int64    `json:"memoryMiB"`
	ComputeUnits      int32    `json:"computeUnits,omitempty"`
	ComputeCapability string   `json:"computeCapability,omitempty"`
	NUMANodes         int      `json:"numaNodes,omitempty"`
	GPUsPerPCIeSwitch int      `json:"gpusPerPCIeSwitch,omitempty"`
	NVLinks           []NVLink `json:"nvlinks,omitempty"`
	NVSwitch          bool     `json:"nvswitch,omitempty"`
}

// NVLink is a direct NVLink connection between GPUs A and B (indexes).
type NVLink struct {
	A     int `json:"a"`
	B     int `json:"b"`
	Count int `json:"count"`
}

// ErrInvalidTopology is wrapped by every topology parse or validation error.
var ErrInvalidTopology = errors.New("invalid simulated GPU topology")

// ParseTopology decodes and validates a topology file's contents. Unknown
// fields are errors, so a typo does not silently change the topology.
func ParseTopology(data []byte) (Topology, error) {
	var t Topology
	if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return Topology{}, fmt.Errorf("%w: %w", ErrInvalidTopology, err)
	}
	if err := t.Validate(); err != nil {
		return Topology{}, err
	}
	return t, nil
}

// LoadTopology reads and parses a topology file.
func LoadTopology(path string) (Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Topology{}, fmt.Errorf("read topology: %w", err)
	}
	t, err := ParseTopology(data)
	if err != nil {
		return Topology{}, fmt.Errorf("topology %s: %w", path, err)
	}
	return t, nil
}

// Validate checks the topology is one a machine could have.
func (t Topology) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidTopology, fmt.Sprintf(format, args...))
	}
	switch {
	case strings.TrimSpace(t.Model) == "":
		return bad("model must be set")
	case t.GPUs < 1 || t.GPUs > MaxGPUs:
		return bad("gpus must be 1..%d, got %d", MaxGPUs, t.GPUs)
	case t.MemoryMiB < 1:
		return bad("memoryMiB must be positive, got %d", t.MemoryMiB)
	case t.ComputeUnits < 0:
		return bad("computeUnits must not be negative, got %d", t.ComputeUnits)
	case t.NUMANodes < 0 || t.NUMANodes > t.GPUs:
		return bad("numaNodes must be 0..gpus (%d), got %d", t.GPUs, t.NUMANodes)
	case t.GPUsPerPCIeSwitch < 0 || t.GPUsPerPCIeSwitch > t.GPUs:
		return bad("gpusPerPCIeSwitch must be 0..gpus (%d), got %d", t.GPUs, t.GPUsPerPCIeSwitch)
	case t.NVSwitch && len(t.NVLinks) > 0:
		return bad("nvswitch and nvlinks exclude each other: an NVSwitch system connects every pair")
	}
	type pair struct{ a, b int }
	seen := map[pair]bool{}
	for _, l := range t.NVLinks {
		if l.A < 0 || l.A >= t.GPUs || l.B < 0 || l.B >= t.GPUs || l.A == l.B {
			return bad("nvlink %d-%d must join two different GPUs 0..%d", l.A, l.B, t.GPUs-1)
		}
		if l.Count < 1 || l.Count > 18 {
			return bad("nvlink %d-%d count must be 1..18, got %d", l.A, l.B, l.Count)
		}
		p := pair{min(l.A, l.B), max(l.A, l.B)}
		if seen[p] {
			return bad("nvlink %d-%d appears twice", p.a, p.b)
		}
		seen[p] = true
	}
	return nil
}

// numaNode returns the NUMA node of GPU i.
func (t Topology) numaNode(i int) int {
	n := max(t.NUMANodes, 1)
	return i * n / t.GPUs
}

// pcieSwitch returns the PCIe switch of GPU i.
func (t Topology) pcieSwitch(i int) int {
	return i / max(t.GPUsPerPCIeSwitch, 1)
}

// presets are the topologies built in; see Presets.
var presets = map[string]Topology{
	// DGX-1 with V100: the hybrid cube-mesh NVLink network.
	"dgx1": {
		Name: "dgx1", Model: "Tesla V100-SXM2-16GB", GPUs: 8, MemoryMiB: 16160, ComputeUnits: 80, ComputeCapability: "7.0",
		NUMANodes: 2, GPUsPerPCIeSwitch: 2,
		NVLinks: []NVLink{
			{0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 5, 2}, {2, 3, 2}, {4, 7, 2}, {5, 6, 2}, {6, 7, 2},
			{0, 1, 1}, {0, 2, 1}, {1, 3, 1}, {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {5, 7, 1},
		},
	},
	"dgx-a100": {
		Name: "dgx-a100", Model: "NVIDIA A100-SXM4-40GB", GPUs: 8, MemoryMiB: 40960, ComputeUnits: 108, ComputeCapability: "8.0",
		NUMANodes: 2, GPUsPerPCIeSwitch: 2, NVSwitch: true,
	},
	"dgx-h100": {
		Name: "dgx-h100", Model: "NVIDIA H100 80GB HBM3", GPUs: 8, MemoryMiB: 81559, ComputeUnits: 132, ComputeCapability: "9.0",
		NUMANodes: 2, GPUsPerPCIeSwitch: 2, NVSwitch: true,
	},
	// A PCIe-only box: two T4s behind each of two PCIe switches, one per socket.
	"t4x4": {
		Name: "t4x4", Model: "Tesla T4", GPUs: 4, MemoryMiB: 15360, ComputeUnits: 40, ComputeCapability: "7.5",
		NUMANodes: 2, GPUsPerPCIeSwitch: 2,
	},
	// Single-model nodes named as in the Alibaba openb trace. G2 and G3 are
	// anonymised in the trace; their sizes here are assumptions.
	"p100":    openb("P100", 16384, 56, "6.0"),
	"t4":      openb("T4", 15360, 40, "7.5"),
	"v100m16": openb("V100M16", 16384, 80, "7.0"),
	"v100m32": openb("V100M32", 32768, 80, "7.0"),
	"a10":     openb("A10", 24576, 72, "8.6"),
	"g2":      openb("G2", 24576, 72, "8.6"),
	"g3":      openb("G3", 32768, 84, "8.6"),
}

func openb(model string, memMiB int64, sms int32, cc string) Topology {
	return Topology{
		Name: strings.ToLower(model), Model: model, GPUs: 8, MemoryMiB: memMiB, ComputeUnits: sms, ComputeCapability: cc,
		NUMANodes: 2, GPUsPerPCIeSwitch: 2,
	}
}

// Preset returns a built-in topology by name.
func Preset(name string) (Topology, error) {
	t, ok := presets[name]
	if !ok {
		return Topology{}, fmt.Errorf("%w: unknown preset %q (known: %s)", ErrInvalidTopology, name, strings.Join(Presets(), ", "))
	}
	t.NVLinks = slices.Clone(t.NVLinks)
	return t, nil
}

// Presets lists the built-in topologies' names.
func Presets() []string { return slices.Sorted(maps.Keys(presets)) }
