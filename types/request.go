package types

// TopologyPolicy says how strictly a multi-device request wants its devices
// connected to each other.
type TopologyPolicy string

const (
	// TopologyRequired means every pair of the chosen devices must be connected by
	// a GPU fabric (NVLink, NVSwitch, or XGMI within one hive), or the request
	// does not fit.
	TopologyRequired TopologyPolicy = "required"
	// TopologyPreferred asks for the best-connected set available, falling
	// back to worse paths rather than not fitting.
	TopologyPreferred TopologyPolicy = "preferred"
	// TopologyNone means connectivity does not matter.
	TopologyNone TopologyPolicy = "none"
)

// TopologyPolicies lists the valid topology policies.
var TopologyPolicies = []TopologyPolicy{TopologyRequired, TopologyPreferred, TopologyNone}

// PlacementPolicy says how a pod prefers to be packed relative to others.
type PlacementPolicy string

const (
	// PlacementDefault leaves the choice to the scheduler's configured policy.
	PlacementDefault PlacementPolicy = ""
	// PlacementBinpack prefers nodes and devices that are already busy.
	PlacementBinpack PlacementPolicy = "binpack"
	// PlacementSpread prefers nodes and devices that are idle.
	PlacementSpread PlacementPolicy = "spread"
)

// PlacementPolicies lists the placement policies a pod may ask for.
var PlacementPolicies = []PlacementPolicy{PlacementBinpack, PlacementSpread}

// MaxComputePercent is a whole device's compute share.
const MaxComputePercent = 100

// MaxDeviceContainers is the most containers of one pod (init and regular
// together) that may ask for devices.
const MaxDeviceContainers = 16

// Selector narrows which devices may serve a request. Empty fields do not
// narrow. Models and UUIDs compare case-insensitively.
type Selector struct {
	// Resource is the device resource (see DeviceResources) the container
	// asked for its devices with: only devices served as it
	// (Device.ServedAs) may serve the request.
	Resource      string   `json:"resource,omitempty"`
	IncludeModels []string `json:"includeModels,omitempty"`
	ExcludeModels []string `json:"excludeModels,omitempty"`
	IncludeUUIDs  []string `json:"includeUUIDs,omitempty"`
	ExcludeUUIDs  []string `json:"excludeUUIDs,omitempty"`
}

// ContainerRequest is what one container asks for.
//
// With MemoryMiB and ComputePercent both zero it asks for Count whole devices
// for its exclusive use. With either set it asks for Count shared slices on
// Count distinct devices, each slice with that much memory and that share of
// compute (a zero field means "no particular amount").
type ContainerRequest struct {
	// Name is the container's name in the pod spec.
	Name string `json:"name"`
	// Count is how many devices (or slices on distinct devices).
	Count int `json:"count"`
	// MemoryMiB is the device memory each slice needs.
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
	// ComputePercent is the share of a device's compute each slice needs,
	// 1..MaxComputePercent.
	ComputePercent int `json:"computePercent,omitempty"`
	// Selector narrows the devices that may serve this request.
	Selector Selector `json:"selector,omitzero"`
	// Topology is how strictly the devices must be interconnected.
	Topology TopologyPolicy `json:"topology,omitempty"`
}

// Shared reports whether the request is for shared slices rather than whole
// devices.
func (r ContainerRequest) Shared() bool { return r.MemoryMiB > 0 || r.ComputePercent > 0 }

// PodRequest is everything a pod asks for. Init containers run one at a time
// before the regular containers; each container's devices are its own.
type PodRequest struct {
	InitContainers []ContainerRequest `json:"initContainers,omitempty"`
	Containers     []ContainerRequest `json:"containers,omitempty"`
	// Placement overrides the scheduler's placement policy for this pod.
	Placement PlacementPolicy `json:"placement,omitempty"`
}

// Empty reports whether the pod asks for no devices at all.
func (p PodRequest) Empty() bool { return len(p.InitContainers) == 0 && len(p.Containers) == 0 }
