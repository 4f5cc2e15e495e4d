package types

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// SchemaVersion versions the wire form of every type in this package. A
// change that an older reader would misunderstand needs a new version.
const SchemaVersion = "kubegpu.io/v1"

// Health is whether a device may be given to new containers.
type Health string

const (
	// Healthy devices may be allocated.
	Healthy Health = "Healthy"
	// Unhealthy devices are never allocated; containers already using one keep it.
	Unhealthy Health = "Unhealthy"
)

// VendorNVIDIA is the vendor of NVIDIA GPUs and of simulated GPUs, which stand
// in for them.
const VendorNVIDIA = "nvidia.com"

// Device resources: the extended resources a container asks for devices
// with, in its limits. Each device is served under one of them (its
// Resource), so that no request of one vendor's resource gets another's
// device: the software in the container is built for one.
const (
	// ResourceNVIDIAGPU is NVIDIA's GPUs (and simulated GPUs, which stand
	// in for them), as NVIDIA's device plugin names them.
	ResourceNVIDIAGPU = "nvidia.com/gpu"
	// ResourceAMDGPU is AMD's GPUs, as AMD's device plugin names them.
	ResourceAMDGPU = "amd.com/gpu"
	// ResourceIntelI915 and ResourceIntelXe are Intel's GPUs bound to the
	// i915 and to the xe driver, as Intel's GPU device plugin names them.
	ResourceIntelI915 = "gpu.intel.com/i915"
	ResourceIntelXe   = "gpu.intel.com/xe"
)

// DeviceResources returns the device resources kubegpu serves, in the
// order a pod's requests and a node's capacity list them. A module adds
// its vendor's resource here: every part of kubegpu (request decoding,
// admission policies, the node's capacity, the shim) reads this list.
func DeviceResources() []string {
	return []string{ResourceNVIDIAGPU, ResourceAMDGPU, ResourceIntelI915, ResourceIntelXe}
}

// Device is one schedulable device: a whole GPU, or a MIG slice of one.
type Device struct {
	// ID names the device on its node, is stable across restarts of the
	// node's software, and is what allocations refer to (e.g. "gpu3",
	// "gpu3-mig1").
	ID string `json:"id"`
	// Index is the device's index as the vendor's tools number it (for a
	// MIG slice, the index of its parent GPU).
	Index int `json:"index"`
	// UUID is the vendor's globally unique identifier.
	UUID string `json:"uuid"`
	// Vendor is the device's vendor domain, e.g. VendorNVIDIA.
	Vendor string `json:"vendor"`
	// Resource is the device resource (see DeviceResources) containers
	// ask for the device with; empty means ResourceNVIDIAGPU (the
	// inventories of shims that predate it). A device of a resource this
	// version does not know (a newer node's) serves no request.
	Resource string `json:"resource,omitempty"`
	// Model is the product name, e.g. "Tesla V100-SXM2-16GB".
	Model string `json:"model"`
	// MemoryMiB is the device memory in MiB.
	MemoryMiB int64 `json:"memoryMiB"`
	// ComputeUnits counts the device's streaming multiprocessors (or the
	// vendor's equivalent); 0 when unknown.
	ComputeUnits int32 `json:"computeUnits,omitempty"`
	// ComputeCapability is the vendor's architecture version, e.g. "8.0".
	ComputeCapability string `json:"computeCapability,omitempty"`
	// NUMANode is the host NUMA node the device is attached to; -1 when unknown.
	NUMANode int `json:"numaNode"`
	// PCIBusID is the device's PCI address, e.g. "0000:07:00.0".
	PCIBusID string `json:"pciBusID,omitempty"`
	// Health says whether the device may get new containers.
	Health Health `json:"health"`
	// Parent is the ID of the GPU a MIG slice is carved from; empty for a
	// whole GPU.
	Parent string `json:"parent,omitempty"`
	// SliceEnforcer is the mechanism that holds a slice of this device
	// (a share of its memory and compute) to its grant on this node, e.g.
	// EnforcerMPS; empty when nothing does, and slices of it are
	// admitted only under EnforcementBestEffort.
	SliceEnforcer string `json:"sliceEnforcer,omitempty"`
}

