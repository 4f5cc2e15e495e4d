package amd

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/kubegpu/kubegpu/types"
)

// tree is a KFD topology built in memory: GPU nodes from 2 on (0 and 1 are
// CPUs), each with the properties gpu gives it and the links links adds.
type tree struct{ fs fstest.MapFS }

func newTree() *tree {
	t := &tree{fs: fstest.MapFS{}}
	for _, cpu := range []int{0, 1} {
		t.put(cpu, "gpu_id", "0")
		t.put(cpu, "properties", "cpu_cores_count 96\nsimd_count 0\n")
	}
	return t
}

func (t *tree) put(node int, file, data string) {
	t.fs[path.Join(TopologyDir, "nodes", fmt.Sprint(node), file)] = &fstest.MapFile{Data: []byte(data + "\n")}
}

// gpu adds GPU node n with render minor 128+n-2 and the extra properties.
func (t *tree) gpu(n int, extra ...string) {
	props := []string{"cpu_cores_count 0", "simd_count 416", "simd_per_cu 4", "vendor_id 4098", "device_id 29708",
		fmt.Sprintf("drm_render_minor %d", 126+n), fmt.Sprintf("location_id %d", (0x20+n)<<8), "hive_id 99",
		fmt.Sprintf("unique_id %d", 1000+n)}
	props = append(props, extra...)
	t.put(n, "gpu_id", fmt.Sprint(n))
	t.put(n, "properties", strings.Join(props, "\n"))
	t.put(n, "mem_banks/0/properties", "heap_type 1\nsize_in_bytes 68702699520")
}

func (t *tree) link(kind string, from, to, i int, lines ...string) {
	t.put(from, fmt.Sprintf("%s/%d/properties", kind, i), fmt.Sprintf("node_from %d\nnode_to %d\n%s", from, to, strings.Join(lines, "\n")))
}

// TestPartitions: the partitions of one GPU (one unique_id, amdkfd's
// location_id carrying the partition's number) get numbered UUIDs and
// their GPU's PCI address; weight 13 between them is one hop.
func TestPartitions(t *testing.T) {
	tr := newTree()
	for i, n := range []int{2, 3} {
		tr.gpu(n, "unique_id 7", fmt.Sprintf("location_id %d", 0x0500|i), "num_xcc 1")
	}
	tr.link("io_links", 2, 3, 0, "type 11", "weight 13", "flags 1")
	topo, err := DiscoverFS(tr.fs)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := topo.GPUs[0], topo.GPUs[1]; a.UUID != "GPU-0000000000000007-0" || b.UUID != "GPU-0000000000000007-1" || a.PCIBusID != "0000:05:00.0" || b.PCIBusID != "0000:05:00.0" {
		t.Errorf("partitions %+v and %+v", a.Device, b.Device)
	}
	if l := topo.Inventory.Links; len(l) != 1 || l[0].Kind != types.LinkXGMI || l[0].Hops != 1 {
		t.Errorf("links %+v, want one XGMI hop", l)
	}
}

func TestXGMIHops(t *testing.T) {
	for w, want := range map[uint64]int{0: 1, 13: 1, 15: 1, 30: 2, 41: 1, 45: 3, 56: 2, 1 << 40: types.MaxLinkHops} {
		if got := xgmiHops(w); got != want {
			t.Errorf("xgmiHops(%d) = %d, want %d", w, got, want)
		}
	}
}

// TestLinksHeeded: XGMI only between GPUs of one hive, from io_links, and
// enabled with peer-to-peer DMA; a PCIe path through one CPU is a host
// bridge; a path across sockets is no link.
func TestLinksHeeded(t *testing.T) {
	tr := newTree()
	for n := 2; n <= 7; n++ {
		tr.gpu(n)
	}
	tr.gpu(8, "hive_id 5") // another hive
	tr.link("io_links", 2, 3, 0, "type 11", "weight 15", "max_bandwidth 50000", "flags 1")
	tr.link("io_links", 2, 4, 1, "type 11", "weight 15", "flags 0")  // not enabled
	tr.link("io_links", 2, 5, 2, "type 11", "weight 15", "flags 17") // no peer-to-peer DMA
	tr.link("io_links", 2, 8, 3, "type 11", "weight 15", "flags 1")  // another hive
	tr.link("p2p_links", 3, 6, 0, "type 11", "weight 40", "flags 3") // an indirect path: its type is the first io_link's
	tr.link("p2p_links", 4, 7, 0, "type 2", "weight 72", "flags 3")  // across sockets
	topo, err := DiscoverFS(tr.fs)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]types.Link{}
	for _, l := range topo.Inventory.Links {
		got[l.A+"-"+l.B] = l
	}
	want := map[string]types.Link{"amd0-amd1": {A: "amd0", B: "amd1", Kind: types.LinkXGMI, Hops: 1, BandwidthMBps: 50000}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("links %v, want %v", got, want)
	}

	// The same path as PCIe through one CPU: a host bridge.
	tr.link("p2p_links", 3, 6, 0, "type 2", "weight 40", "flags 3")
	if topo, err = DiscoverFS(tr.fs); err != nil {
		t.Fatal(err)
	}
	if m := topo.Inventory.LinkMatrix(); m[1][4].Kind != types.LinkHostBridge || m[0][1].Kind != types.LinkXGMI {
		t.Errorf("amd1-amd4 %+v, want a host bridge", m[1][4])
	}
}

