package sotest

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/plugins/nvidia"
	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmltest"
	"github.com/kubegpu/kubegpu/types"
	"github.com/kubegpu/kubegpu/utils/pluginload"
	"github.com/kubegpu/kubegpu/utils/plugintest"
)

func buildFakeNVML(t *testing.T) string {
	t.Helper()
	return plugintest.BuildCLibrary(t, nvmltest.FakeLibrary, "libnvidia-ml.so.1")
}

// TestPlugin builds nvidia.so as make plugins does and loads it into this
// binary: it loads without the NVIDIA driver, its scheduler side works,
// its node side says NVML is missing, and with a (fake) libnvidia-ml it
// discovers through go-nvml's real cgo code.
func TestPlugin(t *testing.T) {
	so := plugintest.Build(t, plugintest.ModuleRoot(t), "./plugins/nvidia/plugin", plugintest.HostFlags(t), t.TempDir(), "nvidia.so")
	mod, err := pluginload.Open(so)
	if err != nil {
		t.Fatalf("Open(nvidia.so) error = %v", err)
	}
	if mod.Name() != nvidia.Name {
		t.Errorf("Name() = %q", mod.Name())
	}

	sp, err := mod.SchedulerPlugin(t.Context(), types.PluginConfig{})
	if err != nil {
		t.Fatalf("SchedulerPlugin() error = %v", err)
	}
	if sp.Vendor() != types.VendorNVIDIA || sp.LinkWeight(types.Link{Kind: types.LinkNVLink, Count: 4}) <= sp.LinkWeight(types.Link{Kind: types.LinkNVSwitch}) {
		t.Errorf("scheduler side: vendor %q, weights wrong", sp.Vendor())
	}

	missing := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	_, err = mod.NodePlugin(t.Context(), types.PluginConfig{NodeName: "n", Options: map[string]string{nvidia.OptionNVMLLibrary: missing}})
	if !errors.Is(err, nvidia.ErrNoNVML) || !errors.Is(err, types.ErrNoDevices) || !strings.Contains(err.Error(), "cannot open shared object file") {
		t.Fatalf("NodePlugin() without NVML: error = %v, want ErrNoNVML and types.ErrNoDevices, saying the library is missing", err)
	}

	fake := buildFakeNVML(t)
	// The fake has no event API: health checks must be off.
	_, err = mod.NodePlugin(t.Context(), types.PluginConfig{NodeName: "n", Options: map[string]string{nvidia.OptionNVMLLibrary: fake}})
	if err == nil || !strings.Contains(err.Error(), "create NVML event set: Function Not Found") {
		t.Fatalf("NodePlugin() on a driver without events: error = %v", err)
	}
	np, err := mod.NodePlugin(t.Context(), types.PluginConfig{NodeName: "n",
		Options: map[string]string{nvidia.OptionNVMLLibrary: fake, nvidia.OptionHealthChecks: "false"}})
	if err != nil {
		t.Fatalf("NodePlugin() on the fake NVML: error = %v", err)
	}
	defer func() {
		if err := np.Close(); err != nil {
			t.Errorf("Close() error = %v", err)
		}
	}()
	inv, err := np.Discover(t.Context())
	if err != nil {
		t.Fatalf("Discover() error = %v", err)
	}
	want := types.Device{
		ID: "gpu0", Index: 0, UUID: "GPU-fa4e0000-0000-4000-8000-000000000000", Vendor: types.VendorNVIDIA,
		Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, ComputeUnits: 132, ComputeCapability: "9.0",
		NUMANode: -1, PCIBusID: "0000:1b:00.0", Health: types.Healthy,
	}
	if len(inv.Devices) != 1 || inv.Devices[0] != want {
		t.Errorf("Discover() = %+v\nwant one device %+v", inv.Devices, want)
	}
	edits, err := np.ContainerEdits(t.Context(), types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{{ID: "gpu0", UUID: want.UUID, Exclusive: true}}})
	// CDI, the default: the device by its UUID, and no GPU from env.
	if err != nil || len(edits.CDIDevices) != 1 || edits.CDIDevices[0] != "nvidia.com/gpu="+want.UUID || len(edits.Env) != 1 || edits.Env[0].Value != "void" {
		t.Errorf("ContainerEdits() = %+v, %v", edits, err)
	}
}
