package nvidia

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"

	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmltest"
	"github.com/kubegpu/kubegpu/types"
)

// testModule is the module on machine m, with a short event wait and an
// empty sysfs.
func testModule(t *testing.T, m *nvmltest.Machine) *module {
	t.Helper()
	mod := NewModuleWithNVML(m).(*module)
	mod.eventTimeout = 10 * time.Millisecond
	mod.sysfs = t.TempDir()
	return mod
}

// startNode starts the node side on m; it is closed when the test ends.
func startNode(t *testing.T, m *nvmltest.Machine, opts map[string]string) *node {
	t.Helper()
	return startNodeOf(t, testModule(t, m), opts)
}

func startNodeOf(t *testing.T, mod *module, opts map[string]string) *node {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	np, err := mod.NodePlugin(ctx, types.PluginConfig{NodeName: "node-a", Options: opts})
	if err != nil {
		t.Fatalf("NodePlugin(%v) error = %v", opts, err)
	}
	t.Cleanup(func() {
		if err := np.Close(); err != nil {
			t.Errorf("Close() error = %v", err)
		}
	})
	return np.(*node)
}

func discover(t testing.TB, np types.NodePlugin) types.Inventory {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	inv, err := np.Discover(ctx)
	if err != nil {
		t.Fatalf("Discover() error = %v", err)
	}
	if err := inv.Validate(); err != nil {
		t.Fatalf("Discover() returned an invalid inventory: %v", err)
	}
	return inv
}

// linkTable renders the link matrix as nvidia-smi topo -m does.
func linkTable(inv types.Inventory) []string {
	var rows []string
	for _, cells := range inv.LinkLabels() {
		rows = append(rows, strings.Join(cells, " "))
	}
	return rows
}

func TestDiscoverDGXA100(t *testing.T) {
	m := nvmltest.NewDGXA100()
	inv := discover(t, startNode(t, m, nil))
	if len(inv.Devices) != 8 {
		t.Fatalf("%d devices, want 8", len(inv.Devices))
	}
	busIDs := []string{"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0", "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"}
	for i, d := range inv.Devices {
		want := types.Device{
			ID:                fmt.Sprintf("gpu%d", i),
			Index:             i,
			UUID:              m.GPUs[i].UUID,
			Vendor:            types.VendorNVIDIA,
			Model:             "NVIDIA A100-SXM4-40GB",
			MemoryMiB:         40960,
			ComputeUnits:      108,
			ComputeCapability: "8.0",
			NUMANode:          i / 4,
			PCIBusID:          busIDs[i],
			Health:            types.Healthy,
		}
		if d != want {
			t.Errorf("device %d =\n%+v\nwant\n%+v", i, d, want)
		}
	}
	if n := len(inv.Links); n != 28 {
		t.Errorf("%d links, want one per pair (28)", n)
	}
	for _, l := range inv.Links {
		if l.Kind != types.LinkNVSwitch {
			t.Errorf("link %s-%s is %s, want NVSwitch everywhere", l.A, l.B, l.Kind)
		}
	}
}