// ServedAs is the device resource the device is asked for with.
func (d Device) ServedAs() string {
	if d.Resource == "" {
		return ResourceNVIDIAGPU
	}
	return d.Resource
}

// LinkKind is the kind of path between two devices, best first.
type LinkKind string

const (
	// LinkNVLink is a direct NVLink connection; Link.Count says how many links.
	LinkNVLink LinkKind = "NVLink"
	// LinkNVSwitch is a path through an NVSwitch fabric (all-to-all).
	LinkNVSwitch LinkKind = "NVSwitch"
	// LinkPCIeSwitch is a path through one or more PCIe switches, not
	// through the host bridge (nvidia-smi's PIX and PXB).
	LinkPCIeSwitch LinkKind = "PCIeSwitch"
	// LinkHostBridge is a path through a PCIe host bridge on one CPU socket
	// (nvidia-smi's PHB and NODE).
	LinkHostBridge LinkKind = "HostBridge"
	// LinkCrossSocket is a path across the inter-socket link (nvidia-smi's SYS).
	LinkCrossSocket LinkKind = "CrossSocket"
	// LinkXGMI is AMD's Infinity Fabric (XGMI) between two GPUs of one hive:
	// Link.Hops says how many XGMI hops apart they are (1: linked directly),
	// Link.BandwidthMBps the bandwidth of a direct link, when known.
	LinkXGMI LinkKind = "XGMI"
)

// MaxLinkHops bounds Link.Hops.
const MaxLinkHops = 8

// Valid reports whether k is one of the known link kinds.
func (k LinkKind) Valid() bool {
	switch k {
	case LinkNVLink, LinkNVSwitch, LinkPCIeSwitch, LinkHostBridge, LinkCrossSocket, LinkXGMI:
		return true
	}
	return false
}

// Link is the path between devices A and B (IDs, in either order).
type Link struct {
	A    string   `json:"a"`
	B    string   `json:"b"`
	Kind LinkKind `json:"kind"`
	// Count is the number of NVLink links between the pair (LinkNVLink only).
	Count int `json:"count,omitempty"`
	// BandwidthMBps is the measured or nominal bandwidth in MB/s, when known.
	BandwidthMBps int64 `json:"bandwidthMBps,omitempty"`
	// Hops is how many XGMI hops apart the pair is (LinkXGMI only; 0 is
	// taken as 1), at most MaxLinkHops.
	Hops int `json:"hops,omitempty"`
}

// Label is the short name nvidia-smi topo -m gives the link: NV# (NVLink
// with # links), NVS, PIX, PHB or SYS; for XGMI, rocm-smi's XGMI (directly
// linked) or XGMI# (# hops apart).
func (l Link) Label() string {
	switch l.Kind {
	case LinkNVLink:
		return fmt.Sprintf("NV%d", l.Count)
	case LinkXGMI:
		if l.Hops > 1 {
			return fmt.Sprintf("XGMI%d", l.Hops)
		}
		return "XGMI"
	case LinkNVSwitch:
		return "NVS"
	case LinkPCIeSwitch:
		return "PIX"
	case LinkHostBridge:
		return "PHB"
	default:
		return "SYS"
	}
}

// Inventory is everything a node has to offer: its devices and the pairwise
// links between them. A pair without a Link is treated as LinkCrossSocket,
// the worst path. MIG slices have no links of their own: they use their
// parent's.
type Inventory struct {
	Devices []Device `json:"devices"`
	Links   []Link   `json:"links,omitempty"`
	// KeyIDs are the IDs of the allocation keys the node verifies with
	// ("ALGORITHM:KEYID", as kubeinterface.KeySet.IDs), so that the
	// scheduler sends no GPU pods to a node that would refuse their
	// allocations. Empty: the node does not say (a shim that predates
	// it), and every key is taken to be accepted.
	KeyIDs []string `json:"keyIDs,omitempty"`
}

// MaxKeyIDs bounds the key IDs an inventory lists.
const MaxKeyIDs = 16

// AcceptsKey reports whether the node verifies allocations signed with
// the key of ID id, as far as its inventory says.
func (inv Inventory) AcceptsKey(id string) bool {
	return len(inv.KeyIDs) == 0 || slices.Contains(inv.KeyIDs, id)
}

