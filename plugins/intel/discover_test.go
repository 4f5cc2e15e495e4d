package intel

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/kubegpu/kubegpu/types"
)

func tree(name string) string { return filepath.Join("testdata", name) }

// TestDiscoverMax1550: four Max 1550 on i915 beside the BMC's VGA: the
// BMC's card and the connector are passed over; each GPU has its two
// tiles, the backport driver's local memory, its render node and NUMA
// node, and is asked for as gpu.intel.com/i915; GPUs of one socket are
// joined by the host bridge.
func TestDiscoverMax1550(t *testing.T) {
	topo, err := Discover(os.DirFS(tree("max1550-4")), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.GPUs) != 4 {
		t.Fatalf("%d GPUs, want 4", len(topo.GPUs))
	}
	g := topo.GPUs[0]
	want := types.Device{ID: "intel0", Index: 0, UUID: g.UUID, Vendor: Vendor, Resource: types.ResourceIntelI915,
		Model: "Intel Data Center GPU Max 1550", MemoryMiB: 128 << 10, ComputeUnits: 128, NUMANode: 0, PCIBusID: "0000:18:00.0", Health: types.Healthy}
	if g.Device != want || g.Driver != DriverI915 || g.Card != 1 || g.RenderMinor != 128 || g.Tiles != 2 {
		t.Errorf("intel0 = %+v (driver %s, card%d, renderD%d, %d tiles)\nwant %+v, i915, card1, renderD128, 2 tiles", g.Device, g.Driver, g.Card, g.RenderMinor, g.Tiles, want)
	}
	if last := topo.GPUs[3]; last.PCIBusID != "0000:ce:00.0" || last.NUMANode != 1 || last.Card != 4 || last.RenderMinor != 131 {
		t.Errorf("intel3 = %+v, card%d, renderD%d", last.Device, last.Card, last.RenderMinor)
	}
	if !strings.HasPrefix(g.UUID, "GPU-intel-") || len(g.UUID) != len("GPU-intel-")+16 {
		t.Errorf("UUID %q, want GPU-intel- and 16 hex digits", g.UUID)
	}
	again, _ := Discover(os.DirFS(tree("max1550-4")), "node-a")
	other, _ := Discover(os.DirFS(tree("max1550-4")), "node-b")
	if again.GPUs[0].UUID != g.UUID || other.GPUs[0].UUID == g.UUID {
		t.Errorf("UUIDs: %s, again %s, on another node %s; want stable on the node and unlike another node's", g.UUID, again.GPUs[0].UUID, other.GPUs[0].UUID)
	}
	var got []string
	for _, l := range topo.Inventory.Links {
		got = append(got, l.A+"-"+l.B+":"+string(l.Kind))
	}
	if w := []string{"intel0-intel1:HostBridge", "intel2-intel3:HostBridge"}; !slices.Equal(got, w) {
		t.Errorf("links %v, want %v", got, w)
	}
}

// TestDiscoverB580: two Arc B580 on xe: one tile each (xe's tileN), the
// model's nominal memory (xe publishes none), asked for as
// gpu.intel.com/xe, no NUMA node and so no link.
func TestDiscoverB580(t *testing.T) {
	topo, err := Discover(os.DirFS(tree("b580-2")), "ws")
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.GPUs) != 2 || len(topo.Inventory.Links) != 0 {
		t.Fatalf("%d GPUs, links %v; want 2, none", len(topo.GPUs), topo.Inventory.Links)
	}
	for i, g := range topo.GPUs {
		if g.Resource != types.ResourceIntelXe || g.Driver != DriverXe || g.Tiles != 1 || g.MemoryMiB != 12<<10 || g.NUMANode != -1 ||
			g.Card != i || g.RenderMinor != 128+i || g.Model != "Intel Arc B580 Graphics" {
			t.Errorf("GPU %d = %+v, card%d renderD%d, %d tiles", i, g.Device, g.Card, g.RenderMinor, g.Tiles)
		}
	}
}

// copyTree copies a recorded tree to a directory the test may change.
func copyTree(t *testing.T, name string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(tree(name))); err != nil {
		t.Fatal(err)
	}
	return root
}

