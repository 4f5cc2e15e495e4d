package nvidia

import (
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmltest"
	"github.com/kubegpu/kubegpu/types"
)

// unhealthyIDs returns the IDs of the unhealthy devices.
func unhealthyIDs(t *testing.T, np types.NodePlugin) []string {
	t.Helper()
	var ids []string
	for _, d := range discover(t, np).Devices {
		if d.Health == types.Unhealthy {
			ids = append(ids, d.ID)
		}
	}
	return ids
}

// waitUnhealthy waits until exactly the devices want are unhealthy.
func waitUnhealthy(t *testing.T, np types.NodePlugin, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := unhealthyIDs(t, np)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("unhealthy devices = %v, want %v", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func inject(t *testing.T, delivered bool) {
	t.Helper()
	if !delivered {
		t.Fatal("the GPU is not registered for XID events")
	}
}

func TestXIDMakesGPUUnhealthy(t *testing.T) {
	m := nvmltest.NewDGXA100()
	np := startNode(t, m, nil)
	for i := range m.GPUs {
		if got := m.Registered(i); got != nvml.EventTypeXidCriticalError {
			t.Errorf("GPU %d registered for events %#x, want XID errors", i, got)
		}
	}
	waitUnhealthy(t, np)
	// Application errors leave the GPU healthy; events are handled in
	// order, so once GPU 5's XID 79 is seen, GPU 2's XID 13 was ignored.
	inject(t, m.InjectXID(2, 13))
	inject(t, m.InjectEvent(2, nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 31,
		GpuInstanceId: AllInstances, ComputeInstanceId: AllInstances}))
	inject(t, m.InjectXID(5, 79))
	waitUnhealthy(t, np, "gpu5")
	// It stays unhealthy.
	inject(t, m.InjectXID(4, 48))
	waitUnhealthy(t, np, "gpu4", "gpu5")
}

func TestIgnoreXIDsOption(t *testing.T) {
	m := nvmltest.NewDGXA100()
	np := startNode(t, m, map[string]string{OptionIgnoreXIDs: "default,79"})
	inject(t, m.InjectXID(1, 79))
	inject(t, m.InjectXID(3, 13))
	inject(t, m.InjectXID(0, 94))
	waitUnhealthy(t, np, "gpu0")

	m = nvmltest.NewDGXA100()
	np = startNode(t, m, map[string]string{OptionIgnoreXIDs: "none"})
	inject(t, m.InjectXID(3, 13))
	waitUnhealthy(t, np, "gpu3")
}

func TestMIGXID(t *testing.T) {
	m := nvmltest.NewDGXA100().WithMIG(2, "3g.20gb", "2g.10gb", "1g.5gb").WithMIG(6, "3g.20gb", "3g.20gb")
	np := startNode(t, m, nil)
	// An XID of one MIG device: only that device.
	inject(t, m.InjectMIGXID(2, 1, 94))
	waitUnhealthy(t, np, "gpu2-mig1")
	// An XID of the whole GPU: the GPU and all its MIG devices.
	inject(t, m.InjectXID(6, 79))
	waitUnhealthy(t, np, "gpu2-mig1", "gpu6", "gpu6-mig0", "gpu6-mig1")
}

func TestGPUsThatCannotBeWatchedAreUnhealthy(t *testing.T) {
	m := nvmltest.NewDGXA100().WithEventTypes(3, nvml.EventTypeSingleBitEccError).WithEventTypes(6, 0)
	m.GPUs[7].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	np := startNode(t, m, nil)
	waitUnhealthy(t, np, "gpu3", "gpu6", "gpu7")

	// Without health checks nothing is watched, and nothing is unhealthy.
	m = nvmltest.NewDGXA100().WithEventTypes(3, 0)
	np = startNode(t, m, map[string]string{OptionHealthChecks: "false"})
	waitUnhealthy(t, np)
	if m.Registered(0) != 0 || len(m.EventSetCreateCalls()) != 0 {
		t.Error("health checks are off but events were registered")
	}
}

func TestEventWaitFailureMakesAllUnhealthy(t *testing.T) {
	m := nvmltest.NewDGXA100()
	np := startNode(t, m, nil)
	m.FailWait(nvml.ERROR_UNKNOWN)
	waitUnhealthy(t, np, "gpu0", "gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6", "gpu7")
}

func TestCloseStopsWatcher(t *testing.T) {
	m := nvmltest.NewDGXA100()
	mod := testModule(t, m)
	np, err := mod.NodePlugin(t.Context(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := np.Close(); err != nil {
		t.Fatalf("Close() error = %v", err)
	}
	if !m.EventSetFreed() {
		t.Error("Close() did not free the event set")
	}
	if got := len(m.ShutdownCalls()); got != 1 {
		t.Errorf("NVML shut down %d times, want 1", got)
	}
	if err := np.Close(); err != nil || len(m.ShutdownCalls()) != 1 {
		t.Errorf("second Close() = %v, shutdowns %d", err, len(m.ShutdownCalls()))
	}
}

func TestEventSetCreateFailure(t *testing.T) {
	m := nvmltest.NewDGXA100()
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	_, err := testModule(t, m).NodePlugin(t.Context(), types.PluginConfig{})
	want := "nvidia: start XID health checks (set nvidia.health-checks=false to run without them): create NVML event set: ERROR_NOT_SUPPORTED"
	if err == nil || err.Error() != want {
		t.Errorf("NodePlugin() error = %v\nwant %s", err, want)
	}
}
