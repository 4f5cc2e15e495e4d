package nvidia

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubegpu/kubegpu/types"
)

// CDIKind is the CDI vendor/class of nvidia-ctk's generated spec.
const CDIKind = "nvidia.com/gpu"

// Environment variables the node side sets in containers. They replace any
// the container sets itself.
const (
	// EnvVisibleDevices is the NVIDIA container runtime's list of devices;
	// "void" gives none.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvMemoryMiB lists the memory granted on each device, in allocation
	// order, when any device is shared (as simgpu sets it).
	EnvMemoryMiB = "KUBEGPU_GPU_MEMORY_MIB"
	// EnvCores lists the compute percent granted on each device, likewise.
	EnvCores = "KUBEGPU_GPU_CORES"
	// MPS client settings, for shared slices on a node with nvidia.mps=true.
	EnvMPSPipeDirectory     = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSThreadPercentage  = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPinnedMemoryLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// EnvCUDADeviceOrder is set to PCI_BUS_ID with MPS limits, so that the
	// device ordinals CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names are the
	// devices in PCI bus order.
	EnvCUDADeviceOrder = "CUDA_DEVICE_ORDER"
)

// ErrNotOnNode is wrapped by ContainerEdits' error when the allocation names
// a device this node does not have (or no longer has).
var ErrNotOnNode = errors.New("device is not on this node")

// ContainerEdits gives the container exactly the devices of alloc, checked
// against the last discovery; with no devices, it hides every GPU. With
// MPS, slices need the pod (PodContainerEdits).
func (n *node) ContainerEdits(_ context.Context, alloc types.ContainerAllocation) (types.ContainerEdits, error) {
	return n.edits(alloc, nil)
}

// PodContainerEdits is ContainerEdits for a container of pod podUID: with
// MPS, its slices get an MPS daemon of the container's own.
func (n *node) PodContainerEdits(ctx context.Context, podUID string, alloc types.ContainerAllocation) (types.ContainerEdits, error) {
	return n.edits(alloc, func(uuids []string, limits mpsLimits) (mpsDirs, error) {
		return n.mps.ensure(ctx, podUID, alloc.Name, uuids, limits)
	})
}

// ReleasePods stops the MPS daemons of pods that are gone.
func (n *node) ReleasePods(ctx context.Context, live map[string]bool, listed time.Time) error {
	if n.mps == nil {
		return nil
	}
	return n.mps.release(ctx, live, listed)
}

func (n *node) edits(alloc types.ContainerAllocation, mps mpsStarter) (types.ContainerEdits, error) {
	n.mu.RLock()
	devices := n.devices
	n.mu.RUnlock()
	edits, err := containerEdits(n.cfg, devices, alloc, mps)
	if err != nil {
		return types.ContainerEdits{}, fmt.Errorf("%s: container %q: %w", Name, alloc.Name, err)
	}
	return edits, nil
}

// mpsStarter makes sure an MPS daemon serves the GPUs with uuids (in PCI
// bus order) for the container with limits, and returns its directories.
type mpsStarter func(uuids []string, limits mpsLimits) (mpsDirs, error)

// containerEdits builds the edits for alloc from the node's configuration
// and devices, and, for MPS slices, the container's MPS daemon.
func containerEdits(c config, devices map[string]deviceEntry, alloc types.ContainerAllocation, mps mpsStarter) (types.ContainerEdits, error) {
	var edits types.ContainerEdits
	if len(alloc.Devices) == 0 {
		edits.Env = []types.EnvVar{{Name: EnvVisibleDevices, Value: "void"}}
		return edits, nil
	}
	var (
		entries       []deviceEntry
		uuids         []string
		mem, cores    []string
		shared, whole bool
		seen          = map[string]bool{}
	)
	for _, s := range alloc.Devices {
		e, ok := devices[s.ID]
		switch {
		case !ok || e.dev.UUID != s.UUID:
			return types.ContainerEdits{}, fmt.Errorf("%w: %s (%s)", ErrNotOnNode, s.ID, s.UUID)
		case seen[s.ID]:
			return types.ContainerEdits{}, fmt.Errorf("device %s is allocated twice", s.ID)
		case e.parent:
			return types.ContainerEdits{}, fmt.Errorf("GPU %s is in MIG mode: it is given out only through its MIG devices", s.ID)
		case e.migIndex >= 0 && !s.Exclusive:
			return types.ContainerEdits{}, fmt.Errorf("MIG device %s cannot be shared", s.ID)
		}
		seen[s.ID] = true
		entries = append(entries, e)
		uuids = append(uuids, e.dev.UUID)
		mem = append(mem, strconv.FormatInt(s.MemoryMiB, 10))
		cores = append(cores, strconv.Itoa(s.ComputePercent))
		shared = shared || !s.Exclusive
		whole = whole || s.Exclusive
		if c.cdi {
			edits.CDIDevices = append(edits.CDIDevices, cdiName(c, e))
		}
	}
	if c.cdi {
		// The devices come from the CDI spec. "void" keeps a runtime in
		// the NVIDIA runtime's legacy mode from adding the GPUs an image
		// asks for (CUDA images set NVIDIA_VISIBLE_DEVICES=all).
		edits.Env = append(edits.Env, types.EnvVar{Name: EnvVisibleDevices, Value: "void"})
	} else {
		edits.Env = append(edits.Env, types.EnvVar{Name: EnvVisibleDevices, Value: strings.Join(uuids, ",")})
	}
	if !shared {
		return edits, nil
	}
	edits.Env = append(edits.Env,
		types.EnvVar{Name: EnvMemoryMiB, Value: strings.Join(mem, ",")},
		types.EnvVar{Name: EnvCores, Value: strings.Join(cores, ",")})
	if !c.mps {
		return edits, nil
	}
	if whole {
		return types.ContainerEdits{}, errors.New("MPS limits cannot apply to a container with both whole and shared GPUs")
	}
	if mps == nil {
		return types.ContainerEdits{}, errors.New("MPS slices need the container's pod: the host does not support per-pod edits (rebuild it with this module)")
	}
	more, err := mpsEdits(entries, alloc.Devices, mps)
	if err != nil {
		return types.ContainerEdits{}, err
	}
	edits.Env = append(edits.Env, more.Env...)
	edits.Mounts = append(edits.Mounts, more.Mounts...)
	return edits, nil
}

