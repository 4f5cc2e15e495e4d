package claims

import (
	"context"
	"errors"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

func compiler(t *testing.T, slices ...*resourceapi.ResourceSlice) *Compiler {
	t.Helper()
	return &Compiler{Classes: testClasses(), CEL: cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}),
		Devices: func() ([]*resourceapi.ResourceSlice, error) { return slices, nil }}
}

func TestCompile(t *testing.T) {
	inv, slice := dgx1(t, "n1")
	c := compiler(t, slice)
	ctx := context.Background()

	// Whole GPUs by count; a slice by capacity.
	sl := whole("slice", 1)
	sl.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		dra.CapacityMemory: resource.MustParse("1500Mi"), dra.CapacityCores: resource.MustParse("25")}}
	got, err := c.Compile(ctx, []PodClaim{{Name: "gpu", Claim: claim("c", whole("gpus", 4), sl)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "claim/gpu/gpus" || got[0].Count != 4 || got[0].Shared() ||
		got[1].MemoryMiB != 1500 || got[1].ComputePercent != 25 {
		t.Fatalf("Compile = %+v", got)
	}

	// A capacity the request does not name counts as DRA counts it: no
	// memory, all of the cores.
	mem, cores := whole("mem", 1), whole("cores", 1)
	mem.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse("2Gi")}}
	cores.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{dra.CapacityCores: resource.MustParse("30")}}
	got, err = c.Compile(ctx, []PodClaim{{Name: "gpu", Claim: claim("c", mem, cores)}})
	if err != nil || len(got) != 2 || got[0].MemoryMiB != 2048 || got[0].ComputePercent != 100 || got[1].MemoryMiB != 0 || got[1].ComputePercent != 30 {
		t.Fatalf("Compile with one capacity each = %+v, %v; want 2048 MiB with 100%% cores, and 30%% cores without memory", got, err)
	}

	// A selector: the UUIDs of the devices that pass it.
	r := whole("one", 1)
	r.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf("device.attributes[%q].index >= 6", dra.DriverName)}}}
	got, err = c.Compile(ctx, []PodClaim{{Name: "gpu", Claim: claim("c", r)}})
	if err != nil || len(got) != 1 || len(got[0].Selector.IncludeUUIDs) != 2 {
		t.Fatalf("Compile with a selector = %+v, %v; want GPUs 6 and 7", got, err)
	}
	for _, u := range got[0].Selector.IncludeUUIDs {
		if u != inv.Devices[6].UUID && u != inv.Devices[7].UUID {
			t.Errorf("UUID %s passes index >= 6", u)
		}
	}
	// None passes: the pod waits (devices may come).
	r.Exactly.Selectors[0].CEL.Expression = fmt.Sprintf("device.attributes[%q].index >= 60", dra.DriverName)
	if _, err := c.Compile(ctx, []PodClaim{{Name: "gpu", Claim: claim("c", r)}}); !errors.Is(err, ErrWaiting) {
		t.Errorf("no device passes: %v, want ErrWaiting", err)
	}

	// What kubegpu does not place, or that is out of range: refused.
	many := claim("many")
	for i := range MaxRequests + 1 {
		many.Spec.Devices.Requests = append(many.Spec.Devices.Requests, whole(fmt.Sprint("r", i), 1))
	}
	all := whole("all", 0)
	all.Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	cores = whole("cores", 1)
	cores.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{dra.CapacityCores: resource.MustParse("150")}}
	other := whole("other", 1)
	other.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"bandwidth": resource.MustParse("1")}}
	alt := resourceapi.DeviceRequest{Name: "alt", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "a", DeviceClassName: dra.ClassName}}}
	for name, cl := range map[string]*resourceapi.ResourceClaim{
		"too many requests": many, "allocationMode All": claim("c", all), "150 cores": claim("c", cores),
		"unknown capacity": claim("c", other), "firstAvailable": claim("c", alt),
	} {
		if _, err := c.Compile(ctx, []PodClaim{{Name: "gpu", Claim: cl}}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// TestCompileSliceOnWholeGPUs: DRA takes a partition whole, so a claim's
// slice may go only on whole GPUs; memory 0 is none, as by default.
func TestCompileSliceOnWholeGPUs(t *testing.T) {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	slice := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: dra.DriverName, Devices: []resourceapi.Device{
		{Name: "gpu0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{dra.AttributeUUID: str("GPU-A")}},
		{Name: "gpu1-mig0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{dra.AttributeUUID: str("MIG-B"), dra.AttributeParent: str("gpu1")}},
	}}}
	c := compiler(t, slice)
	r := whole("slice", 1)
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse("0")}}
	got, err := c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", r)}})
	if err != nil || len(got) != 1 || got[0].MemoryMiB != 0 || got[0].ComputePercent != 100 || fmt.Sprint(got[0].Selector.IncludeUUIDs) != "[GPU-A]" {
		t.Fatalf("Compile = %+v, %v; want 100%% cores without memory, on GPU-A only", got, err)
	}
	// Memory beyond any GPU's: refused, not overflowed.
	r.Exactly.Capacity.Requests[dra.CapacityMemory] = resource.MustParse("8Ei")
	if _, err := c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", r)}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("memory 8Ei: %v, want ErrInvalid", err)
	}
	// Whole devices: partitions too (the engine gives out a partition whole).
	if got, err := c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", whole("one", 1))}}); err != nil || len(got[0].Selector.IncludeUUIDs) != 0 {
		t.Fatalf("Compile of a whole device = %+v, %v; want no selector", got, err)
	}
}
