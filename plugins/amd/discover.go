package amd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/kubegpu/kubegpu/types"
)

// Vendor is the Device.Vendor of AMD GPUs.
const Vendor = "amd.com"

// IDPrefix starts the device IDs of AMD GPUs (amd0, amd1, ... in the
// order of their KFD topology nodes), so that they never collide with
// another module's on a node with GPUs of two vendors (NVIDIA's are gpuN).
const IDPrefix = "amd"

// PCIVendorID is AMD's (ATI's) PCI vendor ID, as KFD prints it.
const PCIVendorID = 0x1002

// Link weights amdkfd gives (drivers/gpu/drm/amd/amdkfd/kfd_crat.c): 15 per
// XGMI hop between whole GPUs (KFD_CRAT_XGMI_WEIGHT), 13 between
// partitions on one socket (KFD_CRAT_INTRA_SOCKET_WEIGHT), and 20 for a
// PCIe link.
const (
	kfdWeightPerHop     = 15
	kfdWeightIntraSock  = 13
	kfdWeightPCIe       = 20
	renderMinorFirst    = 128
	renderMinorMaxValue = 1<<20 - 1 // MINORBITS
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
	// Generation is the KFD topology's generation_id when it was read (0
	// where the tree has none): the kernel changes it, and renumbers nodes
	// and render minors, when a GPU comes or goes. Whoever builds
	// container edits from a Topology must check that it is still current.
	Generation uint64
	// Hidden counts the KFD nodes discovery may not read: amdkfd answers
	// EPERM for the GPUs outside the reader's device cgroup, so a shim
	// that should serve every GPU needs every render node allowed.
	Hidden int
}

// Discover reads the GPUs and their links from the KFD topology under root,
// the host's root directory ("/" on a node; a recorded tree in tests). A
// host without the amdgpu driver's topology gives an error wrapping
// types.ErrNoDevices.
func Discover(root string) (Topology, error) {
	return DiscoverFS(os.DirFS(root))
}

// DiscoverFS is Discover on a file system rooted at the host's root.
func DiscoverFS(fsys fs.FS) (Topology, error) {
	nodes, generation, hidden, err := readTopology(fsys)
	if errors.Is(err, errNoKFD) {
		return Topology{}, fmt.Errorf("%w: %w", types.ErrNoDevices, err)
	}
	if err != nil {
		return Topology{}, err
	}
	t := Topology{Generation: generation, Hidden: hidden}
	// Partitions of one GPU share its unique_id (and its PCI function, to
	// which amdkfd adds the partition's number in location_id).
	perUnique := map[uint64]int{}
	for _, n := range nodes {
		if n.gpu() && n.props["unique_id"] != 0 {
			perUnique[n.props["unique_id"]]++
		}
	}
	byNode := map[int]int{} // KFD node → index in t.GPUs
	minors := map[int]int{}
	numbered := map[uint64]int{}
	for _, n := range nodes {
		if !n.gpu() {
			continue
		}
		if v := n.props["vendor_id"]; v != PCIVendorID {
			return Topology{}, fmt.Errorf("KFD node %d: vendor_id %#x, want AMD's %#x", n.id, v, PCIVendorID)
		}
		unique := n.props["unique_id"]
		g, err := gpuOf(fsys, n, len(t.GPUs), perUnique[unique] > 1)
		if err != nil {
			return Topology{}, err
		}
		if other, dup := minors[g.RenderMinor]; dup {
			return Topology{}, fmt.Errorf("KFD nodes %d and %d: both have render minor %d", other, n.id, g.RenderMinor)
		}
		minors[g.RenderMinor] = n.id
		if perUnique[unique] > 1 {
			g.UUID = fmt.Sprintf("%s-%d", g.UUID, numbered[unique])
			numbered[unique]++
		}
		byNode[n.id] = len(t.GPUs)
		t.GPUs = append(t.GPUs, g)
	}
	if len(t.GPUs) == 0 {
		return Topology{}, fmt.Errorf("%w: the KFD topology lists no GPU this reader may see (%d hidden)", types.ErrNoDevices, hidden)
	}
	for _, g := range t.GPUs {
		t.Inventory.Devices = append(t.Inventory.Devices, g.Device)
	}
	t.Inventory.Links = links(nodes, byNode, t.GPUs)
	if err := t.Inventory.Validate(); err != nil {
		return Topology{}, fmt.Errorf("KFD topology: %w", err)
	}
	return t, nil
}

// gpuOf is KFD node n as the k-th GPU; partition says n is one of several
// partitions of a GPU.
func gpuOf(fsys fs.FS, n kfdNode, k int, partition bool) (GPU, error) {
	p := n.props
	loc, domain := p["location_id"], p["domain"]
	if partition {
		loc &^= 0x7 // the partition's number, not the PCI function
	}
	bdf := fmt.Sprintf("%04x:%02x:%02x.%x", domain&0xffff, (loc>>8)&0xff, (loc>>3)&0x1f, loc&0x7)
	minor := p["drm_render_minor"]
	if minor < renderMinorFirst || minor > renderMinorMaxValue {
		return GPU{}, fmt.Errorf("KFD node %d: drm_render_minor %d: want a render node's (%d to %d)", n.id, minor, renderMinorFirst, renderMinorMaxValue)
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
	return GPU{
		KFDNode:     n.id,
		RenderMinor: int(minor),
		Device: types.Device{
			ID:                IDPrefix + strconv.Itoa(k),
			Index:             k,
			UUID:              uuid,
			Vendor:            Vendor,
			Resource:          types.ResourceAMDGPU,
			Model:             model(p["device_id"], cus),
			MemoryMiB:         int64(n.vramBytes >> 20),
			ComputeUnits:      cus,
			ComputeCapability: gfxTarget(p["gfx_target_version"]),
			NUMANode:          numaNode(fsys, bdf),
			PCIBusID:          bdf,
			Health:            types.Healthy,
		},
	}, nil
}

// gfxTarget names an LLVM target from KFD's gfx_target_version (major *
// 10000 + minor * 100 + stepping, decimal): 90402 is gfx942.
func gfxTarget(v uint64) string {
	if v == 0 || v >= 1000000 {
		return ""
	}
	return fmt.Sprintf("gfx%d%d%x", v/10000, v/100%100, v%100)
}

// numaNode is the PCI device's NUMA node from sysfs, -1 when unknown.
func numaNode(fsys fs.FS, bdf string) int {
	r := &reader{fsys: fsys, budget: maxFileBytes}
	data, err := r.file(path.Join("sys/bus/pci/devices", bdf, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(data))
	if err != nil || n < 0 || n > 1<<16 {
		return -1
	}
	return n
}
