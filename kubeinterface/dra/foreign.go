package dra

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/kubegpu/kubegpu/types"
)

// Another DRA driver may publish the GPUs that kubegpu's modules find: a
// driver such as NVIDIA's dra-driver-nvidia-gpu run on a kubegpu node.
// Both would then hand the same GPU out, each unaware of the other. The
// rules below recognise such GPUs, by what identifies a GPU whoever
// describes it: its UUID and its PCI bus ID.

// Overlap is a kubegpu device that a ResourceSlice of another driver
// publishes as well.
type Overlap struct {
	// Device is the kubegpu device's ID.
	Device string
	// Driver, Slice and SliceDevice name the other driver's ResourceSlice
	// and its device.
	Driver, Slice, SliceDevice string
}

// InventoryKeys maps the identifiers of inv's devices (see Overlaps) to
// their IDs. Partitions (MIG) are known by their UUIDs only: they share
// their GPU's PCI bus ID, which stays the GPU's.
func InventoryKeys(inv types.Inventory) map[string]string {
	keys := make(map[string]string, 2*len(inv.Devices))
	for _, d := range inv.Devices {
		if d.UUID != "" {
			keys[uuidKey(d.UUID)] = d.ID
		}
		if d.PCIBusID != "" && d.Parent == "" {
			keys[pciKey(d.PCIBusID)] = d.ID
		}
	}
	return keys
}

// DeviceKeys lists the identifiers of a ResourceSlice's device, UUIDs
// first (a MIG partition shares its GPU's PCI bus ID, so a UUID says more):
// the value of every string attribute named "uuid" (in any domain: "uuid"
// of the driver's own, "gpu.nvidia.com/uuid"), and its PCI bus ID (the
// standard attribute, or "pciBusID" or "pcieBusID" of any domain). Case
// and the width of the PCI domain ("00000000:07:00.0", as NVML writes it,
// is "0000:07:00.0") do not matter. A device has at most
// resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice
// attributes, so the cost is bounded.
func DeviceKeys(d *resourceapi.Device) []string {
	var keys []string
	for name, a := range d.Attributes {
		if a.StringValue == nil || *a.StringValue == "" {
			continue
		}
		id := string(name)
		if i := strings.LastIndexByte(id, '/'); i >= 0 {
			id = id[i+1:]
		}
		switch {
		case strings.EqualFold(id, "uuid"):
			keys = append(keys, uuidKey(*a.StringValue))
		case strings.EqualFold(id, "pciBusID"), strings.EqualFold(id, "pcieBusID"):
			keys = append(keys, pciKey(*a.StringValue))
		}
	}
	// "uuid:" after "pci:" in byte order: sorted backwards, UUIDs first.
	slices.SortFunc(keys, func(a, b string) int { return strings.Compare(b, a) })
	return slices.Compact(keys)
}

// Overlaps lists the devices of slice that are kubegpu devices too, keys
// being InventoryKeys of the node's inventory. Slices of DriverName, and
// slices not of one node (spec.nodeName unset: network-attached devices,
// which no node's modules find), overlap nothing.
func Overlaps(slice *resourceapi.ResourceSlice, keys map[string]string) []Overlap {
	if slice.Spec.Driver == DriverName || slice.Spec.NodeName == nil || len(keys) == 0 {
		return nil
	}
	deviceKeys := make([][]string, len(slice.Spec.Devices))
	for i := range slice.Spec.Devices {
		deviceKeys[i] = DeviceKeys(&slice.Spec.Devices[i])
	}
	devices, at := MatchKeys(deviceKeys, keys)
	out := make([]Overlap, len(devices))
	for i, id := range devices {
		out[i] = Overlap{Device: id, Driver: slice.Spec.Driver, Slice: slice.Name, SliceDevice: slice.Spec.Devices[at[i]].Name}
	}
	return out
}

// MatchKeys is Overlaps for a slice already reduced to its devices' keys
// (DeviceKeys of each, in the slice's order): the scheduler keeps the keys,
// not the slices.
func MatchKeys(deviceKeys [][]string, keys map[string]string) (devices []string, at []int) {
	for i, dk := range deviceKeys {
		for _, k := range dk {
			if id, ok := keys[k]; ok {
				devices, at = append(devices, id), append(at, i)
				break
			}
		}
	}
	return devices, at
}

func uuidKey(s string) string { return "uuid:" + strings.ToLower(s) }

// pciKey is a PCI bus ID with a domain of four hex digits, in lower case.
func pciKey(s string) string {
	s = strings.ToLower(s)
	if dom, rest, ok := strings.Cut(s, ":"); ok && len(dom) > 4 && strings.Trim(dom[:len(dom)-4], "0") == "" {
		s = dom[len(dom)-4:] + ":" + rest
	}
	return "pci:" + s
}

// Mapping is a DeviceClass that maps an extended resource kubegpu reads to
// DRA (spec.extendedResourceName): where a node advertises none of that
// resource in its allocatable, the scheduler's DynamicResources plugin
// serves a pod's request for it from the class's devices.
type Mapping struct {
	Resource corev1.ResourceName
	Class    string
}

// Mappings lists the classes that map one of resources, sorted by
// resource and class name.
func Mappings(classes []*resourceapi.DeviceClass, resources []corev1.ResourceName) []Mapping {
	var out []Mapping
	for _, c := range classes {
		if r := c.Spec.ExtendedResourceName; r != nil && slices.Contains(resources, corev1.ResourceName(*r)) {
			out = append(out, Mapping{Resource: corev1.ResourceName(*r), Class: c.Name})
		}
	}
	slices.SortFunc(out, func(a, b Mapping) int {
		if c := strings.Compare(string(a.Resource), string(b.Resource)); c != 0 {
			return c
		}
		return strings.Compare(a.Class, b.Class)
	})
	return out
}

// ServedByDRA reports whether the DynamicResources plugin serves resource
// r on node through a class that maps it: the node advertises none of r
// (its rule: allocatable zero or absent).
func ServedByDRA(node *corev1.Node, r corev1.ResourceName) bool {
	q, ok := node.Status.Allocatable[r]
	return !ok || q.IsZero()
}
