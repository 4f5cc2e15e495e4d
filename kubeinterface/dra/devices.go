package dra

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/types"
)

// DriverName is the DRA driver name under which kubegpu publishes its
// devices, and the domain of their attributes.
const DriverName = "gpu.kubegpu.io"

// Attributes of every device, in the driver's domain (a CEL selector reads
// device.attributes["gpu.kubegpu.io"].model).
const (
	// AttributeID is the device's kubegpu ID (types.Device.ID), the name
	// allocations use; the device's DRA name is the ID where that is a DNS
	// label, and derived from it otherwise.
	AttributeID resourceapi.QualifiedName = "id"
	// AttributeVendor is the vendor domain, e.g. "nvidia.com".
	AttributeVendor resourceapi.QualifiedName = "vendor"
	// AttributeModel is the product name, cut to 64 bytes.
	AttributeModel resourceapi.QualifiedName = "model"
	// AttributeUUID is the vendor's unique ID.
	AttributeUUID resourceapi.QualifiedName = "uuid"
	// AttributeIndex is the index the vendor's tools give the GPU.
	AttributeIndex resourceapi.QualifiedName = "index"
	// AttributeComputeUnits counts streaming multiprocessors (or the
	// vendor's equivalent), when known.
	AttributeComputeUnits resourceapi.QualifiedName = "computeUnits"
	// AttributeComputeCapability is the architecture version as a semantic
	// version ("8.0" is published as 8.0.0), when known.
	AttributeComputeCapability resourceapi.QualifiedName = "computeCapability"
	// AttributeParent is the ID of the GPU a partition (MIG) is carved
	// from; only on partitions.
	AttributeParent resourceapi.QualifiedName = "parent"
	// AttributeLinkGroup names the group of GPUs all pairwise linked by
	// NVLink, NVSwitch or direct XGMI that the GPU belongs to ("nvlink-0",
	// "xgmi-0"): matchAttribute on it asks for GPUs of one group, such as
	// one NVLink quad of a DGX-1. Absent on GPUs in no such group and on
	// partitions.
	AttributeLinkGroup resourceapi.QualifiedName = "linkGroup"
	// AttributeSliceEnforcer is what holds slices of the GPU to their
	// share (e.g. "mps"), when something does.
	AttributeSliceEnforcer resourceapi.QualifiedName = "sliceEnforcer"
	// AttributePreparesAlternatives is true on every device of a node
	// whose kubegpu-crishim prepares claims given an alternative of a
	// firstAvailable request (results named "<request>/<subrequest>"):
	// kubegpu-scheduler places alternatives only on such devices, as an
	// older shim refuses to prepare them.
	AttributePreparesAlternatives resourceapi.QualifiedName = "preparesAlternatives"
)

// Standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute).
const (
	AttributePCIBusID resourceapi.QualifiedName = "resource.kubernetes.io/pciBusID"
	AttributePCIeRoot resourceapi.QualifiedName = "resource.kubernetes.io/pcieRoot"
	AttributeNUMANode resourceapi.QualifiedName = "resource.kubernetes.io/numaNode"
)

// Capacities of every device.
const (
	// CapacityMemory is the device's memory.
	CapacityMemory resourceapi.QualifiedName = "memory"
	// CapacityCores is the device's compute as kubegpu slices it: 100
	// (percent), what kubegpu.io/gpu-cores requests.
	CapacityCores resourceapi.QualifiedName = "cores"
)

// Taints.
const (
	// TaintManaged is on every device: kubegpu-scheduler allocates it
	// through pod annotations, which DRA's accounting does not see, so a
	// claim that DRA's allocator gave it could share it with a kubegpu
	// pod. Value TaintManagedValue, effect NoSchedule.
	TaintManaged      = DriverName + "/managed"
	TaintManagedValue = "annotations"
	// TaintUnhealthy is on devices whose module reports them unhealthy,
	// effect NoSchedule (containers already using one keep it, as under
	// kubegpu's own rules).
	TaintUnhealthy = DriverName + "/unhealthy"
)

// NodeSelector is the field selector of node's ResourceSlices of driver
// DriverName: the one a node's own credentials may list them with.
func NodeSelector(node string) string {
	return fields.Set{resourceapi.ResourceSliceSelectorDriver: DriverName, resourceapi.ResourceSliceSelectorNodeName: node}.String()
}

// MaxDevicesPerSlice is how many devices one ResourceSlice holds: the API's
// bound for devices with taints.
const MaxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// Options supply what only the node knows.
type Options struct {
	// PCIeRoot returns the PCIe root complex ("pci0000:00") of a PCI bus
	// ID, read from the node's sysfs (deviceattribute.
	// GetPCIeRootAttributeByPCIBusID); nil or an error: no pcieRoot
	// attribute.
	PCIeRoot func(pciBusID string) (string, error)
}

