package simgpu

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/kubegpu/kubegpu/types"
)

// Environment variables the node side sets in containers.
const (
	// EnvVisibleDevices is the NVIDIA container runtime's variable; "void"
	// hides every GPU.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvDevices lists the simulated GPUs' IDs, in allocation order.
	EnvDevices = "KUBEGPU_SIMGPU_DEVICES"
	// EnvMemoryMiB lists the memory granted on each device, for slices.
	EnvMemoryMiB = "KUBEGPU_GPU_MEMORY_MIB"
	// EnvCores lists the compute percent granted on each device, for slices.
	EnvCores = "KUBEGPU_GPU_CORES"
)

// node is the node side: a fixed inventory, with health from the options
// and, optionally, a file re-read at each discovery.
type node struct {
	inv        types.Inventory
	unhealthy  map[int]bool
	healthFile string
	cdi        bool
	// enforcer is the enforcer stand-in, nil unless OptionEnforcerRoot.
	enforcer *enforcer
}

// Discover returns the simulated inventory with current health.
func (n *node) Discover(context.Context) (types.Inventory, error) {
	sick := n.unhealthy
	if n.healthFile != "" {
		fromFile, err := readHealthFile(n.healthFile, len(n.inv.Devices))
		if err != nil {
			return types.Inventory{}, fmt.Errorf("simgpu: %w", err)
		}
		sick = maps.Clone(n.unhealthy)
		maps.Copy(sick, fromFile)
	}
	out := types.Inventory{Devices: make([]types.Device, len(n.inv.Devices)), Links: n.inv.Links}
	copy(out.Devices, n.inv.Devices)
	for i := range out.Devices {
		if sick[out.Devices[i].Index] {
			out.Devices[i].Health = types.Unhealthy
		}
	}
	return out, nil
}

// ContainerEdits exposes exactly the allocated simulated GPUs.
func (n *node) ContainerEdits(_ context.Context, alloc types.ContainerAllocation) (types.ContainerEdits, error) {
	if len(alloc.Devices) == 0 {
		return types.ContainerEdits{Env: []types.EnvVar{{Name: EnvVisibleDevices, Value: "void"}}}, nil
	}
	var (
		uuids, ids, mem, cores []string
		shared                 bool
		edits                  types.ContainerEdits
	)
	for _, s := range alloc.Devices {
		d, ok := n.inv.DeviceByID(s.ID)
		if !ok || d.UUID != s.UUID {
			return types.ContainerEdits{}, fmt.Errorf("simgpu: container %q: device %s (%s) is not on this node", alloc.Name, s.ID, s.UUID)
		}
		uuids = append(uuids, d.UUID)
		ids = append(ids, d.ID)
		mem = append(mem, strconv.FormatInt(s.MemoryMiB, 10))
		cores = append(cores, strconv.Itoa(s.ComputePercent))
		shared = shared || !s.Exclusive
		if n.cdi {
			edits.CDIDevices = append(edits.CDIDevices, CDIKind+"="+d.ID)
		}
	}
	if n.cdi {
		edits.Env = append(edits.Env, types.EnvVar{Name: EnvVisibleDevices, Value: "void"})
	} else {
		edits.Env = append(edits.Env, types.EnvVar{Name: EnvVisibleDevices, Value: strings.Join(uuids, ",")})
	}
	edits.Env = append(edits.Env, types.EnvVar{Name: EnvDevices, Value: strings.Join(ids, ",")})
	if shared {
		edits.Env = append(edits.Env,
			types.EnvVar{Name: EnvMemoryMiB, Value: strings.Join(mem, ",")},
			types.EnvVar{Name: EnvCores, Value: strings.Join(cores, ",")})
	}
	return edits, nil
}

// Close has nothing to release.
func (n *node) Close() error { return nil }
