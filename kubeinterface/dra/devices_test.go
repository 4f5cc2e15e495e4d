package dra

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kubegpu/kubegpu/types"
)

// dgx1 is a DGX-1's GPUs and NVLinks (hybrid cube mesh: two quads, all
// pairs within a quad linked, and each GPU to its twin in the other quad).
func dgx1() types.Inventory {
	var inv types.Inventory
	for i := 0; i < 8; i++ {
		inv.Devices = append(inv.Devices, types.Device{ID: fmt.Sprintf("gpu%d", i), Index: i, UUID: fmt.Sprintf("GPU-%d", i),
			Vendor: types.VendorNVIDIA, Model: "Tesla V100-SXM2-16GB", MemoryMiB: 16384, ComputeUnits: 80, ComputeCapability: "7.0",
			NUMANode: i / 4, PCIBusID: fmt.Sprintf("0000:%02x:00.0", 6+i), Health: types.Healthy})
	}
	link := func(a, b int) {
		inv.Links = append(inv.Links, types.Link{A: fmt.Sprintf("gpu%d", a), B: fmt.Sprintf("gpu%d", b), Kind: types.LinkNVLink, Count: 1})
	}
	for q := 0; q < 8; q += 4 {
		for a := q; a < q+4; a++ {
			for b := a + 1; b < q+4; b++ {
				link(a, b)
			}
		}
	}
	for a := 0; a < 4; a++ {
		link(a, a+4)
	}
	return inv
}

func attr(t *testing.T, d resourceapi.Device, name resourceapi.QualifiedName) resourceapi.DeviceAttribute {
	t.Helper()
	a, ok := d.Attributes[name]
	if !ok {
		t.Fatalf("device %s has no attribute %s: %v", d.Name, name, d.Attributes)
	}
	return a
}

func TestDevicesOfDGX1(t *testing.T) {
	inv := dgx1()
	inv.Devices[5].Health = types.Unhealthy
	roots := func(bus string) (string, error) {
		if bus == "0000:07:00.0" {
			return "", errors.New("no such device")
		}
		return "pci0000:" + bus[5:7], nil
	}
	devs, err := Devices(inv, Options{PCIeRoot: roots})
	if err == nil || !strings.Contains(err.Error(), `device "gpu1": PCIe root of 0000:07:00.0: no such device`) {
		t.Errorf("error %v, want gpu1's PCIe root named", err)
	}
	if len(devs) != 8 {
		t.Fatalf("%d devices, want 8", len(devs))
	}
	for i, d := range devs {
		if want := fmt.Sprintf("gpu%d", i); d.Name != want || *attr(t, d, AttributeID).StringValue != want {
			t.Errorf("device %d: name %q, id %v, want %q", i, d.Name, d.Attributes[AttributeID], want)
		}
		if g, want := *attr(t, d, AttributeLinkGroup).StringValue, fmt.Sprintf("nvlink-%d", i/4); g != want {
			t.Errorf("%s: link group %q, want %q (its quad)", d.Name, g, want)
		}
		if n := *attr(t, d, AttributeNUMANode).IntValue; n != int64(i/4) {
			t.Errorf("%s: NUMA node %d, want %d", d.Name, n, i/4)
		}
		if v := *attr(t, d, AttributeComputeCapability).VersionValue; v != "7.0.0" {
			t.Errorf("%s: compute capability %q, want 7.0.0", d.Name, v)
		}
		if _, ok := d.Attributes[AttributePCIeRoot]; ok == (i == 1) {
			t.Errorf("%s: pcieRoot %v", d.Name, d.Attributes[AttributePCIeRoot])
		}
		if m := d.Capacity[CapacityMemory].Value; m.String() != "16Gi" {
			t.Errorf("%s: memory %s, want 16Gi", d.Name, m.String())
		}
		if c := d.Capacity[CapacityCores].Value; c.Value() != 100 {
			t.Errorf("%s: cores %s, want 100", d.Name, c.String())
		}
		if len(d.Taints) == 0 || d.Taints[0].Key != TaintManaged || d.Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Errorf("%s: taints %v, want %s first", d.Name, d.Taints, TaintManaged)
		}
		if unhealthy := len(d.Taints) == 2 && d.Taints[1].Key == TaintUnhealthy; unhealthy != (i == 5) {
			t.Errorf("%s: taints %v", d.Name, d.Taints)
		}
		if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
			t.Errorf("%s: %d attributes and capacities, the API takes %d", d.Name, n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
		}
	}
}

