package nvidia

import (
	"context"
	"errors"
	"slices"
	"testing"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmltest"
	"github.com/kubegpu/kubegpu/types"
)

// TestEnginePicksNVLinkQuads runs the allocation engine on what the node
// side discovers on a DGX-1: 4-GPU pods get the all-NVLink quads.
func TestEnginePicksNVLinkQuads(t *testing.T) {
	inv := discover(t, startNode(t, nvmltest.NewDGX1(), nil))
	sp, err := NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := devicescheduler.New(devicescheduler.Config{Plugins: []types.SchedulerPlugin{sp}})
	if err != nil {
		t.Fatal(err)
	}
	n, err := e.NewNode("dgx1", inv, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	quads := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	var got [][]int
	for _, pod := range []string{"a", "b"} {
		r, err := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "c", Count: 4}}}, devicescheduler.Host{})
		if err != nil {
			t.Fatal(err)
		}
		var p devicescheduler.Placement
		if err := e.Evaluate(n, r, &p); err != nil {
			t.Fatalf("Evaluate(%s) error = %v", pod, err)
		}
		if err := n.Assume(pod, p.Allocation(), r.Host); err != nil {
			t.Fatal(err)
		}
		d := p.Devices(0, nil)
		slices.Sort(d)
		if !slices.ContainsFunc(quads, func(q []int) bool { return slices.Equal(q, d) }) {
			t.Fatalf("pod %s got GPUs %v, want an all-NVLink quad", pod, d)
		}
		got = append(got, d)
	}
	if slices.Equal(got[0], got[1]) {
		t.Errorf("both pods got %v", got[0])
	}
}

// TestEngineMIG checks that the engine gives out MIG devices, never their
// GPU, and that Admit keeps shared slices off them.
func TestEngineMIG(t *testing.T) {
	m := nvmltest.NewDGXA100().WithMIG(0, "3g.20gb", "3g.20gb")
	inv := discover(t, startNode(t, m, nil))
	// Only GPU 0 and its MIG devices are free.
	var taken []types.DeviceShare
	for _, d := range inv.Devices {
		if d.Parent == "" && d.ID != "gpu0" {
			taken = append(taken, types.DeviceShare{ID: d.ID, UUID: d.UUID, Exclusive: true, MemoryMiB: d.MemoryMiB, ComputePercent: 100})
		}
	}
	sp, err := NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := devicescheduler.New(devicescheduler.Config{Plugins: []types.SchedulerPlugin{sp}})
	if err != nil {
		t.Fatal(err)
	}
	n, err := e.NewNode("a100", inv, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Assume("others", types.PodAllocation{Node: "a100", Containers: []types.ContainerAllocation{{Name: "c", Devices: taken}}}, devicescheduler.Host{}); err != nil {
		t.Fatal(err)
	}
	r, err := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "c", Count: 1}}}, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	var p devicescheduler.Placement
	if err := e.Evaluate(n, r, &p); err != nil {
		t.Fatalf("Evaluate() error = %v", err)
	}
	alloc := p.Allocation()
	if got := alloc.Containers[0].Devices[0].ID; got != "gpu0-mig0" && got != "gpu0-mig1" {
		t.Errorf("a 1-GPU pod got %s, want a MIG device of gpu0", got)
	}
	mig, _ := inv.DeviceByID("gpu0-mig1")
	if err := sp.Admit(mig, types.ContainerRequest{Name: "c", Count: 1, MemoryMiB: 1024}); !errors.Is(err, ErrMIGShared) {
		t.Errorf("Admit(MIG device, shared slice) = %v, want ErrMIGShared", err)
	}
}