// Devices describes inv's devices as ResourceSlice devices, in inv's
// order. inv must be valid (types.Inventory.Validate). A value the API
// cannot hold is adapted, never dropped silently: a string attribute over
// 64 bytes is cut (the whole value stays in the node's inventory
// annotation), a compute capability that is no version is left out and
// reported in the returned error, which also names every PCIe root that
// could not be read; the devices are returned all the same.
func Devices(inv types.Inventory, opts Options) ([]resourceapi.Device, error) {
	groups := linkGroups(inv)
	names := deviceNames(inv)
	partitioned := partitionedGPUs(inv)
	at := make(map[string]int, len(inv.Devices))
	for i, d := range inv.Devices {
		at[d.ID] = i
	}
	var errs []error
	out := make([]resourceapi.Device, 0, len(inv.Devices))
	for i, d := range inv.Devices {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttributeID:     str(d.ID),
			AttributeVendor: str(d.Vendor),
			AttributeModel:  str(d.Model),
			AttributeUUID:   str(d.UUID),
			AttributeIndex:  {IntValue: ptr.To(int64(d.Index))},

			AttributePreparesAlternatives: {BoolValue: ptr.To(true)},
		}
		if d.ComputeUnits > 0 {
			attrs[AttributeComputeUnits] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.ComputeUnits))}
		}
		if d.ComputeCapability != "" {
			if v, ok := semver(d.ComputeCapability); ok {
				attrs[AttributeComputeCapability] = resourceapi.DeviceAttribute{VersionValue: &v}
			} else {
				errs = append(errs, fmt.Errorf("device %q: compute capability %q is no version", d.ID, d.ComputeCapability))
			}
		}
		if d.Parent != "" {
			attrs[AttributeParent] = str(d.Parent)
		}
		if g := groups[i]; g != "" {
			attrs[AttributeLinkGroup] = str(g)
		}
		if d.SliceEnforcer != "" {
			attrs[AttributeSliceEnforcer] = str(d.SliceEnforcer)
		}
		if d.NUMANode >= 0 {
			attrs[AttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.NUMANode))}
		}
		if d.PCIBusID != "" {
			attrs[AttributePCIBusID] = str(d.PCIBusID)
			if opts.PCIeRoot != nil {
				if root, err := opts.PCIeRoot(d.PCIBusID); err != nil {
					errs = append(errs, fmt.Errorf("device %q: PCIe root of %s: %w", d.ID, d.PCIBusID, err))
				} else {
					attrs[AttributePCIeRoot] = str(root)
				}
			}
		}
		dev := resourceapi.Device{
			Name:       names[i],
			Attributes: attrs,
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				CapacityMemory: {Value: *resource.NewQuantity(d.MemoryMiB<<20, resource.BinarySI)},
				CapacityCores:  {Value: *resource.NewQuantity(100, resource.DecimalSI)},
			},
			Taints: []resourceapi.DeviceTaint{{Key: TaintManaged, Value: TaintManagedValue, Effect: resourceapi.DeviceTaintEffectNoSchedule}},
		}
		switch {
		case partitioned[d.ID]:
			// In MIG mode: the GPU runs nothing itself (kubegpu gives out
			// only its partitions), and consumes all of its counters.
			dev.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: names[i], Counters: counters(d, d)}}
		case d.Parent != "":
			if p, ok := at[d.Parent]; ok {
				dev.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: names[p], Counters: counters(d, inv.Devices[p])}}
			}
		default:
			consumable(&dev)
		}
		if d.Health != types.Healthy {
			dev.Taints = append(dev.Taints, resourceapi.DeviceTaint{Key: TaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
		out = append(out, dev)
	}
	return out, errors.Join(errs...)
}

// Counters of a GPU's counter set.
const (
	// CounterMemory is a GPU's memory, which its partitions share.
	CounterMemory = "memory"
	// CounterMultiprocessors is a GPU's streaming multiprocessors (or the
	// vendor's compute units), which its partitions share.
	CounterMultiprocessors = "multiprocessors"
)

// CounterSets are the shared counters of the GPUs that have partitions
// (MIG): one set per such GPU, named as its device, holding its memory
// and compute units. Each partition consumes its own share, and the GPU
// itself all of them, so that DRA never hands out a GPU and a partition of
// it, nor partitions beyond what the GPU holds (DRA's partitionable
// devices, feature DRAPartitionableDevices). Empty without partitions.
func CounterSets(inv types.Inventory) []resourceapi.CounterSet {
	partitioned := partitionedGPUs(inv)
	names := deviceNames(inv)
	var out []resourceapi.CounterSet
	for i, d := range inv.Devices {
		if partitioned[d.ID] {
			out = append(out, resourceapi.CounterSet{Name: names[i], Counters: counters(d, d)})
		}
	}
	return out
}

// partitionedGPUs are the GPUs (of no parent themselves) that some device
// of inv names as its parent.
func partitionedGPUs(inv types.Inventory) map[string]bool {
	gpus := map[string]bool{}
	for _, d := range inv.Devices {
		if d.Parent == "" {
			gpus[d.ID] = true
		}
	}
	out := map[string]bool{}
	for _, d := range inv.Devices {
		if d.Parent != "" && gpus[d.Parent] {
			out[d.Parent] = true
		}
	}
	return out
}

// counters are what device d holds of the counter set of GPU gpu (d
// itself for the GPU): its memory, and its compute units where the GPU's
// set counts them.
func counters(d, gpu types.Device) map[string]resourceapi.Counter {
	c := map[string]resourceapi.Counter{CounterMemory: {Value: *resource.NewQuantity(d.MemoryMiB<<20, resource.BinarySI)}}
	if gpu.ComputeUnits > 0 {
		c[CounterMultiprocessors] = resourceapi.Counter{Value: *resource.NewQuantity(int64(d.ComputeUnits), resource.DecimalSI)}
	}
	return c
}

// consumable makes a whole GPU's capacity consumable (DRA's consumable
// capacity, feature DRAConsumableCapacity): kubegpu shares a GPU among
// pods by slices of its memory and compute, so the device may be allocated
// more than once, each time taking memory in MiB (none by default: a slice
// that names no memory holds none, as a kubegpu.io/gpu-cores slice) and
// cores from 1 to 100 (all by default, so that a request that names
// neither takes the GPU whole). A partition (MIG) is taken whole.
func consumable(dev *resourceapi.Device) {
	dev.AllowMultipleAllocations = ptr.To(true)
	// A GPU that reports no memory gets no memory policy: one step of
	// 1Mi above its capacity would make the API refuse the whole slice
	// (with no policy a request takes all of it, nothing).
	if mem := dev.Capacity[CapacityMemory]; mem.Value.Value() >= 1<<20 {
		mem.RequestPolicy = &resourceapi.CapacityRequestPolicy{
			Default:    ptr.To(resource.MustParse("0")),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("0")), Step: ptr.To(resource.MustParse("1Mi"))},
		}
		dev.Capacity[CapacityMemory] = mem
	}
	cores := dev.Capacity[CapacityCores]
	cores.RequestPolicy = &resourceapi.CapacityRequestPolicy{
		Default: ptr.To(resource.MustParse("100")),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1")), Max: ptr.To(resource.MustParse("100")),
			Step: ptr.To(resource.MustParse("1"))},
	}
	dev.Capacity[CapacityCores] = cores
}

