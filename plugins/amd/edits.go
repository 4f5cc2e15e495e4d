package amd

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/kubegpu/kubegpu/types"
)

// Device nodes an AMD GPU container needs: the compute interface, which
// every process of the ROCm stack opens, and one render node per GPU. The
// kernel shows a process only the KFD topology nodes of the GPUs whose
// render nodes its device cgroup allows (kfd_devcgroup_check_permission),
// so a container given only its own render nodes sees only its own GPUs.
const (
	DeviceKFD      = "/dev/kfd"
	renderNodePath = "/dev/dri/renderD"
)

// ErrNotOnNode is wrapped by Edits' error when the allocation names a GPU
// the node does not have (or no longer has).
var ErrNotOnNode = errors.New("device is not on this node")

// Edits gives a container exactly the GPUs of alloc, found by ID and
// checked by UUID in t (the last discovery): /dev/kfd and each GPU's
// render node. With no devices it gives none of them, not even /dev/kfd.
func (t Topology) Edits(alloc types.ContainerAllocation) (types.ContainerEdits, error) {
	var e types.ContainerEdits
	if len(alloc.Devices) == 0 {
		return e, nil
	}
	e.DeviceNodes = append(e.DeviceNodes, types.DeviceNode{HostPath: DeviceKFD, ContainerPath: DeviceKFD, Permissions: "rw"})
	seen := map[string]bool{}
	for _, d := range alloc.Devices {
		g, ok := t.gpu(d.ID)
		if !ok || g.UUID != d.UUID {
			return types.ContainerEdits{}, fmt.Errorf("%w: GPU %s (UUID %s)", ErrNotOnNode, d.ID, d.UUID)
		}
		if seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		path := renderNodePath + strconv.Itoa(g.RenderMinor)
		e.DeviceNodes = append(e.DeviceNodes, types.DeviceNode{HostPath: path, ContainerPath: path, Permissions: "rw"})
	}
	return e, nil
}

// gpu is the GPU with device ID id.
func (t Topology) gpu(id string) (GPU, bool) {
	for _, g := range t.GPUs {
		if g.ID == id {
			return g, true
		}
	}
	return GPU{}, false
}