// ErrInvalidInventory is wrapped by every error of Inventory.Validate.
var ErrInvalidInventory = errors.New("invalid device inventory")

// MaxDeviceStringBytes bounds each string a node publishes about a device
// (ID, UUID, model, ...).
const MaxDeviceStringBytes = 256

// notPrintable reports a character that must not reach logs or terminals:
// control and format characters (escape sequences, bidirectional
// overrides), and what is not valid UTF-8.
func notPrintable(r rune) bool { return !unicode.IsPrint(r) || r == utf8.RuneError }

// Validate checks the inventory's internal consistency: unique non-empty IDs
// and UUIDs of printable strings of at most MaxDeviceStringBytes, known
// health and link kinds, links between known whole devices, no pair twice,
// and parents that exist.
func (inv Inventory) Validate() error {
	if len(inv.KeyIDs) > MaxKeyIDs {
		return fmt.Errorf("%w: %d key IDs, at most %d", ErrInvalidInventory, len(inv.KeyIDs), MaxKeyIDs)
	}
	for _, id := range inv.KeyIDs {
		if id == "" || len(id) > 64 || strings.IndexFunc(id, notPrintable) >= 0 {
			return fmt.Errorf("%w: key ID %q must be 1 to 64 printable characters", ErrInvalidInventory, id)
		}
	}
	ids := make(map[string]int, len(inv.Devices))
	uuids := make(map[string]string, len(inv.Devices))
	for i, d := range inv.Devices {
		if d.ID == "" {
			return fmt.Errorf("%w: device %d has no id", ErrInvalidInventory, i)
		}
		for _, f := range []struct{ name, value string }{{"id", d.ID}, {"uuid", d.UUID}, {"vendor", d.Vendor}, {"resource", d.Resource}, {"model", d.Model},
			{"computeCapability", d.ComputeCapability}, {"pciBusID", d.PCIBusID}, {"parent", d.Parent}, {"sliceEnforcer", d.SliceEnforcer}} {
			if len(f.value) > MaxDeviceStringBytes || strings.IndexFunc(f.value, notPrintable) >= 0 {
				return fmt.Errorf("%w: device %d: %s must be at most %d bytes of printable characters", ErrInvalidInventory, i, f.name, MaxDeviceStringBytes)
			}
		}
		if _, dup := ids[d.ID]; dup {
			return fmt.Errorf("%w: device id %q appears twice", ErrInvalidInventory, d.ID)
		}
		ids[d.ID] = i
		if d.UUID == "" {
			return fmt.Errorf("%w: device %q has no uuid", ErrInvalidInventory, d.ID)
		}
		if other, dup := uuids[d.UUID]; dup {
			return fmt.Errorf("%w: devices %q and %q share uuid %q", ErrInvalidInventory, other, d.ID, d.UUID)
		}
		uuids[d.UUID] = d.ID
		if d.MemoryMiB < 0 || d.ComputeUnits < 0 {
			return fmt.Errorf("%w: device %q has negative capacity", ErrInvalidInventory, d.ID)
		}
		if d.Health != Healthy && d.Health != Unhealthy {
			return fmt.Errorf("%w: device %q has health %q, want %q or %q", ErrInvalidInventory, d.ID, d.Health, Healthy, Unhealthy)
		}
	}
	for _, d := range inv.Devices {
		if d.Parent == "" {
			continue
		}
		p, ok := ids[d.Parent]
		if !ok {
			return fmt.Errorf("%w: device %q has unknown parent %q", ErrInvalidInventory, d.ID, d.Parent)
		}
		if inv.Devices[p].Parent != "" {
			return fmt.Errorf("%w: device %q has parent %q, which is itself a slice", ErrInvalidInventory, d.ID, d.Parent)
		}
		if d.ServedAs() != inv.Devices[p].ServedAs() {
			return fmt.Errorf("%w: device %q is served as %s, its parent %q as %s", ErrInvalidInventory, d.ID, d.ServedAs(), d.Parent, inv.Devices[p].ServedAs())
		}
	}
	type pair struct{ a, b string }
	seen := make(map[pair]bool, len(inv.Links))
	for _, l := range inv.Links {
		if !l.Kind.Valid() {
			return fmt.Errorf("%w: link %s-%s has unknown kind %q", ErrInvalidInventory, l.A, l.B, l.Kind)
		}
		if l.A == l.B {
			return fmt.Errorf("%w: link from %q to itself", ErrInvalidInventory, l.A)
		}
		for _, end := range []string{l.A, l.B} {
			i, ok := ids[end]
			if !ok {
				return fmt.Errorf("%w: link %s-%s names unknown device %q", ErrInvalidInventory, l.A, l.B, end)
			}
			if inv.Devices[i].Parent != "" {
				return fmt.Errorf("%w: link %s-%s names MIG slice %q; slices use their parent's links", ErrInvalidInventory, l.A, l.B, end)
			}
		}
		if l.Count < 0 || l.BandwidthMBps < 0 {
			return fmt.Errorf("%w: link %s-%s has a negative count or bandwidth", ErrInvalidInventory, l.A, l.B)
		}
		if l.Hops < 0 || l.Hops > MaxLinkHops {
			return fmt.Errorf("%w: link %s-%s has %d hops, want 0 to %d", ErrInvalidInventory, l.A, l.B, l.Hops, MaxLinkHops)
		}
		p := pair{l.A, l.B}
		if p.a > p.b {
			p.a, p.b = p.b, p.a
		}
		if seen[p] {
			return fmt.Errorf("%w: link %s-%s appears twice", ErrInvalidInventory, p.a, p.b)
		}
		seen[p] = true
	}
	return nil
}