func TestLinkGroups(t *testing.T) {
	mig := dgx1()
	mig.Devices = append(mig.Devices, types.Device{ID: "gpu0-mig1", UUID: "MIG-1", Parent: "gpu0", Health: types.Healthy, NUMANode: -1})
	pcie := dgx1()
	pcie.Links = nil
	xgmi := dgx1()
	for i := range xgmi.Links {
		xgmi.Links[i] = types.Link{A: xgmi.Links[i].A, B: xgmi.Links[i].B, Kind: types.LinkXGMI, Hops: 1}
	}
	full := dgx1()
	full.Links = nil
	for a := 0; a < 8; a++ {
		for b := a + 1; b < 8; b++ {
			full.Links = append(full.Links, types.Link{A: fmt.Sprintf("gpu%d", a), B: fmt.Sprintf("gpu%d", b), Kind: types.LinkNVSwitch})
		}
	}
	for _, tc := range []struct {
		name string
		inv  types.Inventory
		want string
	}{
		{"DGX-1 with a MIG partition", mig, "nvlink-0 nvlink-0 nvlink-0 nvlink-0 nvlink-1 nvlink-1 nvlink-1 nvlink-1 -"},
		{"PCIe only", pcie, "- - - - - - - -"},
		{"XGMI", xgmi, "xgmi-0 xgmi-0 xgmi-0 xgmi-0 xgmi-1 xgmi-1 xgmi-1 xgmi-1"},
		{"NVSwitch", full, "nvlink-0 nvlink-0 nvlink-0 nvlink-0 nvlink-0 nvlink-0 nvlink-0 nvlink-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.inv.Validate(); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, g := range linkGroups(tc.inv) {
				if g == "" {
					g = "-"
				}
				got = append(got, g)
			}
			if s := strings.Join(got, " "); s != tc.want {
				t.Errorf("groups %s, want %s", s, tc.want)
			}
		})
	}
}

func TestDevicesAdaptWhatTheAPICannotHold(t *testing.T) {
	long := strings.Repeat("x", 63) + "é" + "tail" // the cut falls inside é
	inv := types.Inventory{Devices: []types.Device{
		{ID: "GPU_0", UUID: "u0", Model: long, ComputeCapability: "8.x", NUMANode: -1, Health: types.Healthy},
		{ID: "dev-1", UUID: "u1", ComputeCapability: "9", NUMANode: -1, Health: types.Healthy},
	}}
	if err := inv.Validate(); err != nil {
		t.Fatal(err)
	}
	devs, err := Devices(inv, Options{})
	if err == nil || !strings.Contains(err.Error(), `compute capability "8.x" is no version`) {
		t.Errorf("error %v, want the compute capability named", err)
	}
	if len(devs) != 2 {
		t.Fatalf("%d devices, want both", len(devs))
	}
	for i, d := range devs {
		if !strings.HasPrefix(d.Name, "dev-") || len(d.Name) != 20 {
			t.Errorf("device %d: name %q, want dev- and 16 hex digits", i, d.Name)
		}
		if id := *attr(t, d, AttributeID).StringValue; id != inv.Devices[i].ID {
			t.Errorf("device %d: id attribute %q", i, id)
		}
		if _, ok := d.Attributes[AttributeNUMANode]; ok {
			t.Errorf("device %d: a NUMA node although the inventory has none", i)
		}
	}
	if devs[0].Name == devs[1].Name {
		t.Errorf("both devices named %s", devs[0].Name)
	}
	if m := *attr(t, devs[0], AttributeModel).StringValue; len(m) > resourceapi.DeviceAttributeMaxValueLength || !utf8.ValidString(m) || m != strings.Repeat("x", 63) {
		t.Errorf("model cut to %q", m)
	}
	if _, ok := devs[0].Attributes[AttributeComputeCapability]; ok {
		t.Error("an unreadable compute capability was published")
	}
	if v := *attr(t, devs[1], AttributeComputeCapability).VersionValue; v != "9.0.0" {
		t.Errorf("compute capability %q, want 9.0.0", v)
	}
}

func TestSlices(t *testing.T) {
	devs := make([]resourceapi.Device, 2*MaxDevicesPerSlice+2)
	var sizes []int
	for _, s := range Slices(devs) {
		sizes = append(sizes, len(s))
	}
	if fmt.Sprint(sizes) != fmt.Sprint([]int{MaxDevicesPerSlice, MaxDevicesPerSlice, 2}) {
		t.Errorf("slices of %v devices", sizes)
	}
	if n := len(Slices(nil)); n != 1 {
		t.Errorf("%d slices of no devices, want one empty slice (the pool says it has none)", n)
	}
}

