package amd

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/kubegpu/kubegpu/types"
)

// TestDiscoverMI300X: eight MI300X in one XGMI hive, every pair linked
// directly (testdata/mi300x-8).
func TestDiscoverMI300X(t *testing.T) {
	topo, err := Discover(filepath.Join("testdata", "mi300x-8"))
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(topo.GPUs))
	}
	g := topo.GPUs[0]
	want := types.Device{ID: "amd0", Index: 0, UUID: "GPU-e3aa140f9a5f9e29", Vendor: Vendor, Resource: types.ResourceAMDGPU, Model: "AMD Instinct MI300X",
		MemoryMiB: 196592, ComputeUnits: 304, ComputeCapability: "gfx942", NUMANode: 0, PCIBusID: "0000:0c:00.0", Health: types.Healthy}
	if g.Device != want {
		t.Errorf("amd0 = %+v\nwant   %+v", g.Device, want)
	}
	if g.RenderMinor != 128 || g.KFDNode != 2 {
		t.Errorf("amd0 render minor %d, KFD node %d; want 128, 2", g.RenderMinor, g.KFDNode)
	}
	if last := topo.GPUs[7]; last.RenderMinor != 184 || last.NUMANode != 1 || last.PCIBusID != "0000:df:00.0" {
		t.Errorf("amd7 = %+v, render minor %d; want 0000:df:00.0 on NUMA node 1, renderD184", last.Device, last.RenderMinor)
	}
	if n := len(topo.Inventory.Links); n != 28 {
		t.Fatalf("%d links, want 28 (every pair of 8)", n)
	}
	for _, l := range topo.Inventory.Links {
		if l.Kind != types.LinkXGMI || l.Hops != 1 {
			t.Errorf("link %+v, want a direct XGMI link", l)
		}
	}
}

// TestDiscoverMI250: four MI250 modules, eight GCDs: two GCDs of a module
// linked at 200 GB/s, some GCDs of different modules at 100 or 50 GB/s,
// the others two hops apart (testdata/mi250-4, from rocm-smi
// --shownodesbw on such a machine).
func TestDiscoverMI250(t *testing.T) {
	topo, err := Discover(filepath.Join("testdata", "mi250-4"))
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.GPUs) != 8 {
		t.Fatalf("%d GCDs, want 8", len(topo.GPUs))
	}
	g := topo.GPUs[5]
	if g.Model != "AMD Instinct MI250" || g.ComputeUnits != 104 || g.MemoryMiB != 65520 || g.ComputeCapability != "gfx90a" || g.NUMANode != 1 {
		t.Errorf("amd5 = %+v", g.Device)
	}
	m := topo.Inventory.LinkMatrix()
	for _, tc := range []struct {
		a, b      int
		hops      int
		bandwidth int64
	}{
		{0, 1, 1, 200000}, {6, 7, 1, 200000}, {0, 6, 1, 100000}, {2, 4, 1, 100000},
		{0, 2, 1, 50000}, {5, 7, 1, 50000}, {0, 3, 2, 0}, {1, 7, 2, 0}, {3, 4, 2, 0},
	} {
		l := m[tc.a][tc.b]
		if l.Kind != types.LinkXGMI || l.Hops != tc.hops || l.BandwidthMBps != tc.bandwidth {
			t.Errorf("gpu%d-gpu%d: %+v, want XGMI, %d hops, %d MB/s", tc.a, tc.b, l, tc.hops, tc.bandwidth)
		}
		if r := m[tc.b][tc.a]; r.A != l.B || r.B != l.A || r.Kind != l.Kind || r.Hops != l.Hops || r.BandwidthMBps != l.BandwidthMBps {
			t.Errorf("gpu%d-gpu%d: %+v one way, %+v the other", tc.a, tc.b, l, m[tc.b][tc.a])
		}
	}
	labels := topo.Inventory.LinkLabels()
	if got := strings.Join(labels[0], " "); got != "X XGMI XGMI XGMI2 XGMI2 XGMI2 XGMI XGMI2" {
		t.Errorf("amd0's links: %s", got)
	}
}