func TestTopology(t *testing.T) {
	tests := []struct {
		name    string
		machine *nvmltest.Machine
		want    []string
	}{
		{
			// The DGX-1 hybrid cube-mesh, as nvidia-smi topo -m prints it.
			name:    "dgx1 nvlink table",
			machine: nvmltest.NewDGX1(),
			want: []string{
				"X NV1 NV1 NV2 NV2 SYS SYS SYS",
				"NV1 X NV2 NV1 SYS NV2 SYS SYS",
				"NV1 NV2 X NV2 SYS SYS NV1 SYS",
				"NV2 NV1 NV2 X SYS SYS SYS NV1",
				"NV2 SYS SYS SYS X NV1 NV1 NV2",
				"SYS NV2 SYS SYS NV1 X NV2 NV1",
				"SYS SYS NV1 SYS NV1 NV2 X NV2",
				"SYS SYS SYS NV1 NV2 NV1 NV2 X",
			},
		},
		{
			name:    "pcie only",
			machine: nvmltest.NewDGXA100().WithoutNVLink(),
			want: []string{
				"X PIX PHB PHB SYS SYS SYS SYS",
				"PIX X PHB PHB SYS SYS SYS SYS",
				"PHB PHB X PIX SYS SYS SYS SYS",
				"PHB PHB PIX X SYS SYS SYS SYS",
				"SYS SYS SYS SYS X PIX PHB PHB",
				"SYS SYS SYS SYS PIX X PHB PHB",
				"SYS SYS SYS SYS PHB PHB X PIX",
				"SYS SYS SYS SYS PHB PHB PIX X",
			},
		},
		{
			// NVSwitches without the fabric manager: no NVLink
			// peer-to-peer, so the PCIe paths count.
			name:    "nvswitch without fabric manager",
			machine: nvmltest.NewDGXA100().WithoutFabricManager(),
			want: []string{
				"X PIX PHB PHB SYS SYS SYS SYS",
				"PIX X PHB PHB SYS SYS SYS SYS",
				"PHB PHB X PIX SYS SYS SYS SYS",
				"PHB PHB PIX X SYS SYS SYS SYS",
				"SYS SYS SYS SYS X PIX PHB PHB",
				"SYS SYS SYS SYS PIX X PHB PHB",
				"SYS SYS SYS SYS PHB PHB X PIX",
				"SYS SYS SYS SYS PHB PHB PIX X",
			},
		},
		{
			name: "pcie levels",
			machine: nvmltest.NewDGXA100().WithoutNVLink().WithPCIeTopology(func(a, b int) nvml.GpuTopologyLevel {
				return []nvml.GpuTopologyLevel{nvml.TOPOLOGY_INTERNAL, nvml.TOPOLOGY_MULTIPLE, nvml.TOPOLOGY_HOSTBRIDGE, nvml.TOPOLOGY_NODE, nvml.TOPOLOGY_SYSTEM, nvml.GpuTopologyLevel(77), nvml.TOPOLOGY_SYSTEM}[max(a, b)-1]
			}),
			want: []string{
				"X PIX PIX PHB PHB SYS SYS SYS",
				"PIX X PIX PHB PHB SYS SYS SYS",
				"PIX PIX X PHB PHB SYS SYS SYS",
				"PHB PHB PHB X PHB SYS SYS SYS",
				"PHB PHB PHB PHB X SYS SYS SYS",
				"SYS SYS SYS SYS SYS X SYS SYS",
				"SYS SYS SYS SYS SYS SYS X SYS",
				"SYS SYS SYS SYS SYS SYS SYS X",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := discover(t, startNode(t, tt.machine, map[string]string{OptionHealthChecks: "false"}))
			if got := linkTable(inv); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("links =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestDGX1Devices(t *testing.T) {
	inv := discover(t, startNode(t, nvmltest.NewDGX1(), nil))
	d := inv.Devices[5]
	if d.Model != "Tesla V100-SXM2-16GB" || d.MemoryMiB != 16160 || d.ComputeUnits != 80 || d.ComputeCapability != "7.0" || d.NUMANode != 1 {
		t.Errorf("gpu5 = %+v", d)
	}
}

func TestLinksAreMeasuredOnce(t *testing.T) {
	m := nvmltest.NewDGX1()
	np := startNode(t, m, map[string]string{OptionHealthChecks: "false"})
	first := discover(t, np)
	calls := len(m.GPUs[0].GetNvLinkStateCalls())
	second := discover(t, np)
	if got := len(m.GPUs[0].GetNvLinkStateCalls()); got != calls {
		t.Errorf("a second discovery queried NVLinks again (%d calls, then %d)", calls, got)
	}
	if !reflect.DeepEqual(first, second) {
		t.Errorf("second discovery differs:\n%+v\n%+v", first, second)
	}
}

func TestFabricManagerLateStartIsSeen(t *testing.T) {
	m := nvmltest.NewDGXA100().WithoutFabricManager()
	np := startNode(t, m, map[string]string{OptionHealthChecks: "false"})
	if got := linkTable(discover(t, np))[0]; got != "X PIX PHB PHB SYS SYS SYS SYS" {
		t.Fatalf("row 0 without the fabric manager = %q", got)
	}
	// The fabric manager comes up: NVLink peer-to-peer works now.
	for _, g := range m.GPUs {
		g.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
	}
	if got := linkTable(discover(t, np))[0]; got != "X NVS NVS NVS NVS NVS NVS NVS" {
		t.Errorf("row 0 with the fabric manager = %q, want NVSwitch", got)
	}
}

func TestDiscoverMIG(t *testing.T) {
	m := nvmltest.NewDGXA100().WithMIG(1, "3g.20gb", "2g.10gb", "1g.5gb").WithMIG(6, "7g.40gb")
	inv := discover(t, startNode(t, m, nil))
	if len(inv.Devices) != 12 {
		t.Fatalf("%d devices, want 8 GPUs and 4 MIG devices", len(inv.Devices))
	}
	type mig struct {
		ID, Parent, UUID, Model string
		Index                   int
		MemoryMiB               int64
		SMs                     int32
	}
	var got []mig
	for _, d := range inv.Devices {
		if d.Parent != "" {
			got = append(got, mig{d.ID, d.Parent, d.UUID, d.Model, d.Index, d.MemoryMiB, d.ComputeUnits})
			if d.PCIBusID == "" || d.ComputeCapability != "8.0" || d.Health != types.Healthy || d.Vendor != types.VendorNVIDIA {
				t.Errorf("MIG device %s = %+v", d.ID, d)
			}
		}
	}
	g1, g6 := m.GPUs[1].MIGDevices, m.GPUs[6].MIGDevices
	want := []mig{
		{"gpu1-mig0", "gpu1", g1[0].UUID, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 1, 19968, 42},
		{"gpu1-mig1", "gpu1", g1[1].UUID, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 1, 9856, 28},
		{"gpu1-mig2", "gpu1", g1[2].UUID, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 1, 4864, 14},
		{"gpu6-mig0", "gpu6", g6[0].UUID, "NVIDIA A100-SXM4-40GB MIG 7g.40gb", 6, 40192, 98},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("MIG devices =\n%+v\nwant\n%+v", got, want)
	}
	if !strings.HasPrefix(g1[0].UUID, "MIG-") {
		t.Errorf("MIG UUID %q", g1[0].UUID)
	}
	// MIG devices use their GPU's links; the GPUs keep theirs.
	if len(inv.Links) != 28 {
		t.Errorf("%d links, want 28 (between whole GPUs only)", len(inv.Links))
	}
}

func TestMIGModeWithoutMIGDevices(t *testing.T) {
	m := nvmltest.NewDGXA100().WithMIG(2)
	inv := discover(t, startNode(t, m, nil))
	if len(inv.Devices) != 7 {
		t.Fatalf("%d devices, want 7: a MIG-mode GPU without MIG devices has nothing to give", len(inv.Devices))
	}
	if _, ok := inv.DeviceByID("gpu2"); ok {
		t.Error("gpu2 advertised")
	}
	if len(inv.Links) != 21 {
		t.Errorf("%d links, want 21", len(inv.Links))
	}
	// It is watched all the same, for the MIG devices it will have.
	if m.Registered(2) != nvml.EventTypeXidCriticalError {
		t.Error("the MIG-mode GPU is not watched for XID errors")
	}
}

func TestNUMAFromSysfs(t *testing.T) {
	m := nvmltest.NewDGXA100().WithNUMAFromSysfs()
	mod := testModule(t, m)
	// sysfs has gpu0 on node 1, gpu1 without NUMA (-1), and nothing for the rest.
	for bus, node := range map[string]string{"0000:07:00.0": "1\n", "0000:0f:00.0": "-1\n"} {
		dir := filepath.Join(mod.sysfs, "bus", "pci", "devices", bus)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(node), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	inv := discover(t, startNodeOf(t, mod, nil))
	var got []int
	for _, d := range inv.Devices[:3] {
		got = append(got, d.NUMANode)
	}
	if want := []int{1, -1, -1}; !reflect.DeepEqual(got, want) {
		t.Errorf("NUMA nodes = %v, want %v", got, want)
	}
}

func TestLostGPU(t *testing.T) {
	m := nvmltest.NewDGXA100().WithMIG(3, "3g.20gb", "3g.20gb")
	np := startNode(t, m, map[string]string{OptionHealthChecks: "false"})
	before := discover(t, np)
	m.SetLost(3, true)
	after := discover(t, np)
	if len(after.Devices) != len(before.Devices) {
		t.Fatalf("%d devices after the GPU was lost, want %d", len(after.Devices), len(before.Devices))
	}
	for i, d := range after.Devices {
		lost := d.ID == "gpu3" || d.Parent == "gpu3"
		if lost != (d.Health == types.Unhealthy) {
			t.Errorf("%s health = %s after gpu3 was lost", d.ID, d.Health)
		}
		b := before.Devices[i]
		b.Health = d.Health
		if b != d {
			t.Errorf("%s changed beyond its health:\n%+v\n%+v", d.ID, before.Devices[i], d)
		}
	}
	m.SetLost(3, false)
	for _, d := range discover(t, np).Devices {
		if d.Health != types.Healthy {
			t.Errorf("%s is %s once the GPU answers again", d.ID, d.Health)
		}
	}
}

func TestLostAtStartIsLeftOut(t *testing.T) {
	m := nvmltest.NewDGXA100()
	m.SetLost(5, true)
	inv := discover(t, startNode(t, m, nil))
	if len(inv.Devices) != 7 {
		t.Fatalf("%d devices, want 7", len(inv.Devices))
	}
	if _, ok := inv.DeviceByID("gpu5"); ok {
		t.Error("a GPU lost before it was ever seen is advertised")
	}
}

func TestDiscoverErrors(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(m *nvmltest.Machine)
		want    string
	}{
		{
			name: "count",
			breakIt: func(m *nvmltest.Machine) {
				m.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			want: "discover: count GPUs: ERROR_UNKNOWN",
		},
		{
			name: "memory",
			breakIt: func(m *nvmltest.Machine) {
				m.GPUs[4].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NO_PERMISSION }
			},
			want: "discover: GPU 4: get memory: ERROR_NO_PERMISSION",
		},
		{
			name: "bus id",
			breakIt: func(m *nvmltest.Machine) {
				m.GPUs[2].GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.SUCCESS }
			},
			want: `discover: GPU 2: malformed PCI bus ID ""`,
		},
		{
			name: "nvlink",
			breakIt: func(m *nvmltest.Machine) {
				m.GPUs[0].GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			want: "discover links: GPU 0: get state of NVLink 0: ERROR_UNKNOWN",
		},
		{
			name: "topology",
			breakIt: func(m *nvmltest.Machine) {
				m.GPUs[0].GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			want: "discover links: GPUs 0 and 1: get PCIe common ancestor: ERROR_UNKNOWN",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := nvmltest.NewDGXA100().WithoutNVLink()
			if tt.name == "nvlink" {
				m = nvmltest.NewDGXA100()
			}
			tt.breakIt(m)
			_, ctx := ktesting.NewTestContext(t)
			_, err := testModule(t, m).NodePlugin(ctx, types.PluginConfig{})
			if err == nil || !strings.Contains(err.Error(), tt.want) || errors.Is(err, types.ErrNoDevices) {
				t.Errorf("NodePlugin() error = %v\nwant it to contain %q, not to say there are no devices", err, tt.want)
			}
			if calls := len(m.ShutdownCalls()); calls != 1 {
				t.Errorf("NVML shut down %d times after the failed start, want 1", calls)
			}
		})
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:07:00.0": "0000:07:00.0",
		"00000000:BD:00.0": "0000:bd:00.0",
		"0001:3b:1f.7":     "0001:3b:1f.7",
		"0:7:0.0":          "0000:07:00.0",
	} {
		if got, err := normalizeBusID(in); err != nil || got != want {
			t.Errorf("normalizeBusID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "07:00.0", "0000:07:00", "0000:07:20.0", "0000:100:00.0", "0000:07:00.8", "x:07:00.0", "000000000:07:00.0", "0000:+7:00.0"} {
		if got, err := normalizeBusID(in); err == nil {
			t.Errorf("normalizeBusID(%q) = %q, want an error", in, got)
		}
	}
}

func FuzzNormalizeBusID(f *testing.F) {
	for _, s := range []string{"00000000:07:00.0", "0001:3b:1f.7", "0:0:0.0", "::.", "ffff:ff:1f.7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := normalizeBusID(s)
		if err != nil {
			return
		}
		again, err := normalizeBusID(got)
		if err != nil || again != got || len(got) != len("0000:00:00.0") {
			t.Fatalf("normalizeBusID(%q) = %q, which normalises to %q, %v", s, got, again, err)
		}
	})
}
