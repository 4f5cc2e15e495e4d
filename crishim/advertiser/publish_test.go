package advertiser

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// TestCapacity: a node of two GPUs, one of them in MIG mode with three
// slices, publishes 2 physical GPUs; the schedulable devices (the whole
// GPU and the slices) count in nvidia.com/gpu, gpu-cores and gpu-share.
func TestCapacity(t *testing.T) {
	inv := types.Inventory{Devices: []types.Device{
		{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 40960},
		{ID: "gpu1", UUID: "GPU-1", MemoryMiB: 40960},
	}}
	for i := range 3 {
		inv.Devices = append(inv.Devices, types.Device{ID: fmt.Sprint("gpu1-mig", i), UUID: fmt.Sprint("MIG-", i), MemoryMiB: 9856, Parent: "gpu1"})
	}
	got := Capacity(inv, 100)
	want := map[string]int64{
		kubeinterface.ResourceGPU:       4 * 100,
		kubeinterface.ResourceGPUCores:  4 * 100,
		kubeinterface.ResourceGPUMemory: 40960 + 3*9856,
		kubeinterface.ResourceGPUShare:  4 * 100 * 100,
		kubeinterface.ResourceGPUs:      2,
	}
	for name, w := range want {
		q, ok := got[name]
		if !ok || q.Value() != w {
			t.Errorf("%s = %v, want %d", name, q.String(), w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("capacity %v, want only %v", got, want)
	}
}

// TestCapacityPerDeviceResource: each device counts under the resource it
// is served as; nvidia.com/gpu is published even at 0, another device
// resource only with devices, and a patch removes one the node lost.
func TestCapacityPerDeviceResource(t *testing.T) {
	inv := types.Inventory{Devices: []types.Device{
		{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 1024, Resource: types.ResourceAMDGPU, Health: types.Healthy},
		{ID: "gpu1", UUID: "GPU-1", MemoryMiB: 1024, Resource: types.ResourceAMDGPU, Health: types.Healthy},
	}}
	got := Capacity(inv, 10)
	for name, w := range map[string]int64{types.ResourceAMDGPU: 20, types.ResourceNVIDIAGPU: 0, kubeinterface.ResourceGPUs: 2} {
		if q, ok := got[name]; !ok || q.Value() != w {
			t.Errorf("%s = %v (published %v), want %d", name, q.String(), ok, w)
		}
	}
	f := &fakeNode{node: &Node{}}
	if err := patchCapacity(context.Background(), f, "n", got, Owned(got, "")); err != nil {
		t.Fatal(err)
	}
	published, err := kubeinterface.EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	none := Capacity(types.Inventory{}, 10)
	if err := patchCapacity(context.Background(), f, "n", none, Owned(none, published)); err != nil {
		t.Fatal(err)
	}
	if q, ok := f.node.Capacity[types.ResourceAMDGPU]; ok {
		t.Errorf("amd.com/gpu = %v after the node's AMD GPUs went, want removed", q.String())
	}
}

// TestCapacityLeavesForeignResources: amd.com/gpu that AMD's device
// plugin publishes on a node whose shim serves no AMD GPU is left as it
// is, by a sync and by Withdraw; what the shim published is withdrawn.
func TestCapacityLeavesForeignResources(t *testing.T) {
	ctx := context.Background()
	foreign := *resource.NewQuantity(4, resource.DecimalSI)
	f := &fakeNode{node: &Node{Capacity: ResourceList{types.ResourceAMDGPU: foreign}, Allocatable: ResourceList{types.ResourceAMDGPU: foreign}}}
	inv := types.Inventory{Devices: []types.Device{{ID: "gpu0", UUID: "GPU-0", MemoryMiB: 1024, Health: types.Healthy}}}
	a, err := New(Options{Node: "n", Client: f, Discover: func(context.Context) (types.Inventory, error) { return inv, nil }, SlicesPerDevice: 10})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.Once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if q := f.node.Capacity[types.ResourceAMDGPU]; q.Cmp(foreign) != 0 {
		t.Errorf("amd.com/gpu = %v after syncs, want AMD's device plugin's 4", q.String())
	}
	if q := f.node.Capacity[types.ResourceNVIDIAGPU]; q.Value() != 10 {
		t.Errorf("nvidia.com/gpu = %v, want 10", q.String())
	}
	if err := Withdraw(ctx, f, "n"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.node.Capacity[types.ResourceNVIDIAGPU]; ok {
		t.Error("nvidia.com/gpu left after Withdraw")
	}
	if q := f.node.Capacity[types.ResourceAMDGPU]; q.Cmp(foreign) != 0 {
		t.Errorf("amd.com/gpu = %v after Withdraw, want AMD's device plugin's 4", q.String())
	}
}

// TestCapacityGAS: a node with Intel GPUs publishes GPU Aware
// Scheduling's millicores (1000 a GPU) and memory.max (their memory in
// bytes), so that kubelet admits pods that ask for them.
func TestCapacityGAS(t *testing.T) {
	inv := types.Inventory{Devices: []types.Device{
		{ID: "intel0", UUID: "GPU-intel-0", MemoryMiB: 16384, Resource: types.ResourceIntelI915, Health: types.Healthy},
		{ID: "intel1", UUID: "GPU-intel-1", MemoryMiB: 16384, Resource: types.ResourceIntelI915, Health: types.Healthy},
	}}
	got := Capacity(inv, 100)
	for name, w := range map[string]int64{types.ResourceIntelI915: 200, kubeinterface.ResourceIntelMillicores: 2000, kubeinterface.ResourceIntelMemoryMax: 32 << 30} {
		if q, ok := got[name]; !ok || q.Value() != w {
			t.Errorf("%s = %v, want %d", name, q.String(), w)
		}
	}
	if _, ok := Capacity(types.Inventory{}, 100)[kubeinterface.ResourceIntelMillicores]; ok {
		t.Error("millicores published on a node without Intel GPUs")
	}
	published, err := kubeinterface.EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	if owned := Owned(nil, published); !slices.Contains(owned, kubeinterface.ResourceIntelMillicores) {
		t.Errorf("owned %v after Intel GPUs were published, want millicores among them", owned)
	}
}

// TestPublishInventoryWritesItsCapacity: PublishInventory writes every
// resource of the capacity it is given, also one the advertiser does not
// know (a test harness's stock resource beside kubegpu's).
func TestPublishInventoryWritesItsCapacity(t *testing.T) {
	f := &fakeNode{node: &Node{}}
	capacity := Capacity(types.Inventory{}, 10)
	capacity["example.com/gpu-milli"] = *resource.NewQuantity(8000, resource.DecimalSI)
	if err := PublishInventory(context.Background(), f, "n", types.Inventory{}, capacity); err != nil {
		t.Fatal(err)
	}
	if q := f.node.Capacity["example.com/gpu-milli"]; q.Value() != 8000 {
		t.Errorf("example.com/gpu-milli = %v, want 8000", q.String())
	}
}