// TestDiscoverErrors: a host without the driver has no devices (the host
// skips the module); a tree that is there but wrong is an error that names
// the file.
func TestDiscoverErrors(t *testing.T) {
	if _, err := Discover(t.TempDir()); !errors.Is(err, types.ErrNoDevices) {
		t.Errorf("no KFD topology: %v, want ErrNoDevices", err)
	}
	cpuOnly := t.TempDir()
	writeTree(t, cpuOnly, map[string]string{"0/gpu_id": "0\n", "0/properties": "cpu_cores_count 96\nsimd_count 0\n"})
	if _, err := Discover(cpuOnly); !errors.Is(err, types.ErrNoDevices) {
		t.Errorf("CPU nodes only: %v, want ErrNoDevices", err)
	}
	gpu := "cpu_cores_count 0\nsimd_count 1216\nsimd_per_cu 4\nvendor_id 4098\ndevice_id 29857\ndrm_render_minor 128\nunique_id 7\n"
	for name, tc := range map[string]struct {
		files map[string]string
		want  string
	}{
		"not a number":     {map[string]string{"2/gpu_id": "1\n", "2/properties": "simd_count lots\n"}, `nodes/2/properties:1: simd_count: value "lots"`},
		"no value":         {map[string]string{"2/gpu_id": "1\n", "2/properties": "simd_count\n"}, `nodes/2/properties:1: "simd_count": want "key value"`},
		"bad gpu_id":       {map[string]string{"2/gpu_id": "x\n", "2/properties": gpu}, `gpu_id "x"`},
		"another vendor":   {map[string]string{"2/gpu_id": "1\n", "2/properties": strings.Replace(gpu, "4098", "32902", 1)}, "vendor_id 0x8086"},
		"no render node":   {map[string]string{"2/gpu_id": "1\n", "2/properties": strings.Replace(gpu, "drm_render_minor 128", "drm_render_minor 0", 1)}, "drm_render_minor 0"},
		"huge file":        {map[string]string{"2/gpu_id": "1\n", "2/properties": gpu + strings.Repeat("x 1\n", maxFileBytes)}, "longer than"},
		"bad link":         {map[string]string{"2/gpu_id": "1\n", "2/properties": gpu, "2/io_links/0/properties": "type -1\n"}, "io_links/0/properties:1: type"},
		"missing property": {map[string]string{"2/gpu_id": "1\n"}, "properties: no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tc.files)
			_, err := Discover(root)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Discover = %v, want an error containing %q", err, tc.want)
			}
			if errors.Is(err, types.ErrNoDevices) {
				t.Errorf("Discover = %v: a broken tree is not a node without devices", err)
			}
		})
	}
}

// TestDiscoverBounded: a tree with more nodes than discovery reads is
// refused, not read whole.
func TestDiscoverBounded(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, TopologyDir, "nodes")
	for i := 0; i <= maxKFDNodes; i++ {
		if err := os.MkdirAll(filepath.Join(dir, strconv.Itoa(i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Discover(root); err == nil || !strings.Contains(err.Error(), "more than 1024 entries") {
		t.Errorf("Discover = %v, want too many entries", err)
	}
}

// writeTree writes files (paths under the KFD nodes directory) under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		path := filepath.Join(root, TopologyDir, "nodes", name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// FuzzReadProperties: whatever a properties file holds, parsing it returns
// properties or an error, never panics, and keeps no more keys than lines.
func FuzzReadProperties(f *testing.F) {
	f.Add("simd_count 1216\nvendor_id 4098\n")
	f.Add("type 11\nweight 15\n\n")
	f.Add("key\n")
	f.Add("k 18446744073709551616\n")
	f.Fuzz(func(t *testing.T, data string) {
		r := &reader{fsys: fstest.MapFS{"properties": {Data: []byte(data)}}, budget: maxReadBytes}
		p, err := r.properties("properties")
		if err == nil && len(p) > strings.Count(data, "\n")+1 {
			t.Errorf("%d properties from %d lines", len(p), strings.Count(data, "\n")+1)
		}
	})
}
