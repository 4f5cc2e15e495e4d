package simgpu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

func nodePlugin(t *testing.T, opts map[string]string) types.NodePlugin {
	t.Helper()
	np, err := NewModule().NodePlugin(context.Background(), types.PluginConfig{NodeName: "node-a", Options: opts})
	if err != nil {
		t.Fatalf("NodePlugin(%v) error = %v", opts, err)
	}
	return np
}

func discover(t *testing.T, np types.NodePlugin) types.Inventory {
	t.Helper()
	inv, err := np.Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover() error = %v", err)
	}
	if err := inv.Validate(); err != nil {
		t.Fatalf("Discover() returned an invalid inventory: %v", err)
	}
	return inv
}

func TestPresetsAreValid(t *testing.T) {
	for _, name := range Presets() {
		t.Run(name, func(t *testing.T) {
			inv := discover(t, nodePlugin(t, map[string]string{OptionPreset: name}))
			n := len(inv.Devices)
			if want := n * (n - 1) / 2; len(inv.Links) != want {
				t.Errorf("%d links, want one per pair (%d)", len(inv.Links), want)
			}
		})
	}
}

// linkTable renders the link matrix as nvidia-smi topo -m does.
func linkTable(inv types.Inventory) []string {
	var rows []string
	for _, cells := range inv.LinkLabels() {
		rows = append(rows, strings.Join(cells, " "))
	}
	return rows
}

