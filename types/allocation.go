package types

// DeviceShare is one device, or the part of it, given to a container.
type DeviceShare struct {
	// ID is the device's ID in the node's inventory.
	ID string `json:"id"`
	// UUID is the device's UUID, carried so that the node needs no
	// inventory lookup to build the container's edits.
	UUID string `json:"uuid"`
	// Exclusive is true when the container owns the whole device.
	Exclusive bool `json:"exclusive,omitempty"`
	// MemoryMiB is the device memory granted (the whole memory when Exclusive).
	MemoryMiB int64 `json:"memoryMiB"`
	// ComputePercent is the compute share granted, 1..MaxComputePercent.
	ComputePercent int `json:"computePercent"`
}

// ContainerAllocation is what one container got.
type ContainerAllocation struct {
	// Name is the container's name in the pod spec.
	Name    string        `json:"name"`
	Devices []DeviceShare `json:"devices"`
}

// PodAllocation is what every container of a pod got on one node.
type PodAllocation struct {
	// Node is the node the devices are on.
	Node           string                `json:"node"`
	InitContainers []ContainerAllocation `json:"initContainers,omitempty"`
	Containers     []ContainerAllocation `json:"containers,omitempty"`
	// Enforcement is the policy the scheduler placed the pod's slices
	// under; empty means EnforcementBestEffort (allocations of versions
	// that had no policy).
	Enforcement EnforcementPolicy `json:"enforcement,omitempty"`
}

// Container returns the allocation of the named container, looking first at
// the regular containers and then at the init containers (the API server
// rejects a pod whose containers share a name).
func (a PodAllocation) Container(name string) (ContainerAllocation, bool) {
	for _, list := range [][]ContainerAllocation{a.Containers, a.InitContainers} {
		for _, c := range list {
			if c.Name == name {
				return c, true
			}
		}
	}
	return ContainerAllocation{}, false
}
