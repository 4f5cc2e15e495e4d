package nvidia

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// TestHardwareResourceSlices: on real GPUs (KUBEGPU_NVML_HARDWARE=1), the
// devices the node publishes as ResourceSlices carry each GPU's UUID, PCI
// bus ID, PCIe root (read from sysfs, as the shim reads it) and NUMA node
// where the kernel knows one;
// and a device of another DRA driver describing the same GPU the way
// NVIDIA's DRA driver does (its "uuid", and "pcieBusID" with NVML's 8-digit
// domain) is recognised as that GPU, which is what keeps kubegpu and such
// a driver from handing it out twice.
func TestHardwareResourceSlices(t *testing.T) {
	if os.Getenv(envHardware) != "1" {
		t.Skipf("set %s=1 on a node with NVIDIA GPUs to check the module against its driver", envHardware)
	}
	np, err := NewModule().NodePlugin(t.Context(), types.PluginConfig{NodeName: "hardware", Options: map[string]string{}})
	if err != nil {
		t.Fatalf("NodePlugin: %v", err)
	}
	defer func() { _ = np.Close() }()
	inv, err := np.Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	devices, err := dra.Devices(inv, dra.Options{PCIeRoot: func(bus string) (string, error) {
		a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bus)
		if err != nil {
			return "", err
		}
		if a.Value.StringValue == nil {
			return "", fmt.Errorf("no PCIe root for %s", bus)
		}
		return *a.Value.StringValue, nil
	}})
	if err != nil {
		t.Errorf("dra.Devices: %v", err)
	}
	js, _ := json.MarshalIndent(devices, "", "  ")
	t.Logf("ResourceSlice devices:\n%s", js)
	keys := dra.InventoryKeys(inv)
	node := "hardware"
	for i, d := range inv.Devices {
		got := devices[i].Attributes
		want := []resourceapi.QualifiedName{dra.AttributeUUID, dra.AttributePCIBusID, dra.AttributePCIeRoot}
		if d.NUMANode >= 0 {
			want = append(want, dra.AttributeNUMANode) // absent where the kernel knows none (-1, as in many VMs)
		}
		for _, a := range want {
			if _, ok := got[a]; !ok && d.Parent == "" {
				t.Errorf("GPU %s: no attribute %s", d.ID, a)
			}
		}
		bus := d.PCIBusID
		if dom, rest, ok := strings.Cut(bus, ":"); ok && len(dom) == 4 {
			bus = "0000" + dom + ":" + rest // NVML's width
		}
		theirs := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: &node, Devices: []resourceapi.Device{{Name: "gpu-x",
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To(d.UUID)}, "pcieBusID": {StringValue: ptr.To(bus)}}}}}}
		if o := dra.Overlaps(theirs, keys); len(o) != 1 || o[0].Device != d.ID {
			t.Errorf("another driver's device for %s (uuid %s, pcieBusID %s) is recognised as %+v, want %s", d.ID, d.UUID, bus, o, d.ID)
		}
	}
}