// TestLinkGroupsWhateverTheOrder: a DGX-1 listed in any order gives its two
// NVLink quads, and a GPU linked to one member of a larger group does not
// take that member away from it.
func TestLinkGroupsWhateverTheOrder(t *testing.T) {
	quads := func(inv types.Inventory) string {
		byGroup := map[string][]string{}
		for i, g := range linkGroups(inv) {
			byGroup[g] = append(byGroup[g], inv.Devices[i].ID)
		}
		var out []string
		for _, ids := range byGroup {
			slices.Sort(ids)
			out = append(out, strings.Join(ids, ","))
		}
		slices.Sort(out)
		return strings.Join(out, " ")
	}
	want := "gpu0,gpu1,gpu2,gpu3 gpu4,gpu5,gpu6,gpu7"
	for _, order := range [][]int{{0, 4, 1, 5, 2, 6, 3, 7}, {7, 6, 5, 4, 3, 2, 1, 0}, {4, 0, 5, 1, 6, 2, 7, 3}} {
		inv := dgx1()
		devs := make([]types.Device, 0, 8)
		for _, i := range order {
			devs = append(devs, inv.Devices[i])
		}
		inv.Devices = devs
		if got := quads(inv); got != want {
			t.Errorf("order %v: groups %s, want %s", order, got, want)
		}
	}
	// a-b linked; b, c, d all linked: {b, c, d}, and a alone.
	var inv types.Inventory
	for _, id := range []string{"a", "b", "c", "d"} {
		inv.Devices = append(inv.Devices, types.Device{ID: id, UUID: id, Health: types.Healthy, NUMANode: -1})
	}
	for _, p := range [][2]string{{"a", "b"}, {"b", "c"}, {"b", "d"}, {"c", "d"}} {
		inv.Links = append(inv.Links, types.Link{A: p[0], B: p[1], Kind: types.LinkNVLink, Count: 1})
	}
	if got := linkGroups(inv); strings.Join(got, " ") != " nvlink-0 nvlink-0 nvlink-0" {
		t.Errorf("groups %q, want a alone and b, c, d together", got)
	}
}

// TestConsumableCapacity: a whole GPU may be allocated more than once, each
// time taking memory (none by default) and 1 to 100 cores (100 by default),
// as kubegpu slices it; a MIG partition is taken whole, and it and its GPU
// (in MIG mode, never shared) consume the GPU's counters: the GPU all of
// them, the partition its share.
func TestConsumableCapacity(t *testing.T) {
	inv := types.Inventory{Devices: []types.Device{
		{ID: "gpu0", UUID: "GPU-a", Vendor: "nvidia.com", Model: "A100", MemoryMiB: 40960, ComputeUnits: 108, Health: types.Healthy, NUMANode: -1},
		{ID: "gpu1", UUID: "GPU-c", Vendor: "nvidia.com", Model: "A100", MemoryMiB: 40960, ComputeUnits: 108, Health: types.Healthy, NUMANode: -1},
		{ID: "gpu1-mig0", UUID: "MIG-b", Vendor: "nvidia.com", Model: "A100 1g.5gb", MemoryMiB: 4864, ComputeUnits: 14, Health: types.Healthy, NUMANode: -1, Parent: "gpu1"},
	}}
	devices, err := Devices(inv, Options{})
	if err != nil {
		t.Fatal(err)
	}
	gpu, migGPU, mig := devices[0], devices[1], devices[2]
	value := func(c map[string]resourceapi.Counter, name string) int64 { v := c[name].Value; return v.Value() }
	sets := CounterSets(inv)
	if len(sets) != 1 || sets[0].Name != "gpu1" || value(sets[0].Counters, CounterMultiprocessors) != 108 {
		t.Errorf("CounterSets = %+v, want one for gpu1", sets)
	}
	if migGPU.AllowMultipleAllocations != nil || len(migGPU.ConsumesCounters) != 1 || value(migGPU.ConsumesCounters[0].Counters, CounterMemory) != 40960<<20 {
		t.Errorf("GPU in MIG mode: allowMultipleAllocations %v, consumes %+v; want all of its counters, not shared", migGPU.AllowMultipleAllocations, migGPU.ConsumesCounters)
	}
	if len(mig.ConsumesCounters) != 1 || mig.ConsumesCounters[0].CounterSet != "gpu1" || value(mig.ConsumesCounters[0].Counters, CounterMultiprocessors) != 14 {
		t.Errorf("MIG partition consumes %+v, want 14 multiprocessors of gpu1", mig.ConsumesCounters)
	}
	mem := gpu.Capacity[CapacityMemory].RequestPolicy
	cores := gpu.Capacity[CapacityCores].RequestPolicy
	if gpu.AllowMultipleAllocations == nil || !*gpu.AllowMultipleAllocations || mem == nil || cores == nil ||
		!mem.Default.IsZero() || !mem.ValidRange.Min.IsZero() || cores.Default.Value() != 100 || cores.ValidRange.Max.Value() != 100 || cores.ValidRange.Min.Value() != 1 {
		t.Errorf("whole GPU: allowMultipleAllocations %v, memory policy %+v, cores policy %+v; want memory none by default, cores all", gpu.AllowMultipleAllocations, mem, cores)
	}
	inv.Devices[0].MemoryMiB = 0
	if none, err := Devices(inv, Options{}); err != nil || none[0].Capacity[CapacityMemory].RequestPolicy != nil {
		t.Errorf("a GPU reporting no memory: memory policy %+v, %v; want none (a step of 1Mi would exceed the capacity)", none[0].Capacity[CapacityMemory].RequestPolicy, err)
	}
	if mig.AllowMultipleAllocations != nil || mig.Capacity[CapacityMemory].RequestPolicy != nil {
		t.Errorf("MIG partition: allowMultipleAllocations %v, memory policy %+v; want it taken whole", mig.AllowMultipleAllocations, mig.Capacity[CapacityMemory].RequestPolicy)
	}
}
