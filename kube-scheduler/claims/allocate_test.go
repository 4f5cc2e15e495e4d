package claims

import (
	"context"
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// classes is a DeviceClass lister over a map.
type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, v := range c {
		out = append(out, v)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if v, ok := c[name]; ok {
		return v, nil
	}
	return nil, errors.New("no class " + name)
}

func testClasses() classes {
	return classes{dra.ClassName: {ObjectMeta: metav1.ObjectMeta{Name: dra.ClassName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: dra.ClassSelector}}}}}}
}

var features = structured.Features{ConsumableCapacity: true, DeviceTaints: true, PartitionableDevices: true, PrioritizedList: true}

// dgx1 is a DGX-1's inventory and its published slice.
func dgx1(t *testing.T, node string) (types.Inventory, *resourceapi.ResourceSlice) {
	t.Helper()
	topo, err := simgpu.Preset("dgx1")
	if err != nil {
		t.Fatal(err)
	}
	inv := simgpu.Inventory(topo, node)
	devs, err := dra.Devices(inv, dra.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return inv, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: dra.DriverName, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}, Devices: devs}}
}

func claim(name string, requests ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: ktypes.UID("uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}}}
}

func whole(name string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassName,
		AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
}

// chose is an allocation giving container the inventory's devices at idx.
func chose(inv types.Inventory, container string, share types.DeviceShare, idx ...int) types.PodAllocation {
	c := types.ContainerAllocation{Name: container}
	for _, i := range idx {
		d := inv.Devices[i]
		s := share
		s.ID, s.UUID = d.ID, d.UUID
		if s.Exclusive {
			s.MemoryMiB, s.ComputePercent = d.MemoryMiB, types.MaxComputePercent
		}
		c.Devices = append(c.Devices, s)
	}
	return types.PodAllocation{Node: "n1", Containers: []types.ContainerAllocation{c}}
}

func newAllocator() *Allocator {
	return &Allocator{Features: features, Classes: testClasses(), CEL: cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})}
}

func emptyState() *structured.AllocatedState {
	return &structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity: structured.NewConsumedCapacityCollection()}
}

func TestAllocateWholeGPUs(t *testing.T) {
	inv, slice := dgx1(t, "n1")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	pcs := []PodClaim{{Name: "gpu", Claim: claim("c", whole("gpus", 4))}}
	res, err := newAllocator().Allocate(context.Background(), node, pcs, chose(inv, dra.ClaimEntry("gpu", "gpus"), types.DeviceShare{Exclusive: true}, 4, 5, 6, 7),
		[]*resourceapi.ResourceSlice{slice}, emptyState())
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || len(res[0].Devices.Results) != 4 {
		t.Fatalf("results %+v, want one with 4 devices", res)
	}
	got := sets.New[string]()
	for _, r := range res[0].Devices.Results {
		got.Insert(r.Device)
		if len(r.Tolerations) != 0 {
			t.Errorf("device %s carries tolerations %v the claim did not ask for", r.Device, r.Tolerations)
		}
		if r.Request != "gpus" || r.Pool != "n1" || r.Driver != dra.DriverName {
			t.Errorf("result %+v", r)
		}
	}
	want := sets.New[string]()
	for _, i := range []int{4, 5, 6, 7} {
		want.Insert(dra.DeviceName(inv.Devices[i].ID))
	}
	if !got.Equal(want) {
		t.Errorf("devices %v, want the chosen %v", sets.List(got), sets.List(want))
	}
	pcs[0].Claim.Status.Allocation = &res[0]
	if n, err := NodeOf(pcs[0].Claim); err != nil || n != "n1" {
		t.Errorf("NodeOf = %q, %v; want n1", n, err)
	}
}

// TestAllocateRejectsConstraint: devices across the DGX-1's two NVLink
// quads fail a matchAttribute on the link group, which the engine does not
// weigh.
func TestAllocateRejectsConstraint(t *testing.T) {
	inv, slice := dgx1(t, "n1")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	c := claim("c", whole("gpus", 4))
	c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(dra.DriverName + "/" + string(dra.AttributeLinkGroup)))}}
	pcs := []PodClaim{{Name: "gpu", Claim: c}}
	a := newAllocator()
	if _, err := a.Allocate(context.Background(), node, pcs, chose(inv, dra.ClaimEntry("gpu", "gpus"), types.DeviceShare{Exclusive: true}, 0, 1, 2, 4),
		[]*resourceapi.ResourceSlice{slice}, emptyState()); !errors.Is(err, ErrRejected) {
		t.Errorf("across quads: err %v, want ErrRejected", err)
	}
	if _, err := a.Allocate(context.Background(), node, pcs, chose(inv, dra.ClaimEntry("gpu", "gpus"), types.DeviceShare{Exclusive: true}, 0, 1, 2, 3),
		[]*resourceapi.ResourceSlice{slice}, emptyState()); err != nil {
		t.Errorf("one quad: %v", err)
	}
}