// LinkLabels is the link matrix as nvidia-smi topo -m labels it: "X" on
// the diagonal, Link.Label elsewhere.
func (inv Inventory) LinkLabels() [][]string {
	m := inv.LinkMatrix()
	out := make([][]string, len(m))
	for i, row := range m {
		out[i] = make([]string, len(row))
		for j, l := range row {
			if i == j {
				out[i][j] = "X"
			} else {
				out[i][j] = l.Label()
			}
		}
	}
	return out
}

// LinkMatrix returns the link between every pair of devices, indexed by the
// devices' positions in inv.Devices. Pairs without a Link get LinkCrossSocket;
// a MIG slice gets its parent's links, and slices of one GPU are joined by
// LinkNVSwitch (they share the GPU's memory fabric). The diagonal is the zero
// Link. inv must be valid.
func (inv Inventory) LinkMatrix() [][]Link {
	n := len(inv.Devices)
	pos := make(map[string]int, n)
	for i, d := range inv.Devices {
		pos[d.ID] = i
	}
	m := make([][]Link, n)
	for i := range m {
		m[i] = make([]Link, n)
		for j := range m[i] {
			if i != j {
				m[i][j] = Link{A: inv.Devices[i].ID, B: inv.Devices[j].ID, Kind: LinkCrossSocket}
			}
		}
	}
	for _, l := range inv.Links {
		a, b := pos[l.A], pos[l.B]
		m[a][b] = Link{A: l.A, B: l.B, Kind: l.Kind, Count: l.Count, BandwidthMBps: l.BandwidthMBps, Hops: l.Hops}
		m[b][a] = Link{A: l.B, B: l.A, Kind: l.Kind, Count: l.Count, BandwidthMBps: l.BandwidthMBps, Hops: l.Hops}
	}
	// Slices inherit their parent's row; two slices of one parent share it.
	root := func(i int) int {
		if p := inv.Devices[i].Parent; p != "" {
			return pos[p]
		}
		return i
	}
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			ri, rj := root(i), root(j)
			if i == j || (ri == i && rj == j) {
				continue
			}
			if ri == rj {
				m[i][j] = Link{A: inv.Devices[i].ID, B: inv.Devices[j].ID, Kind: LinkNVSwitch}
				continue
			}
			l := m[ri][rj]
			l.A, l.B = inv.Devices[i].ID, inv.Devices[j].ID
			m[i][j] = l
		}
	}
	return m
}

// DeviceByID returns the device with the given ID.
func (inv Inventory) DeviceByID(id string) (Device, bool) {
	for _, d := range inv.Devices {
		if d.ID == id {
			return d, true
		}
	}
	return Device{}, false
}
