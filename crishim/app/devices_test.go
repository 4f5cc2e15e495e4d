package app

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
	"github.com/kubegpu/kubegpu/utils/plugintest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var (
	simOnce sync.Once
	simDir  string
)

// simgpuDir returns a directory holding a freshly built simgpu.so. It lives
// for the whole test binary: Go never unloads a plugin.
func simgpuDir(t *testing.T) string {
	t.Helper()
	simOnce.Do(func() {
		dir, err := os.MkdirTemp("", "crishim-app-test-")
		if err != nil {
			t.Fatal(err)
		}
		plugintest.Build(t, plugintest.ModuleRoot(t), "./plugins/simgpu/plugin", plugintest.HostFlags(t), dir, "simgpu.so")
		simDir = dir
	})
	if simDir == "" {
		t.Fatal("building simgpu.so failed earlier")
	}
	return simDir
}

var (
	bothOnce sync.Once
	bothDir  string
)

// simgpuAndNvidiaDir returns simgpuDir with a freshly built nvidia.so in it
// for the test, as on a node that installs every module. (Plugin files are
// not linked: the loader refuses symbolic links, and the runtime loads a
// plugin once, by path, so simgpu.so must stay where it was first loaded.)
func simgpuAndNvidiaDir(t *testing.T) string {
	t.Helper()
	dir := simgpuDir(t)
	bothOnce.Do(func() {
		built, err := os.MkdirTemp("", "crishim-app-test-")
		if err != nil {
			t.Fatal(err)
		}
		plugintest.Build(t, plugintest.ModuleRoot(t), "./plugins/nvidia/plugin", plugintest.HostFlags(t), built, "nvidia.so")
		bothDir = built
	})
	if bothDir == "" {
		t.Fatal("building nvidia.so failed earlier")
	}
	b, err := os.ReadFile(filepath.Join(bothDir, "nvidia.so"))
	if err != nil {
		t.Fatal(err)
	}
	nv := filepath.Join(dir, "nvidia.so")
	if err := os.WriteFile(nv, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(nv) })
	return dir
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	for _, dir := range []string{simDir, bothDir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand(context.Background())
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestDevicesDGX1Golden(t *testing.T) {
	got, err := run(t, "devices", "--plugin-dir", simgpuDir(t), "--node-name", "node-a", "--plugin-option", "simgpu.preset=dgx1")
	if err != nil {
		t.Fatalf("devices: %v\n%s", err, got)
	}
	golden := filepath.Join("testdata", "devices-dgx1.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("devices output differs from %s (go test -update rewrites it):\n%s", golden, got)
	}
}

func TestDevicesJSON(t *testing.T) {
	got, err := run(t, "devices", "-o", "json", "--plugin-dir", simgpuDir(t), "--node-name", "node-a",
		"--plugin-option", "simgpu.preset=t4x4", "--plugin-option", "simgpu.unhealthy=3")
	if err != nil {
		t.Fatalf("devices: %v\n%s", err, got)
	}
	var results []struct {
		Module    string          `json:"module"`
		Inventory types.Inventory `json:"inventory"`
	}
	if err := json.Unmarshal([]byte(got), &results); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, got)
	}
	if len(results) != 1 || results[0].Module != "simgpu" || len(results[0].Inventory.Devices) != 4 {
		t.Fatalf("results = %+v", results)
	}
	if h := results[0].Inventory.Devices[3].Health; h != types.Unhealthy {
		t.Errorf("gpu3 health = %s, want Unhealthy", h)
	}
}

func TestDevicesErrors(t *testing.T) {
	dir := simgpuDir(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"module options missing", []string{"--plugin-dir", dir}, "device module simgpu (" + filepath.Join(dir, "simgpu.so") + "): simgpu: set simgpu.preset=NAME"},
		{"unknown module", []string{"--plugin-dir", dir, "--plugin-option", "nvidai.mode=cdi"}, `plugin options name module "nvidai", which is not loaded (loaded: simgpu)`},
		{"bad option syntax", []string{"--plugin-dir", dir, "--plugin-option", "preset=dgx1"}, "want MODULE.KEY=VALUE"},
		{"missing dir", []string{"--plugin-dir", filepath.Join(dir, "nope")}, "open plugin directory"},
		{"bad output", []string{"--plugin-dir", dir, "-o", "yaml"}, "--output must be table, json or resourceslice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := run(t, append([]string{"devices", "--node-name", "n"}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("devices error = %v\nwant it to contain %q\noutput:\n%s", err, tt.want, out)
			}
		})
	}
}

func TestDevicesEmptyDir(t *testing.T) {
	out, err := run(t, "devices", "--plugin-dir", t.TempDir())
	if err != nil || !strings.Contains(out, "No device modules in") {
		t.Errorf("devices on an empty dir = %q, %v", out, err)
	}
}

// TestDevicesWithoutNVML runs the command on a node with both modules
// installed and no NVIDIA driver: it shows the simulated GPUs and succeeds.
func TestDevicesWithoutNVML(t *testing.T) {
	dir := simgpuAndNvidiaDir(t)
	// An explicit library path keeps the test the same on machines with a driver.
	noNVML := "nvidia.nvml-library=" + filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	got, err := run(t, "devices", "--plugin-dir", dir, "--node-name", "node-a", "--plugin-option", "simgpu.preset=t4x4", "--plugin-option", noNVML)
	if err != nil {
		t.Fatalf("devices: %v\n%s", err, got)
	}
	if !strings.Contains(got, "Module simgpu: 4 devices") || strings.Contains(got, "Module nvidia") {
		t.Errorf("devices output:\n%s", got)
	}
	// A misconfigured module is still an error, after the others are shown.
	got, err = run(t, "devices", "--plugin-dir", dir, "--node-name", "node-a", "--plugin-option", "simgpu.preset=t4x4",
		"--plugin-option", noNVML, "--plugin-option", "nvidia.edits=magic")
	if err == nil || !strings.Contains(err.Error(), "option nvidia.edits must be env or cdi") || !strings.Contains(got, "Module simgpu: 4 devices") {
		t.Errorf("devices with a bad nvidia option: error = %v\n%s", err, got)
	}
}

// TestDevicesResourceSlice: -o resourceslice prints the devices as the
// node's ResourceSlices publish them: tainted for kubegpu, unhealthy GPUs
// tainted as such. simgpu's PCI bus IDs are not this machine's, so their
// PCIe roots cannot be read: said, and the devices printed all the same.
func TestDevicesResourceSlice(t *testing.T) {
	got, err := run(t, "devices", "-o", "resourceslice", "--plugin-dir", simgpuDir(t), "--node-name", "node-a",
		"--plugin-option", "simgpu.preset=t4x4", "--plugin-option", "simgpu.unhealthy=3")
	if err != nil && !strings.Contains(err.Error(), "PCIe root") {
		t.Fatalf("devices: %v\n%s", err, got)
	}
	var devices []resourceapi.Device
	if err := json.Unmarshal([]byte(got[:strings.LastIndex(got, "]")+1]), &devices); err != nil {
		t.Fatalf("output is not a JSON list of devices: %v\n%s", err, got)
	}
	if len(devices) != 4 || len(devices[0].Taints) != 1 || len(devices[3].Taints) != 2 || devices[3].Taints[1].Key != dra.TaintUnhealthy {
		t.Errorf("devices = %+v", devices)
	}
}