func write(t *testing.T, root, name, content string) {
	t.Helper()
	p := filepath.Join(root, DRMDir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDiscoverHealthAndSkips: what the kernel says of a GPU's health
// makes it unhealthy; a card bound to another driver (vfio-pci) and a
// physical function whose virtual functions are enabled serve no
// container, and discovery says why.
func TestDiscoverHealthAndSkips(t *testing.T) {
	root := copyTree(t, "b580-2")
	write(t, root, "card0/device/gpu_health", "critical\n")
	topo, err := Discover(os.DirFS(root), "ws")
	if err != nil {
		t.Fatal(err)
	}
	if topo.GPUs[0].Health != types.Unhealthy || topo.GPUs[1].Health != types.Healthy {
		t.Errorf("health %s, %s; want Unhealthy (gpu_health critical), Healthy", topo.GPUs[0].Health, topo.GPUs[1].Health)
	}
	write(t, root, "card1/device/survivability_mode", "Survivability mode type: Runtime\n")
	if topo, _ = Discover(os.DirFS(root), "ws"); topo.GPUs[1].Health != types.Unhealthy {
		t.Errorf("a GPU in survivability mode is %s", topo.GPUs[1].Health)
	}

	root = copyTree(t, "max1550-4")
	write(t, root, "card1/device/uevent", "DRIVER=vfio-pci\nPCI_CLASS=38000\nPCI_ID=8086:0BD5\nPCI_SLOT_NAME=0000:18:00.0\n")
	write(t, root, "card2/device/sriov_numvfs", "4\n")
	write(t, root, "card3/device_memory_health", "REPLACE\n")
	topo, err = Discover(os.DirFS(root), "n")
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.GPUs) != 2 || len(topo.Skipped) != 2 || !strings.Contains(topo.Skipped[0], `bound to "vfio-pci"`) ||
		!strings.Contains(topo.Skipped[1], "4 virtual functions") {
		t.Errorf("GPUs %d, skipped %q; want 2 and the vfio-pci card and the physical function", len(topo.GPUs), topo.Skipped)
	}
	if topo.GPUs[0].Health != types.Unhealthy {
		t.Errorf("a GPU whose memory must be replaced is %s", topo.GPUs[0].Health)
	}
}

// TestDiscoverErrors: no DRM and no Intel GPU are errors; an odd card
// serves no container and says why, the others do; an endless directory
// is bounded.
func TestDiscoverErrors(t *testing.T) {
	empty := t.TempDir()
	if _, err := Discover(os.DirFS(empty), "n"); !errors.Is(err, errNoDRM) {
		t.Errorf("no sysfs: %v, want errNoDRM", err)
	}
	for _, tc := range []struct{ file, content, want string }{
		{"card0/device/uevent", "DRIVER=xe\nPCI_CLASS=30000\nPCI_ID=8086:E20B\nPCI_SLOT_NAME=../../x\n", `PCI_SLOT_NAME "../../x": want a PCI address`},
		{"card0/lmem_total_bytes", "lots\n", `card0/lmem_total_bytes "lots": want a decimal number of bytes`},
		{"card1/lmem_total_bytes", "1099511627777\n", "at most 1099511627776"},
		{"card1/device/uevent", strings.Repeat("x", maxFileBytes+1), "longer than"},
	} {
		root := copyTree(t, "b580-2")
		write(t, root, tc.file, tc.content)
		topo, err := Discover(os.DirFS(root), "n")
		if err != nil || len(topo.GPUs) != 1 || len(topo.Skipped) != 1 || !strings.Contains(topo.Skipped[0], tc.want) {
			t.Errorf("%s %.20q: %d GPUs, skipped %q, %v; want one GPU, the other skipped saying %q", tc.file, tc.content, len(topo.GPUs), topo.Skipped, err, tc.want)
		}
	}
	// A virtual function has none of the model's memory and cores.
	root := copyTree(t, "b580-2")
	write(t, root, "card1/device/physfn/uevent", "")
	if topo, _ := Discover(os.DirFS(root), "n"); topo.GPUs[1].MemoryMiB != 0 || topo.GPUs[1].ComputeUnits != 0 {
		t.Errorf("a virtual function: %+v, want memory and cores unknown", topo.GPUs[1].Device)
	}
	root = t.TempDir()
	for i := range maxCards + 1 {
		write(t, root, "card"+strconv.Itoa(i)+"/x", "")
	}
	if _, err := Discover(os.DirFS(root), "n"); err == nil || !strings.Contains(err.Error(), "more than 256 cards") {
		t.Errorf("257 cards: %v", err)
	}
	if _, err := NewModule().NodePlugin(context.Background(), types.PluginConfig{Options: map[string]string{OptionRoot: empty}}); !errors.Is(err, types.ErrNoDevices) {
		t.Errorf("a node without Intel GPUs: %v, want ErrNoDevices", err)
	}
}

// FuzzDiscover: whatever a card's uevent, memory and tile files hold,
// discovery does not panic, and what it serves is valid and bounded.
func FuzzDiscover(f *testing.F) {
	f.Add("DRIVER=i915\nPCI_CLASS=38000\nPCI_ID=8086:0BD5\nPCI_SLOT_NAME=0000:18:00.0\n", "137438953472\n", "0\n")
	f.Add("DRIVER=xe\nPCI_ID=8086:E20B\nPCI_CLASS=30000\nPCI_SLOT_NAME=0000:03:00.0", "", "-1")
	f.Add("PCI_ID=8086\nDRIVER=\n=\n", "99999999999999999999", "x")
	f.Fuzz(func(t *testing.T, uevent, lmem, numa string) {
		fsys := fstest.MapFS{
			DRMDir + "/card1/device/uevent":             {Data: []byte(uevent)},
			DRMDir + "/card1/device/numa_node":          {Data: []byte(numa)},
			DRMDir + "/card1/device/drm/renderD128/dev": {Data: []byte("226:128\n")},
			DRMDir + "/card1/lmem_total_bytes":          {Data: []byte(lmem)},
			DRMDir + "/card1/gt/gt0/id":                 {Data: []byte("0\n")},
		}
		topo, err := Discover(fsys, "n")
		if err != nil {
			return
		}
		if err := topo.Inventory.Validate(); err != nil {
			t.Fatalf("discovery served an invalid inventory: %v", err)
		}
		for _, g := range topo.GPUs {
			if g.MemoryMiB < 0 || g.MemoryMiB > maxMemoryBytes>>20 || g.NUMANode < -1 || g.NUMANode > 1<<10 {
				t.Fatalf("out of bounds: %+v", g.Device)
			}
		}
	})
}