func TestDGX1Topology(t *testing.T) {
	inv := discover(t, nodePlugin(t, map[string]string{OptionPreset: "dgx1"}))
	// The DGX-1 V100 hybrid cube-mesh, as nvidia-smi topo -m prints it.
	want := []string{
		"X NV1 NV1 NV2 NV2 SYS SYS SYS",
		"NV1 X NV2 NV1 SYS NV2 SYS SYS",
		"NV1 NV2 X NV2 SYS SYS NV1 SYS",
		"NV2 NV1 NV2 X SYS SYS SYS NV1",
		"NV2 SYS SYS SYS X NV1 NV1 NV2",
		"SYS NV2 SYS SYS NV1 X NV2 NV1",
		"SYS SYS NV1 SYS NV1 NV2 X NV2",
		"SYS SYS SYS NV1 NV2 NV1 NV2 X",
	}
	if got := linkTable(inv); !reflect.DeepEqual(got, want) {
		t.Errorf("DGX-1 links =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	d := inv.Devices[5]
	if d.ID != "gpu5" || d.Index != 5 || d.Model != "Tesla V100-SXM2-16GB" || d.MemoryMiB != 16160 || d.NUMANode != 1 || d.Vendor != Vendor {
		t.Errorf("gpu5 = %+v", d)
	}
}

func TestPCIeAndNVSwitchTopologies(t *testing.T) {
	t4 := discover(t, nodePlugin(t, map[string]string{OptionPreset: "t4x4"}))
	wantT4 := []string{
		"X PIX SYS SYS",
		"PIX X SYS SYS",
		"SYS SYS X PIX",
		"SYS SYS PIX X",
	}
	if got := linkTable(t4); !reflect.DeepEqual(got, wantT4) {
		t.Errorf("t4x4 links =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantT4, "\n"))
	}
	one := discover(t, nodePlugin(t, map[string]string{OptionPreset: "v100m16", OptionGPUs: "4"}))
	wantOne := []string{ // one socket per pair of GPUs... 2 NUMA nodes over 4 GPUs
		"X PIX SYS SYS",
		"PIX X SYS SYS",
		"SYS SYS X PIX",
		"SYS SYS PIX X",
	}
	if got := linkTable(one); !reflect.DeepEqual(got, wantOne) {
		t.Errorf("v100m16 x4 links =\n%s", strings.Join(got, "\n"))
	}
	h100 := discover(t, nodePlugin(t, map[string]string{OptionPreset: "dgx-h100"}))
	for _, l := range h100.Links {
		if l.Kind != types.LinkNVSwitch {
			t.Fatalf("dgx-h100 link %+v, want NVSwitch everywhere", l)
		}
	}
}

func TestHostBridgeLinks(t *testing.T) {
	topo := Topology{Model: "Tesla T4", GPUs: 4, MemoryMiB: 15360, NUMANodes: 1}
	got := linkTable(Inventory(topo, "n"))
	if got[0] != "X PHB PHB PHB" {
		t.Errorf("single socket, no shared switch: row 0 = %q, want X PHB PHB PHB", got[0])
	}
}

func TestUUIDs(t *testing.T) {
	a := discover(t, nodePlugin(t, map[string]string{OptionPreset: "dgx1"}))
	a2 := discover(t, nodePlugin(t, map[string]string{OptionPreset: "dgx1"}))
	b, err := NewModule().NodePlugin(context.Background(), types.PluginConfig{NodeName: "node-b", Options: map[string]string{OptionPreset: "dgx1"}})
	if err != nil {
		t.Fatal(err)
	}
	bInv := discover(t, b)
	if !reflect.DeepEqual(a, a2) {
		t.Error("the same node discovers different inventories")
	}
	if a.Devices[0].UUID == bInv.Devices[0].UUID {
		t.Error("two nodes share a GPU UUID")
	}
	if u := a.Devices[0].UUID; !strings.HasPrefix(u, "GPU-") || len(u) != 40 {
		t.Errorf("UUID %q is not in NVIDIA's format", u)
	}
}

func TestHealth(t *testing.T) {
	healthFile := filepath.Join(t.TempDir(), "unhealthy")
	np := nodePlugin(t, map[string]string{OptionPreset: "t4x4", OptionUnhealthy: "1", OptionHealthFile: healthFile})
	sick := func() []int {
		var out []int
		for _, d := range discover(t, np).Devices {
			if d.Health == types.Unhealthy {
				out = append(out, d.Index)
			}
		}
		return out
	}
	if got := sick(); !reflect.DeepEqual(got, []int{1}) {
		t.Errorf("unhealthy = %v, want [1]", got)
	}
	if err := os.WriteFile(healthFile, []byte("3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := sick(); !reflect.DeepEqual(got, []int{1, 3}) {
		t.Errorf("unhealthy after health file = %v, want [1 3]", got)
	}
	if err := os.WriteFile(healthFile, []byte("9"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := np.Discover(context.Background()); err == nil || !strings.Contains(err.Error(), `want GPU indexes 0..3, got "9"`) {
		t.Errorf("Discover() with a bad health file: error = %v", err)
	}
}

func TestContainerEdits(t *testing.T) {
	inv := Inventory(presets["t4x4"], "node-a")
	u0, u2 := inv.Devices[0].UUID, inv.Devices[2].UUID
	tests := []struct {
		name    string
		opts    map[string]string
		alloc   types.ContainerAllocation
		want    types.ContainerEdits
		wantErr string
	}{
		{
			name: "no devices hides all",
			want: types.ContainerEdits{Env: []types.EnvVar{{Name: EnvVisibleDevices, Value: "void"}}},
		},
		{
			name: "whole gpus",
			alloc: types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{
				{ID: "gpu2", UUID: u2, Exclusive: true, MemoryMiB: 15360, ComputePercent: 100},
				{ID: "gpu0", UUID: u0, Exclusive: true, MemoryMiB: 15360, ComputePercent: 100},
			}},
			want: types.ContainerEdits{Env: []types.EnvVar{
				{Name: EnvVisibleDevices, Value: u2 + "," + u0},
				{Name: EnvDevices, Value: "gpu2,gpu0"},
			}},
		},
		{
			name:  "shared slice",
			alloc: types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{{ID: "gpu0", UUID: u0, MemoryMiB: 4096, ComputePercent: 30}}},
			want: types.ContainerEdits{Env: []types.EnvVar{
				{Name: EnvVisibleDevices, Value: u0},
				{Name: EnvDevices, Value: "gpu0"},
				{Name: EnvMemoryMiB, Value: "4096"},
				{Name: EnvCores, Value: "30"},
			}},
		},
		{
			name:  "cdi",
			opts:  map[string]string{OptionEdits: "cdi"},
			alloc: types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{{ID: "gpu0", UUID: u0, Exclusive: true, MemoryMiB: 15360, ComputePercent: 100}}},
			want: types.ContainerEdits{
				CDIDevices: []string{"kubegpu.io/simgpu=gpu0"},
				Env:        []types.EnvVar{{Name: EnvVisibleDevices, Value: "void"}, {Name: EnvDevices, Value: "gpu0"}},
			},
		},
		{
			name:    "device of another node",
			alloc:   types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{{ID: "gpu0", UUID: "GPU-elsewhere"}}},
			wantErr: `container "c": device gpu0 (GPU-elsewhere) is not on this node`,
		},
		{
			name:    "unknown device",
			alloc:   types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{{ID: "gpu7", UUID: u0}}},
			wantErr: "device gpu7",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := map[string]string{OptionPreset: "t4x4"}
			for k, v := range tt.opts {
				opts[k] = v
			}
			got, err := nodePlugin(t, opts).ContainerEdits(context.Background(), tt.alloc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ContainerEdits() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ContainerEdits() error = %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ContainerEdits() =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestNodePluginOptionErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "topo.yaml")
	if err := os.WriteFile(file, []byte("model: T4\ngpus: 2\nmemoryMiB: 100\nnvlink: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		node string
		opts map[string]string
		want string
	}{
		{"nothing", "n", nil, "set simgpu.preset=NAME (one of a10, dgx-a100, dgx-h100, dgx1, g2, g3, p100, t4, t4x4, v100m16, v100m32) or simgpu.topology=FILE"},
		{"both", "n", map[string]string{OptionPreset: "dgx1", OptionTopology: "x"}, "not both"},
		{"unknown preset", "n", map[string]string{OptionPreset: "dgx2"}, `unknown preset "dgx2"`},
		{"unknown option", "n", map[string]string{"prest": "dgx1"}, "unknown option simgpu.prest (known: preset, topology, gpus, unhealthy, health-file, edits, enforcer-root)"},
		{"bad gpus", "n", map[string]string{OptionPreset: "dgx1", OptionGPUs: "0"}, `gpus must be 1..64, got "0"`},
		{"bad unhealthy", "n", map[string]string{OptionPreset: "dgx1", OptionUnhealthy: "8"}, `unhealthy: want GPU indexes 0..7, got "8"`},
		{"bad edits", "n", map[string]string{OptionPreset: "dgx1", OptionEdits: "magic"}, "edits must be env or cdi"},
		{"no node name", "", map[string]string{OptionPreset: "dgx1"}, "node name is needed"},
		{"missing file", "n", map[string]string{OptionTopology: "/does/not/exist"}, "read topology: open /does/not/exist"},
		{"typo in file", "n", map[string]string{OptionTopology: file}, `topology ` + file + `: invalid simulated GPU topology: error unmarshaling JSON: while decoding JSON: json: unknown field "nvlink"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewModule().NodePlugin(context.Background(), types.PluginConfig{NodeName: tt.node, Options: tt.opts})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NodePlugin() error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
	if _, err := NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{Options: map[string]string{"preset": "x"}}); err == nil {
		t.Error("SchedulerPlugin() accepted an option")
	}
}

func TestParseTopology(t *testing.T) {
	good := `
name: box
model: Tesla T4
gpus: 3
memoryMiB: 15360
nvlinks:
  - {a: 0, b: 2, count: 4}
`
	topo, err := ParseTopology([]byte(good))
	if err != nil {
		t.Fatalf("ParseTopology() error = %v", err)
	}
	if got := linkTable(Inventory(topo, "n"))[0]; got != "X PHB NV4" {
		t.Errorf("row 0 = %q, want X PHB NV4", got)
	}
	for _, tt := range []struct{ in, want string }{
		{"gpus: 2\nmemoryMiB: 1", "model must be set"},
		{"model: x\ngpus: 65\nmemoryMiB: 1", "gpus must be 1..64, got 65"},
		{"model: x\ngpus: 2\nmemoryMiB: 0", "memoryMiB must be positive"},
		{"model: x\ngpus: 2\nmemoryMiB: 1\nnvlinks: [{a: 0, b: 2, count: 1}]", "nvlink 0-2 must join two different GPUs 0..1"},
		{"model: x\ngpus: 2\nmemoryMiB: 1\nnvlinks: [{a: 0, b: 1, count: 0}]", "count must be 1..18"},
		{"model: x\ngpus: 2\nmemoryMiB: 1\nnvlinks: [{a: 0, b: 1, count: 1}, {a: 1, b: 0, count: 2}]", "nvlink 0-1 appears twice"},
		{"model: x\ngpus: 2\nmemoryMiB: 1\nnvswitch: true\nnvlinks: [{a: 0, b: 1, count: 1}]", "exclude each other"},
		{"model: x\ngpus: 2\nmemoryMiB: 1\nnumaNodes: 3", "numaNodes must be 0..gpus (2), got 3"},
		{"model: [", "invalid simulated GPU topology"},
	} {
		if _, err := ParseTopology([]byte(tt.in)); !errors.Is(err, ErrInvalidTopology) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseTopology(%q) error = %v, want %q", tt.in, err, tt.want)
		}
	}
}

func TestSchedulerPlugin(t *testing.T) {
	sp, err := NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if sp.Vendor() != Vendor {
		t.Errorf("Vendor() = %q", sp.Vendor())
	}
	if sp.LinkWeight(types.Link{Kind: types.LinkNVLink, Count: 2}) <= sp.LinkWeight(types.Link{Kind: types.LinkNVSwitch}) {
		t.Error("NVLink x2 does not outrank NVSwitch")
	}
}

func FuzzParseTopology(f *testing.F) {
	f.Add([]byte("model: T4\ngpus: 4\nmemoryMiB: 15360\nnumaNodes: 2\ngpusPerPCIeSwitch: 2\nnvlinks: [{a: 0, b: 1, count: 2}]"))
	f.Add([]byte(`{"model":"x","gpus":64,"memoryMiB":1,"nvswitch":true}`))
	f.Add([]byte("gpus: -1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		topo, err := ParseTopology(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidTopology) {
				t.Fatalf("ParseTopology() error %v does not wrap ErrInvalidTopology", err)
			}
			return
		}
		if err := Inventory(topo, "n").Validate(); err != nil {
			t.Fatalf("a valid topology gave an invalid inventory: %v", err)
		}
	})
}
