package devicescheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// otherVendor rates the links of a second vendor's devices in tests.
type otherVendor struct{}

func (otherVendor) Vendor() string                                   { return "amd.com" }
func (otherVendor) LinkWeight(l types.Link) int                      { return 1 }
func (otherVendor) Admit(types.Device, types.ContainerRequest) error { return nil }

// TestDeviceResources: a request asked with one device resource gets only
// devices served as it, on a node with two vendors' GPUs, and a node
// without any says so; a clone keeps what serves what.
func TestDeviceResources(t *testing.T) {
	sp, err := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Plugins: []types.SchedulerPlugin{sp, otherVendor{}}})
	if err != nil {
		t.Fatal(err)
	}
	dev := func(i int, vendor, resource string) types.Device {
		return types.Device{ID: fmt.Sprintf("gpu%d", i), Index: i, UUID: fmt.Sprintf("GPU-%d", i), Vendor: vendor, Resource: resource,
			Model: vendor, MemoryMiB: 16384, Health: types.Healthy, NUMANode: -1}
	}
	mixed, err := e.NewNode("mixed", types.Inventory{Devices: []types.Device{
		dev(0, simgpu.Vendor, ""), dev(1, "amd.com", types.ResourceAMDGPU), dev(2, simgpu.Vendor, types.ResourceNVIDIAGPU), dev(3, "amd.com", types.ResourceAMDGPU),
	}}, Host{})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(resource string, count int) *Request {
		c := whole(count)
		c.Selector.Resource = resource
		return request(t, e, c)
	}
	for _, tc := range []struct {
		resource string
		want     []int
	}{{types.ResourceAMDGPU, []int{1, 3}}, {types.ResourceNVIDIAGPU, []int{0, 2}}} {
		var p Placement
		if err := e.Evaluate(mixed, ask(tc.resource, 2), &p); err != nil {
			t.Fatalf("2 of %s: %v", tc.resource, err)
		}
		got := p.Devices(0, nil)
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("2 of %s got devices %v, want %v", tc.resource, got, tc.want)
		}
		if err := e.Evaluate(mixed, ask(tc.resource, 3), &p); err == nil {
			t.Errorf("3 of %s fit on a node with 2", tc.resource)
		}
		if err := e.Evaluate(mixed.Clone(), ask(tc.resource, 3), &p); err == nil {
			t.Errorf("3 of %s fit on a clone of a node with 2", tc.resource)
		}
	}
	nvidiaOnly := simNode(t, e, "dgx1")
	var p Placement
	err = e.Evaluate(nvidiaOnly, ask(types.ResourceAMDGPU, 1), &p)
	var nf *NotFitError
	if !errors.As(err, &nf) || nf.Reason != ReasonResource || !strings.Contains(err.Error(), "its GPUs: nvidia.com/gpu") {
		t.Errorf("amd.com/gpu on an NVIDIA node: %v, want reason %q naming the node's resources", err, ReasonResource)
	}
}

// TestNodeCloneKeepsEnforcement: a clone (preemption's view, a node with
// its nominated pods) keeps which devices enforce slices, so that a slice
// under enforcement Required fits there as on the node.
func TestNodeCloneKeepsEnforcement(t *testing.T) {
	e := newEngine(t, PolicyKubegpu)
	topo, err := simgpu.Preset("t4x4")
	if err != nil {
		t.Fatal(err)
	}
	inv := simgpu.Inventory(topo, "n")
	for i := range inv.Devices {
		inv.Devices[i].SliceEnforcer = "mps"
	}
	n, err := e.NewNode("n", inv, Host{})
	if err != nil {
		t.Fatal(err)
	}
	r := request(t, e, slice(30, 1024))
	if err := r.SetEnforcement(types.EnforcementRequired); err != nil {
		t.Fatal(err)
	}
	var p Placement
	if err := e.Evaluate(n.Clone(), r, &p); err != nil {
		t.Errorf("an enforced slice on a clone of a node whose GPUs enforce slices: %v", err)
	}
}
