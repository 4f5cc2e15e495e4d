package claims

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
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
	got, err := only(c.Compile(ctx, []PodClaim{{Name: "gpu", Claim: claim("c", whole("gpus", 4), sl)}}))
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
	got, err = only(c.Compile(ctx, []PodClaim{{Name: "gpu", Claim: claim("c", mem, cores)}}))
	if err != nil || len(got) != 2 || got[0].MemoryMiB != 2048 || got[0].ComputePercent != 100 || got[1].MemoryMiB != 0 || got[1].ComputePercent != 30 {
		t.Fatalf("Compile with one capacity each = %+v, %v; want 2048 MiB with 100%% cores, and 30%% cores without memory", got, err)
	}

	// A selector: the UUIDs of the devices that pass it.
	r := whole("one", 1)
	r.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf("device.attributes[%q].index >= 6", dra.DriverName)}}}
	got, err = only(c.Compile(ctx, []PodClaim{{Name: "gpu", Claim: claim("c", r)}}))
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
	altAll := resourceapi.DeviceRequest{Name: "alt", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "a", DeviceClassName: dra.ClassName, Count: 2}, {Name: "b", DeviceClassName: dra.ClassName, AllocationMode: resourceapi.DeviceAllocationModeAll}}}
	manyAlts := claim("c")
	for i := range 6 { // 2^6 = 64 combinations
		manyAlts.Spec.Devices.Requests = append(manyAlts.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: fmt.Sprint("r", i),
			FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "a", DeviceClassName: dra.ClassName}, {Name: "b", DeviceClassName: dra.ClassName}}})
	}
	for name, cl := range map[string]*resourceapi.ResourceClaim{
		"too many requests": many, "allocationMode All": claim("c", all), "150 cores": claim("c", cores),
		"unknown capacity": claim("c", other), "an alternative with allocationMode All": claim("c", altAll),
		"64 combinations of alternatives": manyAlts,
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
	got, err := only(c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", r)}}))
	if err != nil || len(got) != 1 || got[0].MemoryMiB != 0 || got[0].ComputePercent != 100 || fmt.Sprint(got[0].Selector.IncludeUUIDs) != "[GPU-A]" {
		t.Fatalf("Compile = %+v, %v; want 100%% cores without memory, on GPU-A only", got, err)
	}
	// Memory beyond any GPU's: refused, not overflowed.
	r.Exactly.Capacity.Requests[dra.CapacityMemory] = resource.MustParse("8Ei")
	if _, err := c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", r)}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("memory 8Ei: %v, want ErrInvalid", err)
	}
	// Whole devices: partitions too (the engine gives out a partition whole).
	if got, err := only(c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", whole("one", 1))}})); err != nil || len(got[0].Selector.IncludeUUIDs) != 0 {
		t.Fatalf("Compile of a whole device = %+v, %v; want no selector", got, err)
	}
}

// only is the one variant of a claim without alternatives.
func only(variants [][]types.ContainerRequest, err error) ([]types.ContainerRequest, error) {
	if err != nil {
		return nil, err
	}
	if len(variants) != 1 {
		return nil, fmt.Errorf("%d variants, want 1", len(variants))
	}
	return variants[0], nil
}