// Slices splits devices into slices of at most MaxDevicesPerSlice.
func Slices(devices []resourceapi.Device) [][]resourceapi.Device {
	var out [][]resourceapi.Device
	for len(devices) > MaxDevicesPerSlice {
		out = append(out, devices[:MaxDevicesPerSlice:MaxDevicesPerSlice])
		devices = devices[MaxDevicesPerSlice:]
	}
	return append(out, devices)
}

// str is a string attribute (AttributeString).
func str(s string) resourceapi.DeviceAttribute {
	s = AttributeString(s)
	return resourceapi.DeviceAttribute{StringValue: &s}
}

// AttributeString is s as a string attribute publishes it: cut to the
// API's 64 bytes at a character's boundary.
func AttributeString(s string) string {
	if len(s) > resourceapi.DeviceAttributeMaxValueLength {
		s = s[:resourceapi.DeviceAttributeMaxValueLength]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// semver reads a compute capability ("8.0", "9") as a semantic version.
func semver(s string) (string, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 3 {
		return "", false
	}
	for _, p := range parts {
		if p == "" || len(p) > 9 || strings.Trim(p, "0123456789") != "" || (len(p) > 1 && p[0] == '0') {
			return "", false
		}
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	return strings.Join(parts, "."), true
}

// deviceNames are the devices' DRA names (DeviceName).
func deviceNames(inv types.Inventory) []string {
	names := make([]string, len(inv.Devices))
	for i, d := range inv.Devices {
		names[i] = DeviceName(d.ID)
	}
	return names
}

// DeviceName is the DRA name of the device with inventory ID id: the ID
// where it is a DNS label that does not start with "dev-", otherwise
// "dev-" and the first 16 hex digits of the ID's SHA-256 (the ID itself is
// the attribute AttributeID).
func DeviceName(id string) string {
	if len(validation.IsDNS1123Label(id)) == 0 && !strings.HasPrefix(id, "dev-") {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "dev-" + hex.EncodeToString(sum[:8])
}
