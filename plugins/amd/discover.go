package amd

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kubegpu/kubegpu/types"
)

// Vendor is the Device.Vendor of AMD GPUs.
const Vendor = "amd.com"

// PCIVendorID is AMD's (ATI's) PCI vendor ID, as KFD prints it.
const PCIVendorID = 0x1002

// kfdWeightPerHop is the weight amdkfd gives each XGMI hop between two GPUs
// (KFD_CRAT_XGMI_WEIGHT in drivers/gpu/drm/amd/amdkfd/kfd_crat.c); GPU
// partitions on one socket get 13 (KFD_CRAT_INTRA_SOCKET_WEIGHT), and a
// PCIe link 20.
const (
	kfdWeightPerHop = 15
	kfdWeightPCIe   = 20
)

// GPU is one GPU (or GPU partition) the KFD topology lists, with what its
// containers need: its render node.
type GPU struct {
	types.Device
	// RenderMinor is the minor of its DRM render node,
	// /dev/dri/renderD<RenderMinor>.
	RenderMinor int
	// KFDNode is its node number in the KFD topology.
	KFDNode int
}

// Topology is what discovery found: the GPUs in KFD node order and the
// inventory (devices and links) they make.
type Topology struct {
	GPUs      []GPU
	Inventory types.Inventory
}

// Discover reads the GPUs and their links from the KFD topology under root,
// the host's root directory ("/" on a node; a recorded tree in tests). A
// host without the amdgpu driver's topology gives an error wrapping
// types.ErrNoDevices.
func Discover(root string) (Topology, error) {
	nodes, err := readTopology(root)
	if errors.Is(err, errNoKFD) {
		return Topology{}, fmt.Errorf("%w: %w", types.ErrNoDevices, err)
	}
	if err != nil {
		return Topology{}, err
	}
	var t Topology
	byNode := map[int]int{} // KFD node → index in t.GPUs
	uuids := map[string]int{}
	for _, n := range nodes {
		if !n.gpu() {
			continue
		}
		if v := n.props["vendor_id"]; v != PCIVendorID {
			return Topology{}, fmt.Errorf("KFD node %d: vendor_id %#x, want AMD's %#x", n.id, v, PCIVendorID)
		}
		g, err := gpuOf(root, n, len(t.GPUs))
		if err != nil {
			return Topology{}, err
		}
		// Partitions of one GPU share its unique_id: number them.
		if k := uuids[g.UUID]; k > 0 {
			uuids[g.UUID] = k + 1
			g.UUID = fmt.Sprintf("%s-%d", g.UUID, k)
		} else {
			uuids[g.UUID] = 1
		}
		byNode[n.id] = len(t.GPUs)
		t.GPUs = append(t.GPUs, g)
	}
	if len(t.GPUs) == 0 {
		return Topology{}, fmt.Errorf("%w: the KFD topology under %s lists no GPU", types.ErrNoDevices, root)
	}
	for _, g := range t.GPUs {
		t.Inventory.Devices = append(t.Inventory.Devices, g.Device)
	}
	t.Inventory.Links = links(nodes, byNode, t.GPUs)
	if err := t.Inventory.Validate(); err != nil {
		return Topology{}, fmt.Errorf("KFD topology under %s: %w", root, err)
	}
	return t, nil
}

// gpuOf is KFD node n as the k-th GPU.
func gpuOf(root string, n kfdNode, k int) (GPU, error) {
	p := n.props
	loc, domain := p["location_id"], p["domain"]
	bdf := fmt.Sprintf("%04x:%02x:%02x.%x", domain, (loc>>8)&0xff, (loc>>3)&0x1f, loc&0x7)
	g := GPU{KFDNode: n.id, RenderMinor: int(p["drm_render_minor"])}
	if g.RenderMinor < 128 {
		return g, fmt.Errorf("KFD node %d: drm_render_minor %d: want a render node's (128 or more)", n.id, g.RenderMinor)
	}
	cus := int32(0)
	if spc := p["simd_per_cu"]; spc > 0 {
		cus = int32(min(p["simd_count"]/spc, 1<<20))
	}
	unique := p["unique_id"]
	uuid := fmt.Sprintf("GPU-%016x", unique)
	if unique == 0 {
		// No serial-derived ID: the PCI address is what names it.
		uuid = "GPU-" + bdf
	}
	g.Device = types.Device{
		ID:                "gpu" + strconv.Itoa(k),
		Index:             k,
		UUID:              uuid,
		Vendor:            Vendor,
		Model:             model(p["device_id"], cus),
		MemoryMiB:         int64(min(n.vramBytes>>20, 1<<40)),
		ComputeUnits:      cus,
		ComputeCapability: gfxTarget(p["gfx_target_version"]),
		NUMANode:          numaNode(root, bdf),
		PCIBusID:          bdf,
		Health:            types.Healthy,
	}
	return g, nil
}

// gfxTarget names an LLVM target from KFD's gfx_target_version (major *
// 10000 + minor * 100 + stepping, decimal): 90402 is gfx942.
func gfxTarget(v uint64) string {
	if v == 0 {
		return ""
	}
	return fmt.Sprintf("gfx%d%d%x", v/10000, v/100%100, v%100)
}

// numaNode is the PCI device's NUMA node from sysfs, -1 when unknown.
func numaNode(root, bdf string) int {
	data, err := readFile(filepath.Join(root, "sys/bus/pci/devices", bdf, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(data))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// links are the links between the GPUs: XGMI where KFD lists an XGMI
// io_link between them (hops from its weight), a host bridge where a
// peer-to-peer path runs through one CPU's PCIe root (two PCIe links);
// other pairs get none (a path across sockets).
func links(nodes []kfdNode, byNode map[int]int, gpus []GPU) []types.Link {
	type pair struct{ a, b int }
	found := map[pair]types.Link{}
	var order []pair
	add := func(from int, l properties) {
		a, okA := byNode[from]
		b, okB := byNode[int(l["node_to"])]
		if !okA || !okB || a == b {
			return
		}
		if a > b {
			a, b = b, a
		}
		var link types.Link
		w := l["weight"]
		switch t := l["type"]; {
		case t == linkTypeXGMI:
			link = types.Link{Kind: types.LinkXGMI, Hops: int(min(max(1, (w+kfdWeightPerHop/2)/kfdWeightPerHop), types.MaxLinkHops)), BandwidthMBps: int64(min(l["max_bandwidth"], 1<<40))}
		case t == linkTypePCIe && w <= 2*kfdWeightPCIe:
			link = types.Link{Kind: types.LinkHostBridge}
		default:
			return
		}
		link.A, link.B = gpus[a].ID, gpus[b].ID
		p := pair{a, b}
		prev, seen := found[p]
		if !seen {
			order = append(order, p)
		}
		if !seen || betterLink(link, prev) {
			found[p] = link
		}
	}
	for _, n := range nodes {
		if !n.gpu() {
			continue
		}
		for _, l := range n.ioLinks {
			add(n.id, l)
		}
		for _, l := range n.p2pLinks {
			add(n.id, l)
		}
	}
	out := make([]types.Link, 0, len(order))
	for _, p := range order {
		out = append(out, found[p])
	}
	return out
}

// betterLink reports whether a, seen from one end of a pair, says more
// than b, seen from the other: XGMI over PCIe, fewer hops, more bandwidth.
func betterLink(a, b types.Link) bool {
	if a.Kind != b.Kind {
		return a.Kind == types.LinkXGMI
	}
	if a.Hops != b.Hops {
		return a.Hops < b.Hops
	}
	return a.BandwidthMBps > b.BandwidthMBps
}
