package dra

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/types"
)

func attrs(kv ...string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	m := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for i := 0; i < len(kv); i += 2 {
		m[resourceapi.QualifiedName(kv[i])] = resourceapi.DeviceAttribute{StringValue: ptr.To(kv[i+1])}
	}
	return m
}

// TestOverlaps: another driver's device is a kubegpu GPU by UUID (any
// domain, any case) or PCI bus ID (standard or driver attribute, either
// domain width); a MIG partition is matched by its UUID, never by the PCI
// bus ID it shares with its GPU; kubegpu's own slices and slices of no node
// overlap nothing.
func TestOverlaps(t *testing.T) {
	inv := types.Inventory{Devices: []types.Device{
		{ID: "gpu0", UUID: "GPU-aaa", PCIBusID: "0000:07:00.0"},
		{ID: "gpu1", UUID: "GPU-bbb", PCIBusID: "0000:0a:00.0"},
		{ID: "gpu1-mig0", UUID: "MIG-ccc", PCIBusID: "0000:0a:00.0", Parent: "gpu1"},
	}}
	keys := InventoryKeys(inv)
	node := "n1"
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: &node,
		Devices: []resourceapi.Device{
			{Name: "by-uuid", Attributes: attrs("gpu.nvidia.com/uuid", "gpu-AAA")},
			{Name: "by-pci", Attributes: attrs(string(AttributePCIBusID), "00000000:0A:00.0")},
			{Name: "mig", Attributes: attrs("uuid", "MIG-ccc", "pcieBusID", "0000:0a:00.0")},
			{Name: "other", Attributes: attrs("uuid", "GPU-zzz", "pciBusID", "0000:99:00.0")},
			{Name: "no-ids", Attributes: attrs("model", "GPU-aaa")},
		}}}
	got := map[string]string{}
	for _, o := range Overlaps(slice, keys) {
		got[o.SliceDevice] = o.Device
	}
	want := map[string]string{"by-uuid": "gpu0", "by-pci": "gpu1", "mig": "gpu1-mig0"}
	if len(got) != len(want) {
		t.Errorf("Overlaps = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("device %s matched %q, want %q", k, got[k], v)
		}
	}
	own := slice.DeepCopy()
	own.Spec.Driver = DriverName
	noNode := slice.DeepCopy()
	noNode.Spec.NodeName = nil
	for _, s := range []*resourceapi.ResourceSlice{own, noNode} {
		if o := Overlaps(s, keys); len(o) != 0 {
			t.Errorf("Overlaps(%s, node %v) = %v, want none", s.Spec.Driver, s.Spec.NodeName, o)
		}
	}
}

// TestMappings: only classes whose extendedResourceName is one of the
// resources given count, sorted by resource and class; DRA serves a
// resource where the node's allocatable has none of it.
func TestMappings(t *testing.T) {
	gpu := corev1.ResourceName("nvidia.com/gpu")
	classes := []*resourceapi.DeviceClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "z"}, Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To(string(gpu))}},
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To(string(gpu))}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To("example.com/fpga")}},
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
	}
	m := Mappings(classes, []corev1.ResourceName{gpu})
	if len(m) != 2 || m[0].Class != "a" || m[1].Class != "z" {
		t.Errorf("Mappings = %+v", m)
	}
	n := &corev1.Node{}
	if !ServedByDRA(n, gpu) {
		t.Error("a node without the resource: not served by DRA")
	}
	n.Status.Allocatable = corev1.ResourceList{gpu: resource.MustParse("0")}
	if !ServedByDRA(n, gpu) {
		t.Error("a node with none of the resource: not served by DRA")
	}
	n.Status.Allocatable[gpu] = resource.MustParse("8")
	if ServedByDRA(n, gpu) {
		t.Error("a node advertising the resource: served by DRA")
	}
}

// FuzzDeviceKeys: any attributes another driver publishes give bounded
// keys without panicking, and a device's keys match the inventory it was
// made from.
func FuzzDeviceKeys(f *testing.F) {
	f.Add("uuid", "GPU-aaa", "resource.kubernetes.io/pciBusID", "0000:07:00.0")
	f.Add("gpu.nvidia.com/pcieBusID", "00000000:07:00.0", "x/uuid", "")
	f.Add("/", ":", "uuid/", "::::")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		d := resourceapi.Device{Name: "d", Attributes: attrs(k1, v1, k2, v2)}
		keys := DeviceKeys(&d)
		if len(keys) > 2 {
			t.Fatalf("%d keys from 2 attributes", len(keys))
		}
		inv := types.Inventory{Devices: []types.Device{{ID: "gpu0", UUID: v1, PCIBusID: v2}}}
		_, _ = MatchKeys([][]string{keys}, InventoryKeys(inv))
	})
}
