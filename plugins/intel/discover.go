package intel

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/kubegpu/kubegpu/plugins/sysfs"
	"github.com/kubegpu/kubegpu/types"
)

// Vendor is the Device.Vendor of Intel GPUs.
const Vendor = "intel.com"

// IDPrefix starts the device IDs of Intel GPUs: intel0, intel1, ... in
// the order of their PCI addresses, so that a GPU keeps its ID when the
// kernel numbers its card otherwise, and no ID collides with another
// module's.
const IDPrefix = "intel"

// Drivers and the device resource each one's GPUs are asked for with, as
// Intel's GPU device plugin names them.
const (
	DriverI915 = "i915"
	DriverXe   = "xe"
)

// DRMDir is where the kernel lists DRM devices, under the host's root.
const DRMDir = sysfs.DRMDir

// Bounds on what discovery reads, whatever the tree holds.
const (
	maxCards     = 256
	maxDirLen    = 256
	maxFileBytes = 4 << 10
	maxReadBytes = 1 << 20
	// maxMemoryBytes bounds a GPU's local memory (1 TiB).
	maxMemoryBytes = 1 << 40
)

// pciVendorIntel is Intel's PCI vendor ID, as uevent prints it.
const pciVendorIntel = "8086"

// GPU is one Intel GPU: its device, and what the node needs to give it to
// a container.
type GPU struct {
	types.Device
	// Driver is the kernel driver bound to it: DriverI915 or DriverXe.
	Driver string
	// Card and RenderMinor name its device nodes: /dev/dri/cardN and
	// /dev/dri/renderDM.
	Card, RenderMinor int
	// Tiles counts its tiles (i915's gt/gtN, xe's device/tileN), 1 at
	// least.
	Tiles int
}

// Topology is what discovery found: the GPUs and their inventory.
type Topology struct {
	GPUs      []GPU
	Inventory types.Inventory
	// Skipped says, per card, why it serves no container: bound to another
	// driver, a physical function whose virtual functions serve instead.
	Skipped []string
}

// errNoDRM is wrapped when the tree has no Intel GPU.
var errNoDRM = errors.New("no Intel GPU")

// Discover reads the Intel GPUs of the tree under root. node names the
// node, for the GPUs' UUIDs: sysfs has no serial number, so a GPU's UUID
// is a hash of the node's name and the GPU's PCI address, stable across
// restarts and unique in the cluster.
func Discover(fsys fs.FS, node string) (Topology, error) {
	r := &sysfs.Reader{FS: fsys, MaxFileBytes: maxFileBytes, Budget: maxReadBytes}
	entries, err := fs.ReadDir(fsys, DRMDir)
	if errors.Is(err, fs.ErrNotExist) {
		return Topology{}, fmt.Errorf("%w: /%s does not exist", errNoDRM, DRMDir)
	}
	if err != nil {
		return Topology{}, fmt.Errorf("read /%s: %w", DRMDir, err)
	}
	var t Topology
	seen := 0
	for _, e := range entries {
		card, ok := sysfs.Number(e.Name(), "card")
		if !ok {
			continue
		}
		if seen++; seen > maxCards {
			return Topology{}, fmt.Errorf("/%s: more than %d cards", DRMDir, maxCards)
		}
		g, skip, err := readCard(r, card)
		if err != nil {
			if r.Budget == 0 {
				return Topology{}, err // the tree is over the bound: no card after it is read
			}
			// One odd card serves no container; the others do.
			t.Skipped = append(t.Skipped, fmt.Sprintf("card%d: %v", card, err))
			continue
		}
		if skip != "" {
			t.Skipped = append(t.Skipped, skip)
			continue
		}
		if g != nil {
			t.GPUs = append(t.GPUs, *g)
		}
	}
	if len(t.GPUs) == 0 {
		return t, fmt.Errorf("%w under /%s", errNoDRM, DRMDir)
	}
	slices.SortFunc(t.GPUs, func(a, b GPU) int { return strings.Compare(a.PCIBusID, b.PCIBusID) })
	for i := range t.GPUs {
		g := &t.GPUs[i]
		g.ID, g.Index = IDPrefix+strconv.Itoa(i), i
		sum := sha256.Sum256([]byte(node + "/" + g.PCIBusID))
		g.UUID = "GPU-intel-" + hex.EncodeToString(sum[:8])
		t.Inventory.Devices = append(t.Inventory.Devices, g.Device)
	}
	t.Inventory.Links = links(t.GPUs)
	if err := t.Inventory.Validate(); err != nil {
		return Topology{}, err
	}
	return t, nil
}