// permFS answers EPERM for one node's files, as amdkfd does for a GPU
// outside the reader's device cgroup.
type permFS struct {
	fstest.MapFS
	node string
}

func (p permFS) Open(name string) (fs.File, error) {
	if strings.HasPrefix(name, p.node+"/") {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
	}
	return p.MapFS.Open(name)
}

func (p permFS) Stat(name string) (fs.FileInfo, error) {
	if strings.HasPrefix(name, p.node+"/") {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrPermission}
	}
	return p.MapFS.Stat(name)
}

// TestHiddenGPUs: a GPU the reader may not see is left out and counted;
// none visible at all is a node without devices.
func TestHiddenGPUs(t *testing.T) {
	tr := newTree()
	tr.gpu(2)
	tr.gpu(3)
	tr.link("io_links", 2, 3, 0, "type 11", "weight 15", "flags 1")
	topo, err := DiscoverFS(permFS{tr.fs, path.Join(TopologyDir, "nodes", "3")})
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.GPUs) != 1 || topo.Hidden != 1 || len(topo.Inventory.Links) != 0 {
		t.Errorf("%d GPUs, %d hidden, links %v: want 1, 1, none", len(topo.GPUs), topo.Hidden, topo.Inventory.Links)
	}
	only := newTree()
	only.gpu(2)
	if _, err := DiscoverFS(permFS{only.fs, path.Join(TopologyDir, "nodes", "2")}); !errors.Is(err, types.ErrNoDevices) || !strings.Contains(err.Error(), "1 hidden") {
		t.Errorf("every GPU hidden: %v, want ErrNoDevices naming 1 hidden", err)
	}
}

// TestOneGPUOnce: a node directory named twice ("2" and "02") is read
// once, and two GPUs with one render node are refused.
func TestOneGPUOnce(t *testing.T) {
	tr := newTree()
	tr.gpu(2)
	for name, f := range tr.fs {
		if strings.Contains(name, "/nodes/2/") {
			tr.fs[strings.Replace(name, "/nodes/2/", "/nodes/02/", 1)] = f
		}
	}
	topo, err := DiscoverFS(tr.fs)
	if err != nil || len(topo.GPUs) != 1 {
		t.Errorf("nodes 2 and 02: %d GPUs, %v; want 1", len(topo.GPUs), err)
	}
	tr.gpu(3, "drm_render_minor 128")
	if _, err := DiscoverFS(tr.fs); err == nil || !strings.Contains(err.Error(), "both have render minor 128") {
		t.Errorf("two GPUs on renderD128: %v", err)
	}
}

// TestModelsAndNUMA: MI250X and MI250 differ in compute units; a GPU whose
// PCI device says no NUMA node gets -1; an odd gfx version none.
func TestModelsAndNUMA(t *testing.T) {
	tr := newTree()
	tr.gpu(2, "simd_count 440", "gfx_target_version 90010")
	tr.gpu(3, "device_id 4660", "gfx_target_version 4294967295")
	topo, err := DiscoverFS(tr.fs)
	if err != nil {
		t.Fatal(err)
	}
	a, b := topo.GPUs[0], topo.GPUs[1]
	if a.Model != "AMD Instinct MI250X" || a.ComputeUnits != 110 || a.NUMANode != -1 || a.ComputeCapability != "gfx90a" {
		t.Errorf("amd0 %+v", a.Device)
	}
	if b.Model != "AMD GPU 0x1234" || b.ComputeCapability != "" {
		t.Errorf("amd1 %+v", b.Device)
	}
}