// TestAllocateSlice: a capacity request takes part of a GPU, and the
// result says how much.
func TestAllocateSlice(t *testing.T) {
	inv, slice := dgx1(t, "n1")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	r := whole("slice", 1)
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		dra.CapacityMemory: resource.MustParse("4Gi"), dra.CapacityCores: resource.MustParse("30")}}
	pcs := []PodClaim{{Name: "s", Claim: claim("c", r)}}
	res, err := newAllocator().Allocate(context.Background(), node, pcs, chose(inv, dra.ClaimEntry("s", "slice"), types.DeviceShare{MemoryMiB: 4096, ComputePercent: 30}, 2),
		[]*resourceapi.ResourceSlice{slice}, emptyState())
	if err != nil {
		t.Fatal(err)
	}
	got := res[0].Devices.Results[0]
	if got.Device != dra.DeviceName(inv.Devices[2].ID) || got.ShareID == nil {
		t.Errorf("result %+v, want a share of device 2", got)
	}
	if m := got.ConsumedCapacity[dra.CapacityMemory]; m.Cmp(resource.MustParse("4Gi")) != 0 {
		t.Errorf("consumed memory %s, want 4Gi", m.String())
	}
}

// TestAllocateSlicesShareGPU: two claims asking only cores share a GPU,
// as two annotation slices asking only cores do: a request that names no
// memory takes none.
func TestAllocateSlicesShareGPU(t *testing.T) {
	inv, slice := dgx1(t, "n1")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	state := emptyState()
	for i := range 3 {
		r := whole("slice", 1)
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{dra.CapacityCores: resource.MustParse("30")}}
		pcs := []PodClaim{{Name: "s", Claim: claim(fmt.Sprint("c", i), r)}}
		res, err := newAllocator().Allocate(context.Background(), node, pcs, chose(inv, dra.ClaimEntry("s", "slice"), types.DeviceShare{ComputePercent: 30}, 2),
			[]*resourceapi.ResourceSlice{slice}, state)
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		got := res[0].Devices.Results[0]
		if m, ok := got.ConsumedCapacity[dra.CapacityMemory]; ok && !m.IsZero() {
			t.Errorf("claim %d consumed memory %s, want none", i, m.String())
		}
		state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(structured.MakeDeviceID(got.Driver, got.Pool, got.Device), got.ConsumedCapacity))
		state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(structured.MakeDeviceID(got.Driver, got.Pool, got.Device), got.ShareID))
	}
}

// TestCheckPerRequest: a result that gives a request a device chosen for
// another request of the pod is refused.
func TestCheckPerRequest(t *testing.T) {
	chosen := map[string][]types.DeviceShare{dra.ClaimEntry("g", "a"): {{ID: "gpu2"}}, dra.ClaimEntry("g", "b"): {{ID: "gpu5"}}}
	res := func(a, b string) *resourceapi.AllocationResult {
		return &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "a", Driver: dra.DriverName, Pool: "n1", Device: a}, {Request: "b", Driver: dra.DriverName, Pool: "n1", Device: b}}}}
	}
	if err := check(res("gpu2", "gpu5"), "n1", "g", chosen); err != nil {
		t.Errorf("as chosen: %v", err)
	}
	if err := check(res("gpu5", "gpu2"), "n1", "g", chosen); !errors.Is(err, ErrRejected) {
		t.Errorf("swapped: %v, want ErrRejected", err)
	}
	if err := check(res("gpu2", "gpu5"), "n2", "g", chosen); !errors.Is(err, ErrRejected) {
		t.Errorf("another node's pool: %v, want ErrRejected", err)
	}
}

// TestAllocateAlternative: the allocation of a firstAvailable request names
// the alternative the engine placed, as DRA names it, with its devices.
func TestAllocateAlternative(t *testing.T) {
	inv, slice := dgx1(t, "n1")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	r := resourceapi.DeviceRequest{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "eight", DeviceClassName: dra.ClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 8},
		{Name: "four", DeviceClassName: dra.ClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 4}}}
	pcs := []PodClaim{{Name: "gpu", Claim: claim("c", r)}}
	res, err := newAllocator().Allocate(context.Background(), node, pcs, chose(inv, dra.ClaimEntry("gpu", "gpus/four"), types.DeviceShare{Exclusive: true}, 0, 1, 2, 3),
		[]*resourceapi.ResourceSlice{slice}, emptyState())
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || len(res[0].Devices.Results) != 4 {
		t.Fatalf("results %+v, want one with 4 devices", res)
	}
	for _, d := range res[0].Devices.Results {
		if d.Request != "gpus/four" {
			t.Errorf("result %+v, want request gpus/four", d)
		}
	}
	if len(pcs[0].Claim.Spec.Devices.Requests[0].FirstAvailable) != 2 {
		t.Error("Allocate changed the claim it was given")
	}
	// No alternative chosen: refused, not allocated by the allocator's
	// own choice.
	if _, err := newAllocator().Allocate(context.Background(), node, pcs, chose(inv, dra.ClaimEntry("gpu", "gpus/two"), types.DeviceShare{Exclusive: true}, 0, 1),
		[]*resourceapi.ResourceSlice{slice}, emptyState()); err == nil {
		t.Error("an alternative the claim does not have was allocated")
	}
}