// readCard reads card N: nil for a card that is not an Intel GPU, a
// reason for one that serves no container.
func readCard(r *sysfs.Reader, card int) (*GPU, string, error) {
	dir := path.Join(DRMDir, "card"+strconv.Itoa(card))
	ev, err := r.Uevent(path.Join(dir, "device", "uevent"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil // a connector (card0-DP-1) or no device
	}
	if err != nil {
		return nil, "", err
	}
	vendor, devID, _ := strings.Cut(ev["PCI_ID"], ":")
	class := ev["PCI_CLASS"]
	if !strings.EqualFold(vendor, pciVendorIntel) || (class != "30000" && class != "38000") {
		return nil, "", nil
	}
	devID = "0x" + strings.ToLower(devID)
	bdf := ev["PCI_SLOT_NAME"]
	if !pciAddress(bdf) {
		return nil, "", fmt.Errorf("/%s/device/uevent: PCI_SLOT_NAME %q: want a PCI address", dir, sysfs.Truncate(bdf))
	}
	driver := ev["DRIVER"]
	if driver != DriverI915 && driver != DriverXe {
		return nil, fmt.Sprintf("card%d (%s, %s): bound to %q, not i915 or xe", card, bdf, devID, driver), nil
	}
	if vfs, err := r.Line(path.Join(dir, "device", "sriov_numvfs")); err == nil && vfs != "0" {
		return nil, fmt.Sprintf("card%d (%s): a physical function with %s virtual functions, which serve instead", card, bdf, sysfs.Truncate(vfs)), nil
	}
	render, err := renderMinor(path.Join(dir, "device", "drm"), r.FS)
	if err != nil {
		return nil, "", err
	}
	m := modelOf(devID)
	// A virtual function shares its GPU: the model's memory and cores are
	// the whole GPU's, not its own.
	if _, err := fs.Stat(r.FS, path.Join(dir, "device", "physfn")); err == nil {
		m.memoryMiB, m.xeCores = 0, 0
	}
	g := &GPU{Driver: driver, Card: card, RenderMinor: render, Tiles: tiles(r.FS, dir, driver), Device: types.Device{
		Vendor: Vendor, Resource: ResourcePrefix + driver, Model: m.name, MemoryMiB: m.memoryMiB, ComputeUnits: m.xeCores,
		PCIBusID: bdf, NUMANode: numaNode(r, dir), Health: types.Healthy,
	}}
	// The backport i915 driver sums every tile's local memory here.
	if v, err := r.Line(path.Join(dir, "lmem_total_bytes")); err == nil {
		b, perr := strconv.ParseUint(v, 10, 64)
		if perr != nil || b > maxMemoryBytes {
			return nil, "", fmt.Errorf("/%s/lmem_total_bytes %q: want a decimal number of bytes, at most %d", dir, sysfs.Truncate(v), uint64(maxMemoryBytes))
		}
		g.MemoryMiB = int64(b >> 20)
	}
	g.Health = health(r, dir)
	return g, "", nil
}

// renderMinor is the minor of the card's render node, from the entries
// of its PCI device's drm directory (renderD128).
func renderMinor(dir string, fsys fs.FS) (int, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return 0, fmt.Errorf("/%s: %w", dir, err)
	}
	for i, e := range entries {
		if i == maxDirLen {
			break
		}
		if n, ok := sysfs.Number(e.Name(), "renderD"); ok {
			return n, nil
		}
	}
	return 0, fmt.Errorf("/%s: no render node", dir)
}

// tiles counts the GPU's tiles: i915 lists them as gt/gtN under the card,
// xe as tileN under the PCI device.
func tiles(fsys fs.FS, dir, driver string) int {
	sub, prefix := path.Join(dir, "gt"), "gt"
	if driver == DriverXe {
		sub, prefix = path.Join(dir, "device"), "tile"
	}
	entries, _ := fs.ReadDir(fsys, sub)
	n := 0
	for i, e := range entries {
		if i == maxDirLen {
			break
		}
		if _, ok := sysfs.Number(e.Name(), prefix); ok {
			n++
		}
	}
	return max(n, 1)
}

// numaNode is the PCI device's NUMA node; -1 where the kernel does not
// know it.
func numaNode(r *sysfs.Reader, dir string) int {
	v, err := r.Line(path.Join(dir, "device", "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < -1 || n > 1<<10 {
		return -1
	}
	return n
}

// health judges the GPU from what the kernel publishes: xe's
// survivability_mode (present only while the firmware must be
// reflashed), xe's gpu_health (critical), and the backport i915's
// device_memory_health (a degraded memory that must be replaced).
func health(r *sysfs.Reader, dir string) types.Health {
	dev := path.Join(dir, "device")
	if _, err := fs.Stat(r.FS, path.Join(dev, "survivability_mode")); err == nil {
		return types.Unhealthy
	}
	if v, err := r.Line(path.Join(dev, "gpu_health")); err == nil && v == "critical" {
		return types.Unhealthy
	}
	if v, err := r.Line(path.Join(dir, "device_memory_health")); err == nil && (v == "DEGRADED" || v == "REPLACE") {
		return types.Unhealthy
	}
	return types.Healthy
}

// links joins GPUs of one NUMA node by the host bridge and others across
// sockets: sysfs shows no GPU fabric (Xe Link) between Intel GPUs.
func links(gpus []GPU) []types.Link {
	var out []types.Link
	for i := range gpus {
		for j := i + 1; j < len(gpus); j++ {
			if a, b := gpus[i].NUMANode, gpus[j].NUMANode; a >= 0 && a == b {
				out = append(out, types.Link{A: gpus[i].ID, B: gpus[j].ID, Kind: types.LinkHostBridge})
			}
		}
	}
	return out
}

// pciAddress reports whether s is a PCI address, 0000:3a:00.0.
func pciAddress(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' {
		return false
	}
	for i, c := range s {
		if i == 4 || i == 7 || i == 10 {
			continue
		}
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}