// TestCompileAlternatives: a firstAvailable request gives one variant per
// alternative, in order, earlier requests' alternatives changing last; an
// alternative no device passes is left out, and the request waits only
// when none is left.
func TestCompileAlternatives(t *testing.T) {
	_, slice := dgx1(t, "n1")
	c := compiler(t, slice)
	sub := func(name string, count int64, sel string) resourceapi.DeviceSubRequest {
		s := resourceapi.DeviceSubRequest{Name: name, DeviceClassName: dra.ClassName, Count: count}
		if sel != "" {
			s.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel}}}
		}
		return s
	}
	none := fmt.Sprintf("device.attributes[%q].index >= 60", dra.DriverName)
	first := resourceapi.DeviceRequest{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{sub("eight", 8, ""), sub("never", 1, none), sub("four", 4, "")}}
	second := resourceapi.DeviceRequest{Name: "aux", FirstAvailable: []resourceapi.DeviceSubRequest{sub("two", 2, ""), sub("one", 1, "")}}
	got, err := c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", first, whole("exact", 1), second)}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range got {
		var parts []string
		for _, cr := range v {
			parts = append(parts, fmt.Sprintf("%s:%d", cr.Name, cr.Count))
		}
		names = append(names, strings.Join(parts, " "))
	}
	want := []string{
		"claim/gpu/gpus/eight:8 claim/gpu/exact:1 claim/gpu/aux/two:2",
		"claim/gpu/gpus/eight:8 claim/gpu/exact:1 claim/gpu/aux/one:1",
		"claim/gpu/gpus/four:4 claim/gpu/exact:1 claim/gpu/aux/two:2",
		"claim/gpu/gpus/four:4 claim/gpu/exact:1 claim/gpu/aux/one:1",
	}
	if !slices.Equal(names, want) {
		t.Errorf("variants:\n  %s\nwant\n  %s", strings.Join(names, "\n  "), strings.Join(want, "\n  "))
	}
	// No alternative any device passes: the pod waits, told of each.
	never := resourceapi.DeviceRequest{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{sub("a", 1, none), sub("b", 1, none)}}
	_, err = c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", never)}})
	if !errors.Is(err, ErrWaiting) || !strings.Contains(err.Error(), "gpus/a") || !strings.Contains(err.Error(), "gpus/b") {
		t.Errorf("no alternative passes: %v, want ErrWaiting naming both", err)
	}
	// More devices than an allocation holds: left out as DRA leaves it;
	// an exact request of as many is refused.
	huge := resourceapi.DeviceRequest{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{sub("huge", 33, ""), sub("one", 1, "")}}
	if got, err := c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", huge)}}); err != nil || len(got) != 1 || got[0][0].Name != "claim/gpu/gpus/one" {
		t.Errorf("an alternative of 33 devices: %+v, %v; want it left out", got, err)
	}
	if _, err := c.Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", whole("gpus", 33))}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("an exact request of 33 devices: %v, want ErrInvalid", err)
	}

	// A node whose shim predates alternatives (its devices do not say
	// they are prepared): no alternative goes there.
	old := slice.DeepCopy()
	for i := range old.Spec.Devices {
		delete(old.Spec.Devices[i].Attributes, dra.AttributePreparesAlternatives)
	}
	_, err = compiler(t, old).Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", first)}})
	if !errors.Is(err, ErrWaiting) || !strings.Contains(err.Error(), "prepares alternatives") {
		t.Errorf("alternatives on an old node: %v, want ErrWaiting saying why", err)
	}
	if _, err := only(compiler(t, old).Compile(context.Background(), []PodClaim{{Name: "gpu", Claim: claim("c", whole("gpus", 4))}})); err != nil {
		t.Errorf("an exact request on an old node: %v", err)
	}
}

func TestRankScore(t *testing.T) {
	// The engine's extremes: its policy scores' bounds, shifted over the
	// 24-bit tie-break.
	const lowest, highest = -devicescheduler.MaxPolicyScore << 24, devicescheduler.MaxPolicyScore<<24 | (1<<24 - 1)
	if RankScore(-5, 0, 1) != -5 {
		t.Error("one variant: the engine's score, unchanged")
	}
	// Any node of an earlier variant ranks above any of a later one.
	for v := range MaxVariants {
		if worst, best := RankScore(lowest, v, MaxVariants), RankScore(highest, v+1, MaxVariants); worst <= best {
			t.Errorf("variant %d's worst %d does not rank above variant %d's best %d", v, worst, v+1, best)
		}
	}
	if RankScore(1000, 1, 2) <= RankScore(-1000, 1, 2) {
		t.Error("within a variant, by score")
	}
}