// cdiName is the device's name in nvidia-ctk's generated CDI spec.
func cdiName(c config, e deviceEntry) string {
	switch {
	case !c.cdiByIndex:
		return CDIKind + "=" + e.dev.UUID
	case e.migIndex >= 0:
		return fmt.Sprintf("%s=%d:%d", CDIKind, e.dev.Index, e.migIndex)
	default:
		return fmt.Sprintf("%s=%d", CDIKind, e.dev.Index)
	}
}

// mpsEdits are the MPS settings of shared slices: one active-thread
// percentage for the process, a pinned-memory limit per device ordinal
// (devices in PCI bus order, which CUDA_DEVICE_ORDER makes CUDA's order),
// given to the container's own MPS daemon as its defaults (which its
// clients can only lower) and to the container; and the daemon's pipe
// directory and shared memory mounted in.
func mpsEdits(entries []deviceEntry, shares []types.DeviceShare, start mpsStarter) (types.ContainerEdits, error) {
	percent := shares[0].ComputePercent
	for _, s := range shares {
		if s.ComputePercent != percent {
			return types.ContainerEdits{}, fmt.Errorf("MPS takes one compute share per container, got %d%% and %d%%", percent, s.ComputePercent)
		}
	}
	if percent == 0 {
		percent = types.MaxComputePercent // a slice of memory only: no compute limit
	}
	if percent < 1 || percent > types.MaxComputePercent {
		return types.ContainerEdits{}, fmt.Errorf("compute share %d%% is not 1..%d", percent, types.MaxComputePercent)
	}
	order := make([]int, len(entries))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(entries[a].dev.PCIBusID, entries[b].dev.PCIBusID) })
	var limits, uuids []string
	for ordinal, i := range order {
		uuids = append(uuids, entries[i].dev.UUID)
		if m := shares[i].MemoryMiB; m > 0 {
			limits = append(limits, fmt.Sprintf("%d=%dM", ordinal, m))
		} else if m < 0 {
			return types.ContainerEdits{}, fmt.Errorf("device %s: negative memory %d MiB", shares[i].ID, m)
		}
	}
	dirs, err := start(uuids, mpsLimits{ThreadPercent: percent, PinnedMemory: strings.Join(limits, ",")})
	if err != nil {
		return types.ContainerEdits{}, err
	}
	edits := types.ContainerEdits{
		Env: []types.EnvVar{
			{Name: EnvMPSPipeDirectory, Value: MPSContainerPipeDir},
			{Name: EnvMPSThreadPercentage, Value: strconv.Itoa(percent)},
			{Name: EnvCUDADeviceOrder, Value: "PCI_BUS_ID"},
		},
		Mounts: []types.Mount{
			// Read-only: clients connect to the daemon's sockets (which
			// a read-only mount allows) and need write nothing there;
			// the container cannot put a socket of its own in the
			// daemon's place, so what the node reads back through the
			// pipe is the daemon's answer.
			{HostPath: dirs.pipe, ContainerPath: MPSContainerPipeDir, ReadOnly: true},
			{HostPath: dirs.shm, ContainerPath: "/dev/shm"},
		},
	}
	if len(limits) > 0 {
		edits.Env = append(edits.Env, types.EnvVar{Name: EnvMPSPinnedMemoryLimit, Value: strings.Join(limits, ",")})
	}
	return edits, nil
}
